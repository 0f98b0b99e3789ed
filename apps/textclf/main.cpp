// textclf: an attention text classifier. Default task: which of 8 languages (en de es it pt ru cs
// pl) a fortune cookie is written in, from Debian's fortune packages (~91k texts: 10% test, 5,000
// validation).
// Also the aclImdb reviews (--dataset imdb --data-dir <aclImdb>) and any label<TAB>text file
// (--dataset tsv --tsv-file f).
//
// The model (apps/textclf/model.h TextClassifier), B texts of at most T tokens, K classes:
//   tokens (B, T) i64, padded with 0 after lengths[b] valid tokens (words by default)
//   ngrams (B, T, G) i64, each word's hashed character n-grams (fastText's subwords), 0 = padding
//   e = tok(tokens) + sum_g ngram(ngrams)                (B, T, d)  a word plus its n-grams
//   h = e + pos(0..T-1)                                  (B, T, d)  learned embeddings
//   h = h + attn(ln1(h), keys t < lengths[b])            (B, T, d)  4 heads of d/4 dims, padded keys
//   h = h + mlp(ln2(h))                                  (B, T, d)  never attended to; x n_layers
//   pooled_b = sum_{t < len_b} norm(h)_bt / len_b        (B, d)     mean over the valid tokens
//   logits = head(dropout(pooled))                       (B, K)
//   loss = cross_entropy(logits, label)
// Attention, per head: softmax(q k^T / sqrt(d/4) + mask) v, where the mask is -inf on padded keys.
// Default: words with n-grams, d 64, 4 heads, 2 layers, MLP 256, dropout 0.1; AdamW (lr 3e-3,
// weight decay 0.05), 5% linear warmup then cosine to zero, gradient clip 1.0, batch 64, 3000 steps.
//
// Batches group texts of similar length (BucketSampler: sorted within windows of 16 shuffled
// batches), so little of each batch is padding. The baseline to beat is a character 1-5-gram
// multinomial naive Bayes on the same split (--baseline, on by default for the fortunes).
//
// Model selection: validation picks the model (best.safetensors), which is tested once, at the
// end. Every dataset holds validation_size's count of its training texts out for it (10%, at most
// 5000; apps/common/options.h); the fortunes and a --tsv-file without --tsv-test give 10% to
// test. Under 20,000 training texts the defaults change, each said in one line (lib.h
// fit_defaults_to_data); a flag given wins.
//
// Writes to the run directory (default runs/textclf): checkpoint (with config and tokenizer),
// best.safetensors, metrics.jsonl, TensorBoard events, curves.svg, attention.svg (every head's
// weights on one test text), test_errors.tsv (the test texts the model or the baseline got wrong,
// with both predictions), report.json (with forward FLOPs and MFU), and with --diagnose-attention
// attention_diagnostics.json (per block and head on one test batch; apps/common/diagnose.h).
// Resume with --resume (--stop-at K stops after step K as Ctrl-C would); evaluate a saved model
// with --eval-only [--checkpoint FILE].
//
// Data parallel: `mpirun -np N textclf ...` trains on N processes, --batch texts each: the length
// buckets are planned for the global batch of N x --batch (what `textclf --batch N*B` would see)
// and each rank pads its slice; rank 0 writes the run directory (docs/distributed.md).
#include <filesystem>

#include <fmt/core.h>

#include "apps/common/app.h"
#include "apps/common/clock.h"
#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/textclf/lib.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::apps::textclf;

namespace {

// --eval-only: the model, its tokenizer and its data as the checkpoint saved them, on the test set.
// mc, d, s: the command line's, which saved_run checks against the checkpoint's
int evaluate_checkpoint(const RunOptions& o, const TextClassifierConfig& mc, const DataOptions& d,
                        const TrainSettings& s, const DiagnoseOptions& dg) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  SavedRun saved = saved_run(read_checkpoint_info(o.checkpoint, "textclf"), o, mc, d, s);
  const TextData data = load_text_data(saved.data, saved.model, s, o.data_dir, &saved.tok);
  TextClassifier model(saved.model);
  model.to(training_device(o));  // --device: the checkpoint's tensors are copied there
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  const double t0 = now_seconds();
  const EvalResult r = evaluate(model, data.test, data.classes(), s.eval_batch_tokens);
  fmt::print("{}: test accuracy {:.2f}%, loss {:.4f} on {} texts ({:.1f} s)\n{}", o.checkpoint, 100 * r.accuracy,
             r.loss, data.test.size(), seconds_since(t0), r.confusion.to_text());
  std::optional<EvalResult> nb_test;  // with --baseline on only: fitting it takes seconds
  if (s.baseline == "on") nb_test = naive_bayes_baseline(data.split, s.nb_alpha).second;
  std::filesystem::create_directories(o.out_dir);
  std::array<int64_t, 3> wrong{};
  write_file_atomic(o.out_dir + "/test_errors.tsv",
                    errors_tsv(data.split.test, r.predicted, nb_test ? &nb_test->predicted : nullptr, &wrong));
  fmt::print("misclassified test texts: {}/test_errors.tsv ({} errors{})\n", o.out_dir, wrong[0],
             nb_test ? fmt::format("; the baseline's {}, {} of them made by both", wrong[1], wrong[2]) : "");
  write_attention_svg(model, data, o.out_dir + "/attention.svg");
  fmt::print("attention heatmap: {}/attention.svg\n", o.out_dir);
  if (dg.attention && data.test.size() > 0) diagnose(model, data.test, o.batch, saved.data.max_len, o.out_dir);
  return 0;
}

int train(RunOptions o, DataOptions d, TextClassifierConfig mc, TrainSettings s, const DiagnoseOptions& dg) {
  // ---- data: the split, its tokens, and the defaults that depend on them ------------------------
  std::vector<std::string> chosen;  // the defaults the data decided, one line each
  const TextData data = load_text_data(d, mc, s, o.data_dir, nullptr, &chosen);
  std::optional<BagTables> bag_start;  // the bag path's naive Bayes start, when the path is on
  for (std::string& line : fit_defaults_to_data(o, mc, s, d, data, bag_start)) chosen.push_back(line);

  // ---- model, optimizer, schedule, baseline, and the run directory -----------------------------
  Generator gen(o.seed);
  TextClassifier model(mc, &gen);  // initialised on the CPU (the same numbers on every device)
  if (bag_start) init_bag_from_naive_bayes(model, *bag_start);
  model.to(training_device(o));  // --device; the optimizer's state is made beside each parameter
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  std::optional<std::pair<EvalResult, EvalResult>> nb;  // the baseline on validation and test
  const bool baseline = s.baseline == "on" || (s.baseline == "auto" && (d.dataset == "fortunes" || d.dataset == "tsv"));
  if (baseline && dist::is_main()) nb = naive_bayes_baseline(data.split, s.nb_alpha);  // rank 0 reports it
  Run run("textclf", o, model, opt, gen, run_config(mc, d, s, o), {{"tokenizer", data.tok.to_json()}});
  run.select_by("val_accuracy", true, "val_loss");
  for (const std::string& line : chosen) run.print("textclf: " + line);
  const BucketSampler sampler(data.train.lengths(), global_batch(o), s.bucket_window, o.seed);  // N x --batch

  // ---- the training loop: the validation texts pick the best model; the test set waits ----------
  run.evaluate_with([&](int64_t step) {  // each rank its part of the texts (sharded)
    const EvalResult v = evaluate(model, data.valid, data.classes(), s.eval_batch_tokens, s.eval_samples, true);
    run.log_eval(step, {{"val_loss", v.loss}, {"val_accuracy", v.accuracy}});
  });
  int64_t step = run.resume();
  run.print(fmt::format("model: d_model {}, {} heads, {} layers, MLP {}, dropout {}, word dropout {}, n-gram buckets "
                        "{}; AdamW lr {} ({} schedule), batch {}, {} steps ({:.2f} epochs), {} parameters",
                        mc.d_model, mc.n_heads, mc.n_layers, mc.mlp_hidden, mc.dropout, s.word_dropout,
                        mc.ngram_buckets, o.lr, o.schedule, global_batch(o), o.steps,
                        double(o.steps) / double(sampler.num_batches()), model.num_parameters()));
  // the compute profile on the first training texts: FLOPs per text at their padded length (texts
  // vary in length, so the MFU derived from it is approximate)
  const Batch probe = first_texts(data.train, o.batch, d.max_len);
  std::string compute_text;
  const ComputeProfile compute =
      profile_model(model, [&] { return model.forward(probe.tokens, probe.lengths, probe.ngrams); },
                    probe.labels.size(0), probe.tokens.size(1), dg, &compute_text);
  run.print(compute_text);
  if (step < o.steps) {
    // the global batch of step s, planned as one process would; this rank pads its slice
    auto loader = make_train_loader(data.train, sampler, o.steps, d.max_len, 2, dist::rank(), dist::world_size(),
                                    {.p = s.word_dropout, .seed = o.seed + 2});
    loader->seek(step);
    for (; step < o.steps && !run.stop_requested(); ++step) {
      schedule->set_lr(opt, step);
      const Batch b = loader->next_step();
      const double loss = forward_backward(model, opt, b, s.label_smoothing, run.loss_scale());
      run.update(step + 1, loss, b.labels.size(0), b.num_tokens);  // over the ranks: clip, step, log, save, evaluate
    }
  }
  run.save(step);  // also after Ctrl-C: nothing trained is lost

  // ---- the final evaluation: the whole validation and test splits, on the best model -----------
  run.load_best();
  const double t0 = now_seconds();
  const EvalResult v = evaluate(model, data.valid, data.classes(), s.eval_batch_tokens, 0, /*sharded=*/true);
  const EvalResult t = evaluate(model, data.test, data.classes(), s.eval_batch_tokens, 0, /*sharded=*/true);
  run.print(fmt::format("final: validation accuracy {:.2f}% (loss {:.4f}), test accuracy {:.2f}% (loss {:.4f}) ({:.1f} s)",
                        100 * v.accuracy, v.loss, 100 * t.accuracy, t.loss, seconds_since(t0)));
  std::array<int64_t, 3> wrong{};  // model, baseline, both
  if (dist::is_main()) {
    write_attention_svg(model, data, run.path("attention.svg"));
    write_file_atomic(run.path("test_errors.tsv"),
                      errors_tsv(data.split.test, t.predicted, nb ? &nb->second.predicted : nullptr, &wrong));
  }
  RunReport report;
  report.accuracy = t.accuracy;
  report.confusion = t.confusion;
  report.extra = {{"test_loss", t.loss}, {"val_accuracy", v.accuracy}, {"val_loss", v.loss}};
  if (nb) {
    report.extra.emplace_back("baseline_nb_val_accuracy", nb->first.accuracy);
    report.extra.emplace_back("baseline_nb_test_accuracy", nb->second.accuracy);
  }
  compute.fill(report);
  run.finish(report);
  if (!dist::is_main()) return 0;  // the plots and the summary are rank 0's
  if (dg.attention && data.test.size() > 0) diagnose(model, data.test, o.batch, d.max_len, run.dir());
  if (nb) fmt::print("{}", versus_baseline(t, nb->second, wrong));
  fmt::print("misclassified test texts: {}\n", run.path("test_errors.tsv"));
  fmt::print("attention heatmap: {}\n", run.path("attention.svg"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  App app("textclf", "an attention text classifier (default: language identification on Debian's fortunes)");
  // The defaults, chosen on the fortunes by validation accuracy over several seeds (the default
  // run: docs/benchmarks.md, "The apps' default runs"). Words (about 30 tokens per text) with
  // subword n-grams are the default: on test they are at parity with the character n-gram naive
  // Bayes baseline, while characters (about 100 tokens per text) underfit at this size.
  app.o = {.steps = 3000, .batch = 64, .lr = 3e-3, .warmup = 0.05, .weight_decay = 0.05, .clip = 1.0, .dropout = 0.0};
  app.add_run_options();
  CLI::App& cli = app.cli;
  cli.get_option("--dropout")
      ->description(fmt::format("dropout probability (default: {} with the word tokenizer, 0 with the char one)",
                                kWordDropout))
      ->default_str("");
  DiagnoseOptions dg;
  add_diagnose_options(cli, dg);
  DataOptions d;
  TextClassifierConfig mc{.d_model = 64, .n_heads = 4, .n_layers = 2, .mlp_hidden = 256, .ngrams_per_token = 32};
  TrainSettings s;  // the subword n-gram defaults (data::hashed_ngrams), chosen on the fortunes (above)
  cli.add_option("--dataset", d.dataset, "fortunes (8-language ID), imdb (aclImdb folder in --data-dir) or tsv")
      ->check(CLI::IsMember({"fortunes", "imdb", "tsv"}));
  cli.add_option("--tsv-file", d.tsv_file,
                 "label<TAB>text file for --dataset tsv (10% test unless --tsv-test; validation 10%, at most 5000)");
  cli.add_option("--tsv-test", d.tsv_test, "a separate test TSV for --dataset tsv");
  cli.add_option("--split-seed", d.split_seed, "seed of the train/validation/test split");
  cli.add_option("--tokenizer", d.tokenizer,
                 "char, word, or auto (word for fortunes and imdb; for tsv, word when its texts are natural language "
                 "written with spaces, else char)")
      ->check(CLI::IsMember({"auto", "char", "word"}));
  cli.add_option("--max-len", d.max_len, "tokens per text (longer texts keep their beginning)")
      ->check(CLI::Range(int64_t(1), kMaxTextLen));
  cli.add_option("--min-freq", d.min_freq, "word tokenizer: minimum count of a word")->check(positive());
  cli.add_option("--max-words", d.max_words, "word tokenizer: vocabulary size with <pad> and <unk>")
      ->check(CLI::Range(3, 1 << 30));
  cli.add_flag("--layout-tokens", d.layout,
               "word tokenizer: every newline and tab is a token too (the shape of a text: line breaks, indented "
               "attributions)");
  cli.add_option("--d-model", mc.d_model, "model width (attention dim)")->check(positive());
  cli.add_option("--heads", mc.n_heads, "attention heads")->check(positive());
  cli.add_option("--layers", mc.n_layers, "transformer blocks")->check(positive());
  cli.add_option("--mlp", mc.mlp_hidden, "MLP hidden width")->check(positive());
  cli.add_option("--label-smoothing", s.label_smoothing, "cross-entropy label smoothing")->check(CLI::Range(0.0, 0.5));
  cli.add_option("--word-dropout", s.word_dropout,
                 fmt::format("augmentation: each token of a training text is left out with this probability, "
                             "[0, 0.9] (default: {} for a small set with the word tokenizer, else 0)",
                             kSmallSetWordDropout))
      ->default_str("");
  cli.add_option("--bucket-window", s.bucket_window, "batches sorted by length together (1: no bucketing)")
      ->check(positive());
  cli.add_option("--eval-samples", s.eval_samples, "validation texts per evaluation during training (0: all)")
      ->check(non_negative());
  cli.add_option("--eval-batch-tokens", s.eval_batch_tokens, "padded tokens per evaluation batch")->check(positive());
  cli.add_option("--baseline", s.baseline,
                 "also measure the character n-gram naive Bayes baseline: on, off, or auto (on for fortunes and TSV "
                 "files when training, a yardstick for a user's own data; --eval-only: on only)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cli.add_option("--ngram-buckets", s.ngram_buckets,
                 "word tokenizer: hash buckets of the subword character n-grams added to each word's vector "
                 "(0: off). Default: 262144 with the word tokenizer, off with the char one; a value > 0 with "
                 "the char tokenizer is an error")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 26))
      ->default_str("");
  cli.add_option("--ngrams", s.ngram_range, "n-gram lengths MIN-MAX in codepoints, of \"<\" + word + \">\"");
  cli.add_option("--ngrams-per-token", mc.ngrams_per_token, "at most this many n-grams per word (the shorter kept)")
      ->check(positive());
  cli.add_option("--nb-alpha", s.nb_alpha,
                 "naive Bayes add-alpha smoothing: of the baseline, and of the bag path's starting values")
      ->check(positive());
  cli.add_option("--bag-path", s.bag_path,
                 "a linear model of the words (and their n-grams) beside the encoder, its logits added to the "
                 "encoder's and its weights started as naive Bayes on the training set: on, off, or auto (on for "
                 "a small set with the word tokenizer unless that start trails the character n-gram naive Bayes on "
                 "validation by more than 2 standard errors)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  return app.main(
      argc, argv, [&] { validate_config(d, mc, s); },
      [&] { return app.o.eval_only ? evaluate_checkpoint(app.o, mc, d, s, dg) : train(app.o, d, mc, s, dg); });
}
