#pragma once
// What apps/gpt/main.cpp does outside its main(), here so that tests can reach it:
//
//   TextSource         where the text comes from: the King James Bible (default), the English
//                      fortunes, a UTF-8 file
//   make_lm_data       codepoint tokenizer from the training part, ids, split 90% / 10% (contiguous)
//   train_windows      the windows of one training step (a function of seed and step: resumable)
//   forward_backward   one step's loss and gradients: THE step main's loop runs
//   eval_starts        the fixed validation windows (evenly spaced, no randomness)
//   lm_loss            mean next-token cross-entropy over those windows (eval mode, no tape), and
//                      lm_loss_by_position: the same per position of the window (length extrapolation)
//   sample_next        one token from logits: softmax(logits / temperature) over the top_k, inverse CDF
//   generate           autoregressive sampling, with the KV cache or without (same tokens), never an
//                      id the training text did not produce (unproduced_ids)
//   attention_maps     the last block's causal attention over a sample, one heatmap per head
//
// Generation and the context window. The model was trained on C = cfg.context positions (and with
// learned positions has no more), so it is given at most C tokens at once. generate() feeds the
// model a window ids[w, n) of the sequence so far (n tokens): w = 0 while n <= C; when the next
// forward would need n - w > C positions, the window restarts at w = n - C/2 (the last C/2 tokens).
// Both paths use the same w:
//   with the cache:    the caches hold ids[w, n-1); one forward of the newest token gives the next
//                      logits; at a restart the caches are cleared and re-filled ("prefilled")
//                      with ids[w, n) in one forward.
//   without the cache: a full forward over ids[w, n) every token, its last position's logits.
// Both see the same tokens at the same positions, so their logits agree to float rounding, and
// both draw one uniform number per token from Generator(seed), so they sample the same tokens.
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/options.h"
#include "apps/common/plot.h"
#include "apps/gpt/model.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "optim/optimizer.h"

namespace ag::apps {

// ---- the command line --------------------------------------------------------------------------

// What to sample after training (or with --eval-only).
struct SampleSettings {
  std::string prompt;  // empty: TextSource::default_prompt
  int64_t tokens = 500;
  double temperature = 0.8;
  int64_t top_k = 0;
  int64_t seed = -1;  // -1: --seed
  bool no_kv_cache = false;
  bool compare = false;
};

// The checks of the command line, before any text is read: a UsageError naming the option and
// value when --context is outside [1, 4096], a size (--d-model, --heads, --layers, --mlp,
// --eval-windows) is below 1, --heads does not divide --d-model, --kv-heads does not divide --heads,
// --pos rope meets an odd head size, --sample-tokens, --temperature or
// --top-k is negative, or --sample-seed is below -1. (Whether the text is longer than the context
// is known only once it is read: an ag::Error then.)
void validate_gpt_config(const GPTConfig& c, int64_t eval_windows, const SampleSettings& s);

// ---- data --------------------------------------------------------------------------------------

// Where a run's text comes from: --dataset, --text-file and --data-dir.
struct TextSource {
  std::string dataset = "bible";  // bible | fortunes; ignored when text_file is set
  std::string text_file{};        // a UTF-8 file to train on instead of the dataset
  std::string data_dir{};         // --data-dir: the Bible's cache, or the fortunes' root ("": the defaults)

  std::string cache_dir() const;     // data_dir, else default_cache_dir()
  std::string fortune_root() const;  // data_dir, else data::kFortuneRoot
  std::string name() const;          // the file, else the dataset
  std::string where() const;         // "a UTF-8 file", "cached in <dir>", "English entries under <dir>"
  std::string default_prompt() const;  // "And God said" for the Bible, "\n" otherwise
};

// The text of a corpus: dataset "bible" (data/text.h load_bible_kjv, cached as
// <cache_dir>/bible-kjv.txt), "fortunes" (fortunes_english_text under `fortune_root`), or, with
// `text_file` non-empty, that UTF-8 file (dataset ignored). Errors are ag::Error.
std::string load_gpt_text(const std::string& dataset, const std::string& text_file, const std::string& cache_dir,
                          const std::string& fortune_root);

// When the data of `dataset` is missing: the message naming the Debian package to install
// (the app prints it and exits with kExitNoData). nullopt when the data is there.
std::optional<std::string> missing_gpt_data(const std::string& dataset, const std::string& text_file,
                                            const std::string& cache_dir, const std::string& fortune_root);

struct LMData {
  data::CharTokenizer tokenizer;      // codepoint vocabulary of the training part
  std::vector<int64_t> train, valid;  // token ids: codepoints [0, k) and [k, n), k = floor(0.9 n)
};
// Splits the text's codepoints at k = floor(n * (1 - valid_fraction)) (first part train, the rest
// validation; contiguous, nothing shuffled), builds the tokenizer from the training part (a
// validation codepoint it lacks encodes to <unk>) and encodes both. Needs at least 2 codepoints in
// each part (ag::Error otherwise).
LMData make_lm_data(const std::string& text, double valid_fraction = 0.1);
// The text of `src` made into LMData; data::DatasetNotFound (missing_gpt_data's message) when the
// text is not there.
LMData load_lm_data(const TextSource& src);

// The ids in [0, vocab) that `ids` never holds. For the training ids of make_lm_data that is
// exactly <unk> (id 0): the tokenizer's other ids are the training text's own codepoints.
std::vector<int64_t> unproduced_ids(std::span<const int64_t> ids, int64_t vocab);

// The training windows of step `step` (0-based): the global batch of `global_batch` windows of T
// (+1 target) at random starts, data::random_windows(train, global_batch, T, seed, step), of which
// this rank takes its slice data::shard(global_batch, rank, ranks). Every rank draws the whole
// global batch, so N ranks with --batch B see the windows of one process with --batch N*B.
data::Windows train_windows(std::span<const int64_t> train, int64_t global_batch, int64_t T, uint64_t seed,
                            int64_t step, int rank = 0, int ranks = 1);

// ---- the run's config --------------------------------------------------------------------------

// The model config as the checkpoint's JSON {"vocab", "context", "d_model", "n_heads", "n_layers",
// "mlp_hidden", "dropout"} plus "pos", "kv_heads", "mlp_kind" and "norm" where they differ from
// their defaults, and back (a missing or non-integer size, or an unknown choice: ag::Error naming
// the field; a missing choice is its default).
nlohmann::json gpt_config_to_json(const GPTConfig& c);
GPTConfig gpt_config_from_json(const nlohmann::json& j);

// The config a run saves in every checkpoint (and --resume compares):
//   {"model": gpt_config_to_json, "data": {"dataset", "text_file", "valid_fraction": 0.1},
//    "train": {"batch": the global batch, "seed", "grad_checkpointing": true (only when on)}}
nlohmann::json gpt_run_config(const GPTConfig& c, const TextSource& src, int64_t global_batch, uint64_t seed,
                              bool grad_checkpointing);
// What --eval-only reads back from a checkpoint's config and its "tokenizer" entry: the model, the
// text it was trained on (data_dir is left empty) and its tokenizer. An ag::Error names the file
// when an entry is missing.
struct GptCheckpoint {
  GPTConfig model;
  TextSource text;
  data::CharTokenizer tokenizer;
};
GptCheckpoint read_gpt_checkpoint(const nlohmann::json& config, const std::map<std::string, std::string>& extra,
                                  const std::string& path);
// The options whose values --eval-only takes from the checkpoint, and their keys in
// gpt_checked_config: a model config and its text with every model key, also the choices that
// gpt_config_to_json leaves out at their defaults (check_eval_only_options compares the two).
const std::vector<SavedOption>& gpt_saved_options();
nlohmann::json gpt_checked_config(const GPTConfig& model, const TextSource& text);

// --patience -1 (the default) from the text's size: a text the schedule reads more than 20 times
// over is memorised before the end, so the run stops after 5 evaluations without a better
// validation loss; else never early. Returns resolve_patience's line ("" when --patience was given).
std::string fit_patience_to_text(RunOptions& o, int64_t train_chars, int64_t T);

// ---- training ----------------------------------------------------------------------------------

// The gradients of one training step on windows `w`, no update: logits = model(w.x) (B, T, V);
// loss = mean over the B T positions of cross_entropy(logits, w.y); compute_gradients (zero, then
// backward of loss x loss_scale: Run::loss_scale). Returns the loss. main.cpp's training loop runs
// it, and so do the tests (tests/apps/test_gpt.cpp).
double forward_backward(GPT& model, optim::Optimizer& opt, const data::Windows& w, double loss_scale = 1.0);

// ---- evaluation --------------------------------------------------------------------------------

// n window starts spread evenly over a text of `len` tokens for windows of T (+1 target):
// start_i = i * (len - T - 1) / (n - 1) (integer division; start_0 = 0, start_{n-1} = len - T - 1).
// Needs len >= T + 1 and n >= 1 (ag::Error naming the values otherwise).
std::vector<int64_t> eval_starts(int64_t len, int64_t T, int64_t n);

// Mean next-token cross-entropy (nats per token) of `model` over the windows x = ids[s, s + T),
// y = ids[s + 1, s + T + 1) for s in `starts`, `batch` windows per forward. Runs in eval mode
// under NoGradGuard and restores the model's train/eval mode afterwards. `sharded`: in a
// data-parallel job each rank evaluates its eval_part of the windows and every rank returns the
// whole mean (every rank must call it; apps/common/run.h).
double lm_loss(GPT& model, std::span<const int64_t> ids, const std::vector<int64_t>& starts, int64_t T,
               int64_t batch, bool sharded = false);
// The same windows' loss position by position: element t is the mean over the windows of the
// loss of predicting token t + 1 from tokens 0..t of the window (so lm_loss is the mean of these).
// T may pass the context the model was trained on, except with learned positions (an ag::Error).
std::vector<double> lm_loss_by_position(GPT& model, std::span<const int64_t> ids, const std::vector<int64_t>& starts,
                                        int64_t T, int64_t batch, bool sharded = false);

// ---- length extrapolation ----------------------------------------------------------------------

// The validation loss position by position at each of `lengths` (eval_starts windows of that
// length, `windows` of them), appended to `jsonl` as one line per length:
//   {"run": name, "pos": cfg.pos, "trained_context": C, "length": L, "windows": n, "loss": mean,
//    "loss_by_position": [L values]}
// or, for a model with learned positions and L > C, {"run", "pos", "trained_context", "length",
// "error": "..."} (printed too: such a model has no position past C). Then `jsonl` with .svg in
// place of its extension is redrawn from every line of the file: one chart per length, one series
// per run (one colour per run in every chart), the loss averaged over blocks of `block` positions,
// so runs evaluated by separate calls land in one plot. Returns the lines written.
std::vector<nlohmann::json> evaluate_lengths(GPT& model, const std::string& name, std::span<const int64_t> ids,
                                             const std::vector<int64_t>& lengths, int64_t windows, int64_t batch,
                                             const std::string& jsonl, int64_t block = 8);
// The SVG of such a file's lines (the drawing part of evaluate_lengths).
std::string length_eval_svg(const std::vector<nlohmann::json>& lines, int64_t block = 8);

// ---- sampling ----------------------------------------------------------------------------------

// One token from `logits` (V values) and a uniform u in [0, 1):
//   keep the top_k largest logits (top_k <= 0 or >= V: all; ties broken by the lower id),
//   p_i = exp((l_i - l_max) / temperature) / Z over the kept ids,
//   return the first kept id (in order of decreasing logit) whose cumulative p exceeds u.
// temperature <= 0 (or top_k == 1) is greedy: the argmax, lowest id on ties. An id whose logit is
// -inf has p = 0 and is never returned, not even by top-k or rounding (generate's masked ids); at
// least one logit must be above -inf (ag::Error otherwise).
int64_t sample_next(std::span<const float> logits, double temperature, int64_t top_k, double u);

// How generate draws its tokens.
struct GenerateOptions {
  double temperature = 1.0;  // softmax(logits / temperature); 0: greedy
  int64_t top_k = 0;         // sample among the k most likely ids (0: all)
  uint64_t seed = 0;         // token i draws the i-th uniform of Generator(seed) (core/random.h rand, f64)
  bool kv_cache = true;      // false: a full forward over the window per token (the same tokens)
  // Ids never sampled: their logits are set to -inf before top-k and temperature, so the draw is
  // from the model's distribution renormalised over the other ids. The app passes unproduced_ids
  // of the training text: <unk>. The head still has a row for <unk>, and no training target is
  // <unk>, so the loss only pushes its logit down, by a gradient p_unk h that fades as p_unk falls,
  // against weight decay: a softmax never reaches 0, and over enough draws one lands on <unk>,
  // printed as U+FFFD.
  std::vector<int64_t> never{};
};

// `n_new` tokens sampled after `prompt` (non-empty, ids < vocab) under NoGradGuard in eval mode
// (restored afterwards); returns prompt + the new tokens. See the top of this file for the
// context window and why kv_cache does not change the tokens. An id of g.never outside the
// vocabulary, or g.never holding every id, is an ag::Error.
std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t n_new,
                              const GenerateOptions& g);

// After training (or with --eval-only): s.tokens characters sampled after s.prompt (the
// tokenizer's encoding) with seed `seed`, never an id of unproduced_ids(d.train); prints the text
// and the speed (with s.compare the other way too, and whether the tokens agree), writes
// <dir>/sample.txt and <dir>/attention.svg (attention_maps over the last 40 tokens). Returns the
// generation speed in tokens/s.
double sample_and_plot(GPT& model, const LMData& d, const SampleSettings& s, uint64_t seed, const std::string& dir);

// --diagnose-attention: every block's causal attention on the first min(batch, |starts|) windows
// of T tokens of `ids` at `starts`, written to <dir>/attention_diagnostics.json and printed.
void diagnose(GPT& model, std::span<const int64_t> ids, const std::vector<int64_t>& starts, int64_t T, int64_t batch,
              const std::string& dir);

// ---- attention plot ----------------------------------------------------------------------------

// A readable label for one token: the character, with '\n' shown as "\\n", ' ' as "␣", '\t' as "\\t".
std::string token_label(const data::CharTokenizer& tok, int64_t id);

// The causal attention of the last block over the last min(|ids|, max_tokens, context) tokens of
// `ids`: one (T, T) heatmap per head, titled "head h", rows (queries) and columns (keys) labelled
// with the tokens. One uncached forward with need_weights, under NoGradGuard in eval mode.
std::vector<Heatmap> attention_maps(GPT& model, const std::vector<int64_t>& ids, const data::CharTokenizer& tok,
                                    int64_t max_tokens = 48);

}  // namespace ag::apps
