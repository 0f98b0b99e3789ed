// gpt: a character-level GPT learns to write like its text (by default the King James Bible of
// Debian's bible-kjv), then samples new text with the KV cache and plots its causal attention.
//
//   text -> codepoint ids (vocabulary V of the training part); first 90% train, last 10% validation
//   x  i64 (B, T)      T = context windows at random starts (a pure function of seed and step)
//   h  = wte[x] + wpe[0..T)                      (B, T, d)    token + learned position embeddings
//                                                (--pos sinusoidal | rope | alibi, --kv-heads, --mlp-kind
//                                                swiglu, --norm rmsnorm: apps/gpt/model.h)
//   h  = h + attn(ln1(h))                        causal: position t attends to keys 0..t only
//        a = softmax(q k^T / sqrt(hs) + mask) v  per head, hs = d / n_heads
//   h  = h + fc2(gelu(fc1(ln2(h))))              fc1: d -> mlp, fc2: mlp -> d     (x n_layers)
//   logits = head(ln_f(h))                       (B, T, V)
//   loss = mean over (b, t) of -log softmax(logits[b, t])[x[b, t + 1]]   next-character cross-entropy
// --grad-checkpointing keeps only each block's input for backward and recomputes the rest there:
// the same gradients, less memory, one more forward of the blocks (docs/math/checkpointing.md).
// AdamW with warmup + cosine, gradient norm clipped. Validation loss is the mean over fixed,
// evenly spaced windows of the validation text; the model of the best one is sampled and reported.
// Sampling: softmax(logits / temperature) over the top-k characters, one seeded Philox draw per
// character, never <unk>, which the training text does not produce (apps/gpt/lib.h: GenerateOptions
// says why, and the top of the file how the context window moves).
//
// Default run: build/gpt (500 steps; its loss: docs/benchmarks.md, "The apps' default runs").
// Longer: build/gpt --steps 2000 (validation loss compared with bench/train_gpt_twin.py).
// Files: runs/gpt/{checkpoint.safetensors, best.safetensors, metrics.jsonl, events.out.tfevents.*,
// curves.svg, attention.svg, sample.txt, report.json (with forward FLOPs and MFU)}; with
// --diagnose-attention also attention_diagnostics.json: per block and head on one batch of
// validation windows, entropy, diagonal mass and head similarity with warnings
// (apps/common/diagnose.h). --resume continues a run (--stop-at K stops after step K as Ctrl-C
// would); --eval-only [--checkpoint FILE] evaluates and samples a saved model.
//
// Data parallel: `mpirun -np N gpt ...` trains on N processes, --batch windows each: every rank
// draws the global batch of N x --batch windows (those of `gpt --batch N*B`) and takes its slice;
// rank 0 writes the run directory and samples (docs/distributed.md).
#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/ranges.h>

#include "apps/common/app.h"
#include "apps/common/clock.h"
#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/gpt/lib.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;

namespace {

struct AppOptions {
  TextSource text;             // --dataset, --text-file (its data_dir is --data-dir)
  int64_t eval_windows = 256;  // validation windows of T characters per evaluation
  bool grad_checkpointing = false;
  std::vector<int64_t> eval_lengths;  // --eval-only: the validation loss by position at these lengths
  std::string lengths_file;           // where those lines go (default: length_eval.jsonl beside the checkpoint)
  SampleSettings sample;
};

// --eval-only: the model and its text as the checkpoint saved them: validation loss and a sample.
// given: the model config of the command line, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, AppOptions a, const DiagnoseOptions& dg, const GPTConfig& given) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint, "gpt");
  GptCheckpoint ck = read_gpt_checkpoint(info.config, info.extra, o.checkpoint);
  check_eval_only_options(o, gpt_checked_config(ck.model, ck.text), gpt_checked_config(given, a.text),
                          gpt_saved_options(), "gpt");
  ck.text.data_dir = o.data_dir;
  const LMData d = load_lm_data(ck.text);
  check(d.tokenizer.to_json() == ck.tokenizer.to_json(),
        "the text's vocabulary differs from the checkpoint's: the data changed since training");
  GPT model(ck.model);
  model.to(training_device(o));  // --device: the checkpoint's tensors are copied there
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  const int64_t T = model.cfg.context;
  const std::vector<int64_t> starts = eval_starts(int64_t(d.valid.size()), T, a.eval_windows);
  const double t0 = now_seconds();
  const double val = lm_loss(model, d.valid, starts, T, o.batch);
  fmt::print("gpt: {} at step {}: validation loss {:.4f} ({:.3f} bits per character) over {} windows of {} "
             "({:.1f} s)\n",
             o.checkpoint, info.step, val, val / std::log(2.0), a.eval_windows, T, seconds_since(t0));
  if (a.sample.prompt.empty()) a.sample.prompt = ck.text.default_prompt();
  std::string dir = std::filesystem::path(o.checkpoint).parent_path().string();
  if (dir.empty()) dir = ".";
  sample_and_plot(model, d, a.sample, a.sample.seed >= 0 ? uint64_t(a.sample.seed) : o.seed, dir);
  if (dg.attention) diagnose(model, d.valid, starts, T, o.batch, dir);
  if (!a.eval_lengths.empty()) {
    const std::string run_name = std::filesystem::path(dir).filename().string();
    evaluate_lengths(model, run_name.empty() ? o.checkpoint : run_name, d.valid, a.eval_lengths, a.eval_windows,
                     o.batch, a.lengths_file.empty() ? dir + "/length_eval.jsonl" : a.lengths_file);
  }
  return 0;
}

int train(RunOptions o, GPTConfig cfg, AppOptions a, const DiagnoseOptions& dg) {
  // ---- data: the text, its tokenizer, the fixed validation windows -----------------------------
  a.text.data_dir = o.data_dir;
  const LMData d = load_lm_data(a.text);
  cfg.vocab = d.tokenizer.vocab_size();
  cfg.dropout = o.dropout;
  const int64_t T = cfg.context;
  check(int64_t(d.train.size()) > T && int64_t(d.valid.size()) > T,
        "{} has {} training and {} validation characters; both need more than the context {}", a.text.name(),
        d.train.size(), d.valid.size(), T);
  const std::vector<int64_t> val_starts = eval_starts(int64_t(d.valid.size()), T, a.eval_windows);
  if (a.sample.prompt.empty()) a.sample.prompt = a.text.default_prompt();
  fmt::print(stderr, "gpt: {} ({}): {} training and {} validation characters, vocabulary {}\n", a.text.name(),
             a.text.where(), d.train.size(), d.valid.size(), cfg.vocab);

  // ---- model, optimizer, schedule, and the run directory ---------------------------------------
  Generator gen(o.seed);
  GPT model(cfg, &gen);  // initialised on the CPU (the same numbers on every device)
  model.grad_checkpointing = a.grad_checkpointing;
  model.to(training_device(o));  // --device; the optimizer's state is made beside each parameter
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  const std::string patience = fit_patience_to_text(o, int64_t(d.train.size()), T);
  Run run("gpt", o, model, opt, gen, gpt_run_config(cfg, a.text, global_batch(o), o.seed, a.grad_checkpointing),
          {{"tokenizer", d.tokenizer.to_json()}});
  run.select_by("val_loss", false);
  if (!patience.empty()) run.print("gpt: " + patience);
  if (a.grad_checkpointing) run.print("gpt: --grad-checkpointing: each block's activations are recomputed in backward");
  std::string compute_text;
  const Tensor probe = zeros({o.batch, T}, DType::i64);
  const ComputeProfile compute =
      profile_model(model, [&] { return model.forward(probe); }, o.batch, T, dg, &compute_text);
  run.print(compute_text);

  // ---- the training loop: the validation windows pick the best model ---------------------------
  double val = NAN;
  int64_t val_step = -1;  // the step `val` was measured at
  run.evaluate_with([&](int64_t s) {
    val = lm_loss(model, d.valid, val_starts, T, o.batch, /*sharded=*/true), val_step = s;
    run.log_eval(s, {{"val_loss", val}});
  });
  int64_t step = run.resume();
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    // the global batch of N x --batch windows, drawn as one process would; this rank's slice
    const data::Windows w = train_windows(d.train, global_batch(o), T, o.seed, step, dist::rank(), dist::world_size());
    const double loss = forward_backward(model, opt, w, run.loss_scale());
    run.update(step + 1, loss, w.x.size(0), w.x.numel());  // over the ranks: clip, step, log, save, evaluate
  }
  run.save(step);  // also after Ctrl-C: nothing trained is lost

  // ---- the best model by validation loss: sample, plot, report ---------------------------------
  if (const int64_t best = run.load_best(); best >= 0) {
    val = run.best().value, val_step = best;
  } else if (val_step != step && (std::isnan(val) || !run.stop_requested())) {
    // no evaluation yet: the final model's loss (after Ctrl-C the last evaluation's, unless none)
    val = lm_loss(model, d.valid, val_starts, T, o.batch, /*sharded=*/true), val_step = step;
  }
  RunReport report;
  report.extra = {{"val_loss", val}, {"val_bits_per_char", val / std::log(2.0)}, {"val_loss_step", double(val_step)}};
  if ((!run.stop_requested() || run.early_stopped()) && a.sample.tokens > 0 && dist::is_main()) {  // rank 0 samples
    const uint64_t seed = a.sample.seed >= 0 ? uint64_t(a.sample.seed) : o.seed;
    report.extra.emplace_back("generation_tokens_per_s", sample_and_plot(model, d, a.sample, seed, run.dir()));
  }
  compute.fill(report);
  run.finish(report);
  if (dg.attention && dist::is_main()) diagnose(model, d.valid, val_starts, T, o.batch, run.dir());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  App app("gpt", "a character-level GPT trained on real text (default: the King James Bible), then sampled");
  // The default recipe: 500 steps (docs/benchmarks.md, "The apps' default runs").
  app.o = {.steps = 500, .batch = 32, .lr = 2e-3, .min_lr = 1e-4, .warmup = 0.05, .weight_decay = 0.1, .clip = 1.0};
  app.add_run_options();
  GPTConfig cfg;
  AppOptions a;
  DiagnoseOptions dg;
  add_diagnose_options(app.cli, dg);
  CLI::App& cli = app.cli;
  cli.add_option("--dataset", a.text.dataset, "bible (Debian bible-kjv) or fortunes (Debian fortunes, English)")
      ->check(CLI::IsMember({"bible", "fortunes"}));
  cli.add_option("--text-file", a.text.text_file, "train on this UTF-8 file instead of --dataset");
  cli.add_option("--context", cfg.context, "context length T (positions)")->check(CLI::Range(1, 4096));
  cli.add_option("--d-model", cfg.d_model, "model width d")->check(positive());
  cli.add_option("--heads", cfg.n_heads, "attention heads (divide d)")->check(positive());
  cli.add_option("--layers", cfg.n_layers, "transformer blocks")->check(positive());
  cli.add_option("--mlp", cfg.mlp_hidden, "MLP hidden width")->check(positive());
  cli.add_option("--pos", cfg.pos,
                 "positions: learned (a table of --context rows, GPT-2), sinusoidal (fixed, added to the embeddings "
                 "times sqrt(d)), rope (rotary, inside attention) or alibi (distance biases inside attention); all "
                 "but learned run past --context")
      ->check(CLI::IsMember(gpt_choices("pos")));
  cli.add_option("--kv-heads", cfg.kv_heads,
                 "key/value heads, dividing --heads (grouped-query attention; 1: multi-query; 0: --heads)")
      ->check(non_negative());
  cli.add_option("--mlp-kind", cfg.mlp_kind, "feed-forward: gelu (GPT-2's MLP) or swiglu (LLaMA's, no biases)")
      ->check(CLI::IsMember(gpt_choices("mlp_kind")));
  cli.add_option("--norm", cfg.norm, "norms: layernorm or rmsnorm")->check(CLI::IsMember(gpt_choices("norm")));
  cli.add_flag("--grad-checkpointing", a.grad_checkpointing,
               "recompute each block's activations in backward instead of keeping them: less memory, about a third "
               "more compute per step, the same gradients (docs/math/checkpointing.md)");
  cli.add_option("--eval-lengths", a.eval_lengths,
                 "with --eval-only: also the validation loss by position for windows of these lengths, e.g. "
                 "128,256,512 (length extrapolation; learned positions stop at --context)")
      ->delimiter(',')
      ->check(positive());
  cli.add_option("--lengths-file", a.lengths_file,
                 "--eval-lengths: the JSONL file its lines are appended to, plotted beside it as .svg (default: "
                 "length_eval.jsonl beside the checkpoint)");
  cli.add_option("--eval-windows", a.eval_windows, "validation windows of T characters per evaluation")
      ->check(positive());
  SampleSettings& s = a.sample;
  cli.add_option("--prompt", s.prompt,
                 "text to continue (default: \"And God said\" for the Bible, a newline otherwise)");
  cli.add_option("--sample-tokens", s.tokens, "characters to generate after training")->check(non_negative());
  cli.add_option("--temperature", s.temperature, "sampling temperature (0: greedy)")->check(non_negative());
  cli.add_option("--top-k", s.top_k, "sample among the k most likely characters (0: all)")->check(non_negative());
  cli.add_option("--sample-seed", s.seed, "seed of the sampling draws (-1: --seed)")
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  cli.add_flag("--no-kv-cache", s.no_kv_cache, "generate with a full forward over the context per token");
  cli.add_flag("--compare-kv-cache", s.compare, "also generate the other way: speed, and whether the tokens agree");
  const auto check_options = [&] {
    validate_gpt_config(cfg, a.eval_windows, s);
    usage_check(a.eval_lengths.empty() || app.o.eval_only,
                "gpt: --eval-lengths {}: works with --eval-only --checkpoint FILE", fmt::join(a.eval_lengths, ","));
    usage_check(a.lengths_file.empty() || !a.eval_lengths.empty(), "gpt: --lengths-file {}: needs --eval-lengths",
                a.lengths_file);
    usage_check(!a.grad_checkpointing || !app.o.eval_only,
                "gpt: --grad-checkpointing: recomputes activations in backward; --eval-only trains nothing");
  };
  return app.main(argc, argv, check_options,
                  [&] { return app.o.eval_only ? evaluate_checkpoint(app.o, a, dg, cfg) : train(app.o, cfg, a, dg); });
}
