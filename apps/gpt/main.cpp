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
// evenly spaced windows of the validation text. Sampling: softmax(logits / temperature) over the
// top-k characters, one seeded Philox draw per character (see apps/gpt/lib.h for the
// context window: after `context` tokens it restarts from the last context/2, cached or not).
//
// Default run: build/gpt (500 steps; its loss: docs/benchmarks.md, "The apps' default runs").
// Longer: build/gpt --steps 2000 (validation loss compared with bench/train_gpt_twin.py).
// Files: runs/gpt/{checkpoint.safetensors, tokenizer.json, metrics.jsonl, events.out.tfevents.*,
//        curves.svg, attention.svg, sample.txt, report.json (with forward FLOPs and MFU)}; with
// --diagnose-attention also attention_diagnostics.json: per block and head on one batch of
// validation windows, entropy, diagonal mass and head similarity with warnings
// (apps/common/diagnose.h).
//
// Data parallel: `mpirun -np N gpt ...` trains on N processes, --batch windows each: every rank
// draws the global batch of N x --batch windows (those of `gpt --batch N*B`) and takes its slice;
// rank 0 writes the run directory and samples (docs/distributed.md).
#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <algorithm>

#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/gpt/lib.h"
#include "attograd.h"
#include "data/loader.h"
#include "data/text.h"
#include "training/checkpoint.h"
#include "optim/adam.h"

using namespace ag;
using namespace ag::apps;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Samples after the prompt, prints the text and the speed, writes sample.txt and attention.svg
// into `dir`. Returns the generation speed in tokens/s.
double sample_and_plot(GPT& model, const data::CharTokenizer& tok, const SampleSettings& s, uint64_t seed,
                       const std::string& dir) {
  const std::vector<int64_t> prompt = tok.encode(s.prompt);
  const bool cached = !s.no_kv_cache;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> ids = generate(model, prompt, s.tokens, s.temperature, s.top_k, seed, cached);
  const double secs = seconds_since(t0), rate = double(s.tokens) / std::max(secs, 1e-9);
  const std::string text = tok.decode(ids);
  fmt::print("---- sample (temperature {}, top-k {}, seed {}) ----\n{}\n---- end of sample ----\n", s.temperature,
             s.top_k, seed, text);
  fmt::print("generation: {} tokens in {:.2f} s = {:.0f} tokens/s ({})\n", s.tokens, secs, rate,
             cached ? "KV cache" : "no KV cache: a full forward per token");
  if (s.compare) {
    auto t1 = std::chrono::steady_clock::now();
    std::vector<int64_t> other = generate(model, prompt, s.tokens, s.temperature, s.top_k, seed, !cached);
    const double secs2 = seconds_since(t1);
    fmt::print("generation {}: {:.0f} tokens/s; the tokens are {}\n",
               cached ? "without the KV cache" : "with the KV cache",
               double(s.tokens) / std::max(secs2, 1e-9), other == ids ? "identical" : "DIFFERENT");
  }
  write_file_atomic(dir + "/sample.txt", text + "\n");
  HeatmapOptions ho;
  ho.title = "causal attention of the last block over the end of the sample (rows: queries, columns: keys)";
  ho.columns = 2;
  ho.cell = 14;
  write_file_atomic(dir + "/attention.svg", svg_heatmaps(attention_maps(model, ids, tok, 40), ho));
  fmt::print("plots: {}/attention.svg, sample: {}/sample.txt\n", dir, dir);
  return rate;
}

// --diagnose-attention: every block's causal attention on the first min(batch, |starts|)
// validation windows of T characters.
void diagnose(GPT& model, const std::vector<int64_t>& valid, const std::vector<int64_t>& starts, int64_t T,
              int64_t batch, const std::string& dir) {
  const int64_t n = std::clamp<int64_t>(batch, 1, int64_t(starts.size()));
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i)
    ids.insert(ids.end(), valid.begin() + starts[size_t(i)], valid.begin() + starts[size_t(i)] + T);
  const Tensor x = from_vector(ids, {n, T});
  std::string path;
  const nn::AttentionReport r = write_attention_diagnostics(model, [&] { model.forward(x); }, dir, &path);
  fmt::print("attention diagnostics on {} validation windows of {} characters:\n{}written to {}\n", n, T,
             r.to_text(), path);
}

// The options whose values --eval-only takes from the checkpoint, and their keys in the config of
// checked_config.
const std::vector<SavedOption>& saved_options() {
  static const std::vector<SavedOption> options = {
      {"--dataset", "/data/dataset"}, {"--text-file", "/data/text_file"}, {"--context", "/model/context"},
      {"--d-model", "/model/d_model"}, {"--heads", "/model/n_heads"},     {"--layers", "/model/n_layers"},
      {"--mlp", "/model/mlp_hidden"},  {"--pos", "/model/pos"},           {"--kv-heads", "/model/kv_heads"},
      {"--mlp-kind", "/model/mlp_kind"}, {"--norm", "/model/norm"}};
  return options;
}

// A model config and its data as check_eval_only_options compares them: every model key, also the
// choices that gpt_config_to_json leaves out at their defaults.
nlohmann::json checked_config(const GPTConfig& model, const std::string& dataset, const std::string& text_file) {
  return {{"model", nlohmann::json(model)}, {"data", {{"dataset", dataset}, {"text_file", text_file}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"gpt: a character-level GPT trained on real text (default: the King James Bible), then sampled"};
  RunOptions o;
  o.steps = 500, o.batch = 32, o.lr = 2e-3, o.min_lr = 1e-4, o.warmup = 0.05, o.weight_decay = 0.1, o.clip = 1.0;
  GPTConfig cfg;
  std::string dataset = "bible", text_file;
  int64_t eval_windows = 256;
  SampleSettings s;
  DiagnoseOptions dg;
  add_run_options(cli, o);
  add_diagnose_options(cli, dg);
  cli.add_option("--dataset", dataset, "bible (Debian bible-kjv) or fortunes (Debian fortunes, English)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bible", "fortunes"}));
  cli.add_option("--text-file", text_file, "train on this UTF-8 file instead of --dataset");
  cli.add_option("--context", cfg.context, "context length T (positions)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cli.add_option("--d-model", cfg.d_model, "model width d")->capture_default_str()->check(positive());
  cli.add_option("--heads", cfg.n_heads, "attention heads (divide d)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--layers", cfg.n_layers, "transformer blocks")->capture_default_str()->check(positive());
  cli.add_option("--mlp", cfg.mlp_hidden, "MLP hidden width")->capture_default_str()->check(positive());
  cli.add_option("--pos", cfg.pos,
                 "positions: learned (a table of --context rows, GPT-2), sinusoidal (fixed, added to the embeddings "
                 "times sqrt(d)), rope (rotary, inside attention) or alibi (distance biases inside attention); all "
                 "but learned run past --context")
      ->capture_default_str()
      ->check(CLI::IsMember(gpt_choices("pos")));
  cli.add_option("--kv-heads", cfg.kv_heads,
                 "key/value heads, dividing --heads (grouped-query attention; 1: multi-query; 0: --heads)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--mlp-kind", cfg.mlp_kind, "feed-forward: gelu (GPT-2's MLP) or swiglu (LLaMA's, no biases)")
      ->capture_default_str()
      ->check(CLI::IsMember(gpt_choices("mlp_kind")));
  cli.add_option("--norm", cfg.norm, "norms: layernorm or rmsnorm")
      ->capture_default_str()
      ->check(CLI::IsMember(gpt_choices("norm")));
  bool grad_checkpointing = false;
  cli.add_flag("--grad-checkpointing", grad_checkpointing,
               "recompute each block's activations in backward instead of keeping them: less memory, about a third "
               "more compute per step, the same gradients (docs/math/checkpointing.md)");
  std::vector<int64_t> eval_lengths;
  std::string lengths_file;
  cli.add_option("--eval-lengths", eval_lengths,
                 "with --eval-only: also the validation loss by position for windows of these lengths, e.g. "
                 "128,256,512 (length extrapolation; learned positions stop at --context)")
      ->delimiter(',')
      ->check(positive());
  cli.add_option("--lengths-file", lengths_file,
                 "--eval-lengths: the JSONL file its lines are appended to, plotted beside it as .svg (default: "
                 "length_eval.jsonl beside the checkpoint)");
  cli.add_option("--eval-windows", eval_windows, "validation windows of T characters per evaluation")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--prompt", s.prompt,
                 "text to continue (default: \"And God said\" for the Bible, a newline otherwise)");
  cli.add_option("--sample-tokens", s.tokens, "characters to generate after training")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--temperature", s.temperature, "sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--top-k", s.top_k, "sample among the k most likely characters (0: all)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--sample-seed", s.seed, "seed of the sampling draws (-1: --seed)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  cli.add_flag("--no-kv-cache", s.no_kv_cache, "generate with a full forward over the context per token");
  cli.add_flag("--compare-kv-cache", s.compare, "also generate the other way: speed, and whether the tokens agree");
  if (const int rc = apps::parse_command_line(cli, argc, argv, "gpt"); rc >= 0) return rc;
  o.command_line.assign(argv, argv + argc);
  o.given = given_options(cli);

  try {  // every option is checked before any data is read
    apply_run_options(o, "gpt");
    validate_gpt_config(cfg, eval_windows, s);
    usage_check(eval_lengths.empty() || o.eval_only, "gpt: --eval-lengths {}: works with --eval-only --checkpoint FILE",
                fmt::join(eval_lengths, ","));
    usage_check(lengths_file.empty() || !eval_lengths.empty(), "gpt: --lengths-file {}: needs --eval-lengths",
                lengths_file);
    usage_check(!grad_checkpointing || !o.eval_only,
                "gpt: --grad-checkpointing: recomputes activations in backward; --eval-only trains nothing");
  } catch (const UsageError& e) {
    apps::print_usage_error("gpt", e.what());
    return kExitUsage;
  }
  try {
    const std::string cache_dir = o.data_dir.empty() ? default_cache_dir() : o.data_dir;
    const std::string fortune_root = o.data_dir.empty() ? data::kFortuneRoot : o.data_dir;
    const uint64_t sample_seed = s.seed >= 0 ? uint64_t(s.seed) : o.seed;

    if (o.eval_only) {  // ---- evaluate a saved model: validation loss and a sample ----
      if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
      const CheckpointInfo info = read_checkpoint_info(o.checkpoint);
      check(info.config.contains("model") && info.config.contains("data") && info.extra.count("tokenizer") == 1,
            "'{}' is not a gpt checkpoint (no model, data or tokenizer entry; config {})", o.checkpoint,
            info.config.dump());
      const nlohmann::json& dc = info.config.at("data");
      check_eval_only_options(o,
                              checked_config(gpt_config_from_json(info.config.at("model")),
                                             dc.at("dataset").get<std::string>(), dc.at("text_file").get<std::string>()),
                              checked_config(cfg, dataset, text_file), saved_options(), "gpt");
      dataset = dc.at("dataset").get<std::string>(), text_file = dc.at("text_file").get<std::string>();
      if (auto missing = missing_gpt_data(dataset, text_file, cache_dir, fortune_root)) {
        fmt::print(stderr, "gpt: {}\n", *missing);
        return kExitNoData;
      }
      const data::CharTokenizer tok = data::CharTokenizer::from_json(info.extra.at("tokenizer"), o.checkpoint);
      LMData d = make_lm_data(load_gpt_text(dataset, text_file, cache_dir, fortune_root));
      check(d.tokenizer.to_json() == tok.to_json(),
            "the text's vocabulary differs from the checkpoint's: the data changed since training");
      GPT model(gpt_config_from_json(info.config.at("model")));
      model.to(training_device(o));  // --device: the checkpoint's tensors are copied there
      training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
      const int64_t T = model.cfg.context;
      const auto t0 = std::chrono::steady_clock::now();
      const double val = lm_loss(model, d.valid, eval_starts(int64_t(d.valid.size()), T, eval_windows), T, o.batch);
      fmt::print("gpt: {} at step {}: validation loss {:.4f} ({:.3f} bits per character) over {} windows of {} "
                 "({:.1f} s)\n",
                 o.checkpoint, info.step, val, val / std::log(2.0), eval_windows, T, seconds_since(t0));
      if (s.prompt.empty()) s.prompt = dataset == "bible" && text_file.empty() ? "And God said" : "\n";
      const std::string dir = std::filesystem::path(o.checkpoint).parent_path().string();
      sample_and_plot(model, tok, s, sample_seed, dir.empty() ? "." : dir);
      if (dg.attention)
        diagnose(model, d.valid, eval_starts(int64_t(d.valid.size()), T, eval_windows), T, o.batch,
                 dir.empty() ? "." : dir);
      if (!eval_lengths.empty()) {
        const std::string run_name = std::filesystem::path(dir.empty() ? "." : dir).filename().string();
        evaluate_lengths(model, run_name.empty() ? o.checkpoint : run_name, d.valid, eval_lengths, eval_windows, o.batch,
                         lengths_file.empty() ? (dir.empty() ? "." : dir) + "/length_eval.jsonl" : lengths_file);
      }
      return 0;
    }

    // ---- data ----
    if (auto missing = missing_gpt_data(dataset, text_file, cache_dir, fortune_root)) {
      fmt::print(stderr, "gpt: {}\n", *missing);
      return kExitNoData;
    }
    const std::string source = text_file.empty() ? dataset : text_file;
    LMData d = make_lm_data(load_gpt_text(dataset, text_file, cache_dir, fortune_root));
    cfg.vocab = d.tokenizer.vocab_size();
    cfg.dropout = o.dropout;
    const int64_t T = cfg.context;
    check(int64_t(d.train.size()) > T && int64_t(d.valid.size()) > T,
          "{} has {} training and {} validation characters; both need more than the context {}", source,
          d.train.size(), d.valid.size(), T);
    const std::vector<int64_t> val_starts = eval_starts(int64_t(d.valid.size()), T, eval_windows);
    if (s.prompt.empty()) s.prompt = dataset == "bible" && text_file.empty() ? "And God said" : "\n";
    const std::string where = !text_file.empty() ? "a UTF-8 file"
                              : dataset == "bible" ? "cached in " + cache_dir
                                                   : "English entries under " + fortune_root;
    fmt::print(stderr, "gpt: {} ({}): {} training and {} validation characters, vocabulary {}\n", source, where,
               d.train.size(), d.valid.size(), cfg.vocab);

    // ---- model, optimizer, run ----
    Generator gen(o.seed);
    GPT model(cfg, &gen);  // initialised on the CPU (the same numbers on every device)
    model.grad_checkpointing = grad_checkpointing;
    model.to(training_device(o));  // --device; the optimizer's state is made beside each parameter
    optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
    nlohmann::json config = {
        {"model", gpt_config_to_json(cfg)},
        {"data", {{"dataset", dataset}, {"text_file", text_file}, {"valid_fraction", 0.1}}},
        {"train", {{"batch", global_batch(o)}, {"seed", o.seed}}}};  // N x --batch under mpirun
    if (grad_checkpointing) config["train"]["grad_checkpointing"] = true;  // absent when off, as in older runs
    // a text the schedule would read more than 20 times over is memorised before the end: stop when
    // the validation loss stops improving
    const double epochs = double(o.steps) * double(global_batch(o)) * double(T) / double(d.train.size());
    const std::string patience_line = resolve_patience(
        o, epochs > 20,
        fmt::format("{} training characters, read {:.1f} times by {} steps of {} x {}{}", d.train.size(), epochs,
                    o.steps, global_batch(o), T, epochs > 20 ? " (> 20: a small text)" : ""));
    Run run("gpt", o, model, opt, gen, config, {{"tokenizer", d.tokenizer.to_json()}});
    run.select_by("val_loss", false);
    if (!patience_line.empty()) run.print("gpt: " + patience_line);
    if (grad_checkpointing) run.print("gpt: --grad-checkpointing: each block's activations are recomputed in backward");
    auto sched = make_schedule(o);
    const int64_t V = cfg.vocab, N = o.batch * T;
    std::string compute_text;
    const Tensor probe = zeros({o.batch, T}, DType::i64);
    const ComputeProfile compute = profile_model(model, [&] { return model.forward(probe); }, o.batch, T, dg, &compute_text);
    run.print(compute_text);
    double val = NAN;
    int64_t val_step = -1;  // the step `val` was measured at

    // ---- training ----
    run.evaluate_with([&](int64_t s) {
      val = lm_loss(model, d.valid, val_starts, T, o.batch, /*sharded=*/true), val_step = s;
      run.log_eval(s, {{"val_loss", val}});
    });
    int64_t step = run.resume();
    const data::Range mine = data::shard(global_batch(o), dist::rank(), dist::world_size());  // this rank's windows of the global batch
    for (; step < o.steps && !run.stop_requested(); ++step) {
      sched->set_lr(opt, step);
      data::Windows w = data::random_windows(d.train, global_batch(o), T, o.seed, uint64_t(step));
      if (dist::world_size() > 1) {
        w.x = w.x.narrow(0, mine.begin, mine.size()).contiguous();
        w.y = w.y.narrow(0, mine.begin, mine.size()).contiguous();
      }
      const Tensor logits = model.forward(w.x).reshape({N, V});
      Tensor loss = cross_entropy(logits, w.y.reshape({N}).to(logits.device()));
      opt.zero_grad();
      (run.loss_scale() == 1.0 ? loss : mul(loss, run.loss_scale())).backward();  // fp16: scaled
      const Run::StepTotals t = run.reduce_step(loss.item<double>(), w.x.size(0), w.x.numel());  // over the ranks
      run.optimizer_step(step + 1, t.loss);  // clip, and a non-finite loss or norm skips the update
      run.step_done(step + 1, t.loss, t.samples, t.tokens);
      run.end_step(step + 1);  // saves, then evaluates: a crash in the evaluation loses nothing
    }
    run.save(step);  // after Ctrl-C, or the state after the last evaluation (nothing when unchanged)
    // the best model by validation loss is the one sampled and reported
    if (const int64_t best = run.load_best(); best >= 0) {
      val = run.best().value, val_step = best;
    } else if (val_step != step && (std::isnan(val) || !run.stop_requested())) {
      // no evaluation yet: the final model's loss (after Ctrl-C the last evaluation's, unless none)
      val = lm_loss(model, d.valid, val_starts, T, o.batch, /*sharded=*/true), val_step = step;
    }

    // ---- sample, plot, report ----
    RunReport report;
    report.extra = {{"val_loss", val}, {"val_bits_per_char", val / std::log(2.0)}, {"val_loss_step", double(val_step)}};
    if ((!run.stop_requested() || run.early_stopped()) && s.tokens > 0 && dist::is_main())  // rank 0 samples
      report.extra.emplace_back("generation_tokens_per_s",
                                sample_and_plot(model, d.tokenizer, s, sample_seed, run.dir()));
    compute.fill(report);
    run.finish(report);
    if (dg.attention && dist::is_main()) diagnose(model, d.valid, val_starts, T, o.batch, run.dir());
  } catch (const UsageError& e) {  // an option --eval-only would ignore
    apps::print_usage_error("gpt", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {  // ag::Error, and a malformed checkpoint's JSON
    apps::print_error("gpt", e.what());
    return apps::error_exit(kExitError);
  }
  return 0;
}
