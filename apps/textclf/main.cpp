// textclf: an attention text classifier. Default task: which of 8 languages (en de es it pt ru cs
// pl) a fortune cookie is written in, from Debian's fortune packages (~91k texts, split 80/10/10).
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
//
// Batches group texts of similar length (BucketSampler: sorted within windows of 16 shuffled
// batches), so little of each batch is padding. The baseline to beat is a character 1-5-gram
// multinomial naive Bayes on the same split (--baseline, on by default for the fortunes).
//
// Writes to the run directory (default runs/textclf): checkpoint (with config and tokenizer),
// tokenizer.json (the same vocabulary beside it), metrics.jsonl, TensorBoard events, curves.svg, attention.svg (every head's weights on one test
// text, tokens on both axes), test_errors.tsv (the test texts the model or the baseline got
// wrong, with both predictions), report.json (with forward FLOPs and MFU), and with
// --diagnose-attention attention_diagnostics.json (per block and head on one test batch: entropy,
// diagonal mass, head similarity, warnings; apps/common/diagnose.h).
//
// Data parallel: `mpirun -np N textclf ...` trains on N processes, --batch texts each: the length
// buckets are planned for the global batch of N x --batch (what `textclf --batch N*B` would see)
// and each rank pads its slice; rank 0 writes the run directory (docs/distributed.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <tuple>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <fmt/ranges.h>

#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/textclf/lib.h"
#include "attograd.h"
#include "training/checkpoint.h"
#include "optim/adam.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::apps::textclf;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The baseline, fitted on train.
CharNgramNB fitted_baseline(const data::TextSplit& split, double alpha) {
  CharNgramNB nb({.min_n = 1, .max_n = 5, .alpha = alpha});
  nb.fit(split.train);
  return nb;
}

// The baseline, fitted on train and measured on valid and test.
std::pair<EvalResult, EvalResult> naive_bayes_baseline(const data::TextSplit& split, double alpha) {
  auto t0 = std::chrono::steady_clock::now();
  const CharNgramNB nb = fitted_baseline(split, alpha);
  EvalResult val = nb.evaluate(split.valid), test = nb.evaluate(split.test);
  fmt::print(stderr, "baseline: character 1-5-gram naive Bayes (alpha {}, {} n-grams): val {:.2f}%, test {:.2f}% ({:.1f} s)\n",
             alpha, nb.vocabulary(), 100 * val.accuracy, 100 * test.accuracy, seconds_since(t0));
  return {std::move(val), std::move(test)};
}

// attention.svg: every head of every layer on one test text, tokens on both axes.
void write_attention_svg(TextClassifier& model, const TextTokenizer& tok, const EncodedSet& test,
                         const data::TextDataset& raw, const std::string& path) {
  const int64_t i = pick_heatmap_sample(test);
  if (i < 0) return;
  int64_t predicted = -1;
  std::vector<Heatmap> panels = attention_heatmaps(model, tok, test, i, &predicted);
  HeatmapOptions ho;
  ho.columns = int(model.cfg.n_heads);
  ho.cell = 14;
  ho.title = fmt::format("attention weights (query rows, key columns) of test text {}: true {}, predicted {}", i,
                         raw.classes[size_t(test.labels[size_t(i)])], raw.classes[size_t(predicted)]);
  write_file_atomic(path, svg_heatmaps(panels, ho));
}

// The first min(batch, |set|) texts of `set`, padded to their longest.
Batch first_texts(const EncodedSet& set, int64_t batch, int64_t max_len) {
  std::vector<int64_t> indices(size_t(std::clamp<int64_t>(batch, 1, int64_t(set.size()))));
  std::iota(indices.begin(), indices.end(), int64_t(0));
  return make_batch(set, indices, max_len);
}

// --diagnose-attention: every block's attention on the first test texts (padded keys and queries
// left out of the statistics).
void diagnose(TextClassifier& model, const EncodedSet& test, int64_t batch, int64_t max_len, const std::string& dir) {
  const Batch b = first_texts(test, batch, max_len);
  std::string path;
  const nn::AttentionReport r =
      write_attention_diagnostics(model, [&] { model.forward(b.tokens, b.lengths, b.ngrams); }, dir, &path);
  fmt::print("attention diagnostics on {} test texts:\n{}written to {}\n", b.labels.size(0), r.to_text(), path);
}

// The options whose values --eval-only takes from the checkpoint, and their keys in checked_config.
const std::vector<SavedOption>& saved_options() {
  static const std::vector<SavedOption> options = {
      {"--dataset", "/data/dataset"},     {"--tsv-file", "/data/tsv_file"},       {"--tsv-test", "/data/tsv_test"},
      {"--split-seed", "/data/split_seed"}, {"--tokenizer", "/data/tokenizer"},   {"--max-len", "/data/max_len"},
      {"--min-freq", "/data/min_freq"},   {"--max-words", "/data/max_words"},     {"--layout-tokens", "/data/layout"},
      {"--d-model", "/model/d_model"},    {"--heads", "/model/n_heads"},          {"--layers", "/model/n_layers"},
      {"--mlp", "/model/mlp_hidden"},     {"--ngram-buckets", "/model/ngram_buckets"}, {"--ngrams", "/ngrams"},
      {"--ngrams-per-token", "/model/ngrams_per_token"}};
  return options;
}

// The command line's model before the data is read: the n-gram settings as given (buckets -1 is
// auto, which checked_config reads as the checkpoint's choice).
TextClassifierConfig model_of(TextClassifierConfig mc, const TrainSettings& settings) {
  mc.ngram_buckets = settings.ngram_buckets;
  std::tie(mc.ngram_min, mc.ngram_max) = parse_ngram_range(settings.ngram_range);  // checked by validate_config
  return mc;
}

// A model and its data as check_eval_only_options compares them, with --ngrams as one "MIN-MAX"
// value. The automatic choices (--tokenizer auto, --ngram-buckets -1) stand for what the data chose
// when the checkpoint was trained: `saved_model` and `saved_data`'s.
nlohmann::json checked_config(TextClassifierConfig mc, DataOptions d, const TextClassifierConfig& saved_model,
                              const DataOptions& saved_data) {
  if (d.tokenizer == "auto") d.tokenizer = saved_data.tokenizer;
  if (mc.ngram_buckets < 0) mc.ngram_buckets = saved_model.ngram_buckets;
  return {{"model", config_to_json(mc)},
          {"data", data_to_json(d)},
          {"ngrams", fmt::format("{}-{}", mc.ngram_min, mc.ngram_max)}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"textclf: an attention text classifier (default: language identification on Debian's fortunes)"};
  RunOptions o;
  // The defaults, chosen on the fortunes by validation accuracy over several seeds (the default
  // run: docs/benchmarks.md, "The apps' default runs"). Words (about 30 tokens per text) with
  // subword n-grams are the default: on test they are at parity with the character n-gram naive
  // Bayes baseline, while characters (about 100 tokens per text) underfit at this size.
  o.steps = 3000;
  o.batch = 64;
  o.lr = 3e-3;
  o.warmup = 0.05;
  o.weight_decay = 0.05;
  o.clip = 1.0;
  o.dropout = 0.0;
  add_run_options(cli, o);
  // word models with subword n-grams fit the training set (loss ~0.002) and gain from dropout;
  // character models underfit and do not: the default depends on the tokenizer
  constexpr double kWordDropout = 0.1;
  // Word dropout on a small set of words (< kSmallTrainSet texts): 0.3, the best of the rates tried
  // by validation accuracy over seeds on two small fortune sets (docs/benchmarks.md, "Small data").
  constexpr double kSmallSetWordDropout = 0.3;
  cli.get_option("--dropout")
      ->description(fmt::format("dropout probability (default: {} with the word tokenizer, 0 with the char one)",
                                kWordDropout))
      ->default_str("");

  DiagnoseOptions dg;
  add_diagnose_options(cli, dg);
  DataOptions d;
  TextClassifierConfig mc;
  mc.d_model = 64, mc.n_heads = 4, mc.n_layers = 2, mc.mlp_hidden = 256;
  TrainSettings settings;  // the subword n-gram defaults (data::hashed_ngrams), chosen on the fortunes (above)
  std::string baseline = "auto";
  mc.ngrams_per_token = 32;
  cli.add_option("--dataset", d.dataset, "fortunes (8-language ID), imdb (aclImdb folder in --data-dir) or tsv")
      ->capture_default_str()
      ->check(CLI::IsMember({"fortunes", "imdb", "tsv"}));
  cli.add_option("--tsv-file", d.tsv_file, "label<TAB>text file for --dataset tsv (split 80/10/10 unless --tsv-test)");
  cli.add_option("--tsv-test", d.tsv_test, "a separate test TSV for --dataset tsv");
  cli.add_option("--split-seed", d.split_seed, "seed of the train/validation/test split")->capture_default_str();
  cli.add_option("--tokenizer", d.tokenizer, "char, word, or auto (word for fortunes and imdb; for tsv, word when its texts are natural language written "
                 "with spaces, else char)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "char", "word"}));
  cli.add_option("--max-len", d.max_len, "tokens per text (longer texts keep their beginning)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), kMaxTextLen));
  cli.add_option("--min-freq", d.min_freq, "word tokenizer: minimum count of a word")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--max-words", d.max_words, "word tokenizer: vocabulary size with <pad> and <unk>")
      ->capture_default_str()
      ->check(CLI::Range(3, 1 << 30));
  cli.add_flag("--layout-tokens", d.layout,
               "word tokenizer: every newline and tab is a token too (the shape of a text: line breaks, indented "
               "attributions)");
  cli.add_option("--d-model", mc.d_model, "model width (attention dim)")->capture_default_str()->check(positive());
  cli.add_option("--heads", mc.n_heads, "attention heads")->capture_default_str()->check(positive());
  cli.add_option("--layers", mc.n_layers, "transformer blocks")->capture_default_str()->check(positive());
  cli.add_option("--mlp", mc.mlp_hidden, "MLP hidden width")->capture_default_str()->check(positive());
  cli.add_option("--label-smoothing", settings.label_smoothing, "cross-entropy label smoothing")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  cli.add_option("--word-dropout", settings.word_dropout,
                 fmt::format("augmentation: each token of a training text is left out with this probability, "
                             "[0, 0.9] (default: {} for a small set with the word tokenizer, else 0)",
                             kSmallSetWordDropout))
      ->default_str("");
  cli.add_option("--bucket-window", settings.bucket_window, "batches sorted by length together (1: no bucketing)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--eval-samples", settings.eval_samples, "validation texts per evaluation during training (0: all)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--eval-batch-tokens", settings.eval_batch_tokens, "padded tokens per evaluation batch")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--baseline", baseline,
                 "also measure the character n-gram naive Bayes baseline: on, off, or auto (on for fortunes and TSV "
                 "files when training, a yardstick for a user's own data; --eval-only: on only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cli.add_option("--ngram-buckets", settings.ngram_buckets,
                 "word tokenizer: hash buckets of the subword character n-grams added to each word's vector "
                 "(0: off). Default: 262144 with the word tokenizer, off with the char one; a value > 0 with "
                 "the char tokenizer is an error")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 26));
  cli.add_option("--ngrams", settings.ngram_range, "n-gram lengths MIN-MAX in codepoints, of \"<\" + word + \">\"")
      ->capture_default_str();
  cli.add_option("--ngrams-per-token", mc.ngrams_per_token, "at most this many n-grams per word (the shorter kept)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--nb-alpha", settings.nb_alpha,
                 "naive Bayes add-alpha smoothing: of the baseline, and of the bag path's starting values")
      ->capture_default_str()
      ->check(positive());
  std::string bag_path = "auto";
  cli.add_option("--bag-path", bag_path,
                 "a linear model of the words (and their n-grams) beside the encoder, its logits added to the "
                 "encoder's and its weights started as naive Bayes on the training set: on, off, or auto (on for "
                 "a small set with the word tokenizer when that start is as accurate on validation as the "
                 "character n-gram naive Bayes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  if (const int rc = apps::parse_command_line(cli, argc, argv, "textclf"); rc >= 0) return rc;
  o.command_line.assign(argv, argv + argc);
  o.given = given_options(cli);

  try {  // every option is checked before any data is read
    apply_run_options(o, "textclf");
    validate_config(d, mc, settings);
  } catch (const UsageError& e) {
    apps::print_usage_error("textclf", e.what());
    return kExitUsage;
  }
  try {
    Generator gen(o.seed);

    // ---- --eval-only: model, tokenizer and data settings come from the checkpoint --------------
    std::optional<TextTokenizer> saved_tok;
    if (o.eval_only) {
      CheckpointInfo info = read_checkpoint_info(o.checkpoint);
      check(info.config.contains("model") && info.config.contains("data"),
            "textclf: '{}' holds no textclf config (model and data)", o.checkpoint);
      check(info.extra.count("tokenizer") > 0, "textclf: '{}' holds no tokenizer", o.checkpoint);
      const TextClassifierConfig saved_model = config_from_json(info.config["model"]);
      DataOptions from_ckpt = data_from_json(info.config["data"]);
      check_eval_only_options(o, checked_config(saved_model, from_ckpt, saved_model, from_ckpt),
                              checked_config(model_of(mc, settings), d, saved_model, from_ckpt), saved_options(),
                              "textclf");
      mc = saved_model;
      if (!o.data_dir.empty()) from_ckpt.root = o.data_dir;
      d = from_ckpt;
      saved_tok = TextTokenizer::from_json(info.extra["tokenizer"], o.checkpoint + ": tokenizer");
    } else if (!o.data_dir.empty()) {
      d.root = o.data_dir;
    }
    if (d.dataset == "imdb" && d.root.empty()) d.root = "aclImdb";

    if (std::string missing = missing_data(d); !missing.empty()) {
      fmt::print(stderr, "textclf: {}\n", missing);
      return kExitNoData;
    }
    auto t0 = std::chrono::steady_clock::now();
    data::TextSplit split = load_split(d);
    const std::vector<std::string>& classes = split.train.classes;
    fmt::print(stderr, "data: {} with {} classes ({}): {} train, {} validation, {} test texts ({:.1f} s)\n", d.dataset,
               classes.size(), fmt::join(classes, " "), split.train.size(), split.valid.size(), split.test.size(),
               seconds_since(t0));
    for (const auto& s : split.train.skipped) fmt::print(stderr, "  skipped {}\n", s);

    t0 = std::chrono::steady_clock::now();
    std::vector<std::string> train_texts;
    for (const auto& ex : split.train.examples) train_texts.push_back(ex.text);
    std::vector<std::string> chosen;  // the defaults that depend on the data, one line each
    if (!o.eval_only && d.tokenizer == "auto" && d.dataset == "tsv") {
      std::string why;
      d.tokenizer = choose_tsv_tokenizer(train_texts, &why);
      chosen.push_back(why);
      try {  // --ngram-buckets and --layout-tokens need words: checked again now that the kind is known
        validate_config(d, mc, settings);
      } catch (const UsageError& e) {
        apps::print_usage_error("textclf", e.what());
        return kExitUsage;
      }
    }
    const std::string tok_kind = resolve_tokenizer(d);
    TextTokenizer tok = saved_tok ? *saved_tok
                        : tok_kind == "char" ? TextTokenizer::build_char(train_texts)
                        : TextTokenizer::build_word(train_texts, d.min_freq, d.max_words, d.layout);
    if (!o.eval_only) {
      mc.ngram_buckets = settings.ngram_buckets >= 0 ? settings.ngram_buckets
                         : tok_kind == "word"        ? kWordNgramBuckets
                                                     : 0;
      std::tie(mc.ngram_min, mc.ngram_max) = parse_ngram_range(settings.ngram_range);  // checked above
    }
    const data::NgramSpec ngrams = ngram_spec(mc);
    EncodedSet train = encode_dataset(split.train, tok, d.max_len, ngrams),
               valid = encode_dataset(split.valid, tok, d.max_len, ngrams),
               test = encode_dataset(split.test, tok, d.max_len, ngrams);
    std::string subwords;
    if (ngrams.buckets > 0)
      subwords = fmt::format("; {}..{}-grams of {} distinct words hashed into {} buckets, at most {} per word",
                             ngrams.min_n, ngrams.max_n, train.form_ngrams.size() - 1, ngrams.buckets,
                             ngrams.max_per_token);
    fmt::print(stderr,
               "tokens: {} tokenizer{}, vocabulary {}, max length {}: {:.1f} tokens per training text{} ({:.1f} s)\n",
               tok.kind_name(), d.layout ? " with newline and tab tokens" : "", tok.vocab_size(), d.max_len,
               double(train.tokens()) / double(train.size()), subwords, seconds_since(t0));

    const bool small = train.size() < kSmallTrainSet;
    const std::string size = fmt::format("{} training texts{}", train.size(),
                                         small ? fmt::format(" (< {}: a small set)", kSmallTrainSet) : "");
    if (!o.eval_only && small && tok_kind == "word" && cli.get_option("--word-dropout")->count() == 0) {
      settings.word_dropout = kSmallSetWordDropout;
      chosen.push_back(fmt::format("--word-dropout {}: {}: words left out of the training texts against "
                                   "memorising (--word-dropout 0: off)",
                                   kSmallSetWordDropout, size));
    }
    // The bag path's start: naive Bayes over the model's features. --bag-path auto takes it for a
    // small set of words when that start is as good on validation as the character n-gram naive
    // Bayes: where it is worse, a poor start held the model below the encoder alone (wisdom vs
    // definitions, docs/benchmarks.md, small data).
    std::optional<BagTables> bag_start;
    if (!o.eval_only && (bag_path == "on" || (bag_path == "auto" && small && tok_kind == "word"))) {
      bag_start = bag_naive_bayes(train, tok.vocab_size(), mc.ngram_buckets, int64_t(classes.size()),
                                  settings.nb_alpha);
      if (bag_path == "auto") {
        const double start = bag_accuracy(*bag_start, valid),
                     chars = fitted_baseline(split, settings.nb_alpha).evaluate(split.valid).accuracy;
        chosen.push_back(fmt::format(
            "--bag-path {}: {}: a linear bag of the words and their n-grams beside the encoder, started as naive "
            "Bayes on them, {:.2f}% on validation against the character n-gram naive Bayes' {:.2f}%{}",
            start >= chars ? "on" : "off", size, 100 * start, 100 * chars,
            start >= chars ? " (--bag-path off: the encoder alone)" : ": a worse start (--bag-path on: it anyway)"));
        if (start < chars) bag_start.reset();
      }
    }
    if (!o.eval_only) {
      mc.bag = bag_start.has_value();
      mc.vocab = tok.vocab_size();
      mc.max_len = d.max_len;
      mc.classes = int64_t(classes.size());
      mc.dropout = cli.get_option("--dropout")->count() > 0 ? o.dropout : tok_kind == "word" ? kWordDropout : 0.0;
      if (cli.get_option("--dropout")->count() == 0)
        chosen.push_back(tok_kind == "word" ? fmt::format("--dropout {}: word models with subword n-grams fit their "
                                                          "training set, and dropout holds them back",
                                                          kWordDropout)
                                            : "--dropout 0: character models underfit, dropout would not help");
    }
    TextClassifier model(mc, &gen);  // initialised on the CPU (the same numbers on every device)
    if (bag_start) init_bag_from_naive_bayes(model, *bag_start);
    model.to(training_device(o));     // --device; the optimizer's state is made beside each parameter
    optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
    nlohmann::json config = {{"model", config_to_json(mc)}, {"data", data_to_json(d)},
                                   {"label_smoothing", settings.label_smoothing}, {"bucket_window", settings.bucket_window},
                                   {"batch", global_batch(o)}, {"seed", o.seed}};  // what fixes the batches
    // word dropout changes the batches too; named only when on, so that the configs of runs
    // without it stay as they were (a resume compares them whole)
    if (settings.word_dropout > 0) config["word_dropout"] = settings.word_dropout;

    if (o.eval_only) {
      if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
      check(mc.vocab == tok.vocab_size(), "textclf: '{}': the model's vocabulary {} differs from its tokenizer's {}",
            o.checkpoint, mc.vocab, tok.vocab_size());
      training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
      t0 = std::chrono::steady_clock::now();
      EvalResult r = evaluate(model, test, classes, settings.eval_batch_tokens);
      fmt::print("{}: test accuracy {:.2f}%, loss {:.4f} on {} texts ({:.1f} s)\n{}", o.checkpoint, 100 * r.accuracy,
                 r.loss, test.size(), seconds_since(t0), r.confusion.to_text());
      std::optional<EvalResult> nb_test;  // with --baseline on only: fitting it takes seconds
      if (baseline == "on") nb_test = naive_bayes_baseline(split, settings.nb_alpha).second;
      std::filesystem::create_directories(o.out_dir);
      std::array<int64_t, 3> wrong{};
      write_file_atomic(o.out_dir + "/test_errors.tsv",
                        errors_tsv(split.test, r.predicted, nb_test ? &nb_test->predicted : nullptr, &wrong));
      fmt::print("misclassified test texts: {}/test_errors.tsv ({} errors{})\n", o.out_dir, wrong[0],
                 nb_test ? fmt::format("; the baseline's {}, {} of them made by both", wrong[1], wrong[2]) : "");
      write_attention_svg(model, tok, test, split.test, o.out_dir + "/attention.svg");
      fmt::print("attention heatmap: {}/attention.svg\n", o.out_dir);
      if (test.size() > 0 && dg.attention) diagnose(model, test, o.batch, d.max_len, o.out_dir);
      return 0;
    }

    const bool want_baseline =
        baseline == "on" || (baseline == "auto" && (d.dataset == "fortunes" || d.dataset == "tsv"));
    std::optional<std::pair<EvalResult, EvalResult>> nb;  // validation, test
    if (want_baseline && dist::is_main()) nb = naive_bayes_baseline(split, settings.nb_alpha);  // rank 0 reports it

    // a small set is memorised long before the default schedule ends: at most 20 epochs, and a
    // stop when validation stops improving
    if (small && cli.get_option("--steps")->count() == 0) {
      const int64_t epochs20 = std::max<int64_t>(1, (20 * train.size() + global_batch(o) - 1) / global_batch(o));
      if (epochs20 < o.steps) {
        chosen.push_back(fmt::format("--steps {}: 20 epochs of {} at batch {} (the default {} would be {:.0f} epochs)",
                                     epochs20, size, global_batch(o), o.steps,
                                     double(o.steps) * double(global_batch(o)) / double(train.size())));
        set_steps(o, epochs20);
      }
    }
    if (const std::string p = resolve_patience(o, small, size); !p.empty()) chosen.push_back(p);
    Run run("textclf", o, model, opt, gen, config, {{"tokenizer", tok.to_json()}});
    run.select_by("val_accuracy", true, "val_loss");
    for (const std::string& line : chosen) run.print("textclf: " + line);
    std::vector<int64_t> lengths;
    for (const auto& ids : train.ids) lengths.push_back(int64_t(ids.size()));
    BucketSampler sampler(lengths, global_batch(o), settings.bucket_window, o.seed);  // N x --batch under mpirun
    auto sched = make_schedule(o);
    run.evaluate_with([&](int64_t s) {
      EvalResult v = evaluate(model, valid, classes, settings.eval_batch_tokens, settings.eval_samples, /*sharded=*/true);
      run.log_eval(s, {{"val_loss", v.loss}, {"val_accuracy", v.accuracy}});
    });
    int64_t step = run.resume();
    run.print(fmt::format("model: d_model {}, {} heads, {} layers, MLP {}, dropout {}, word dropout {}, n-gram buckets "
                          "{}; AdamW lr {} ({} schedule), batch {}, {} steps ({:.2f} epochs), {} parameters",
                          mc.d_model, mc.n_heads, mc.n_layers, mc.mlp_hidden, mc.dropout, settings.word_dropout,
                          mc.ngram_buckets, o.lr,
                          o.schedule, global_batch(o), o.steps, double(o.steps) / double(sampler.num_batches()),
                          model.num_parameters()));
    // the compute profile on the first training texts: FLOPs per text at their padded length
    // (texts vary in length, so the MFU derived from it is approximate)
    const Batch probe = first_texts(train, o.batch, d.max_len);
    std::string compute_text;
    const ComputeProfile compute =
        profile_model(model, [&] { return model.forward(probe.tokens, probe.lengths, probe.ngrams); },
                      probe.labels.size(0), probe.tokens.size(1), dg, &compute_text);
    run.print(compute_text);
    if (step < o.steps) {
      auto loader = make_train_loader(train, sampler, o.steps, d.max_len, 2, dist::rank(), dist::world_size(),
                                      {.p = settings.word_dropout, .seed = o.seed + 2});
      loader->seek(step);
      for (; step < o.steps && !run.stop_requested(); ++step) {
        sched->set_lr(opt, step);
        const Batch b = loader->next_step();
        double loss = 0;
        {  // the gradients of the batch; its logits and loss are freed at the brace, before update and evaluation
          const Tensor logits = model.forward(b.tokens, b.lengths, b.ngrams);  // (B, K)
          const Tensor mean_loss =
              cross_entropy(logits, b.labels.to(logits.device()), "mean", -100, settings.label_smoothing);
          opt.zero_grad();
          (run.loss_scale() == 1.0 ? mean_loss : mul(mean_loss, run.loss_scale())).backward();  // fp16: scaled
          loss = mean_loss.item<double>();
        }
        const Run::StepTotals t = run.reduce_step(loss, b.labels.size(0), b.num_tokens);  // over the ranks
        run.optimizer_step(step + 1, t.loss);  // clip, and a non-finite loss or norm skips the update
        run.step_done(step + 1, t.loss, t.samples, t.tokens);
        run.end_step(step + 1);  // saves, then evaluates: a crash in the evaluation loses nothing
      }
    }
    run.save(step);
    run.load_best();  // the model of the best validation accuracy

    // ---- the final evaluation: the whole validation and test splits ---------------------------
    t0 = std::chrono::steady_clock::now();
    EvalResult v = evaluate(model, valid, classes, settings.eval_batch_tokens, 0, /*sharded=*/true);
    EvalResult t = evaluate(model, test, classes, settings.eval_batch_tokens, 0, /*sharded=*/true);
    run.print(fmt::format("final: validation accuracy {:.2f}% (loss {:.4f}), test accuracy {:.2f}% (loss {:.4f}) ({:.1f} s)",
                          100 * v.accuracy, v.loss, 100 * t.accuracy, t.loss, seconds_since(t0)));
    if (dist::is_main()) write_attention_svg(model, tok, test, split.test, run.path("attention.svg"));
    std::array<int64_t, 3> wrong{};  // model, baseline, both
    if (dist::is_main())
      write_file_atomic(run.path("test_errors.tsv"),
                        errors_tsv(split.test, t.predicted, nb ? &nb->second.predicted : nullptr, &wrong));

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
    if (dg.attention && test.size() > 0) diagnose(model, test, o.batch, d.max_len, run.dir());
    if (nb)
      fmt::print("test accuracy {:.2f}% vs the naive Bayes baseline's {:.2f}%: {} ({} errors against {}, {} of them "
                 "made by both)\n",
                 100 * t.accuracy, 100 * nb->second.accuracy,
                 t.accuracy > nb->second.accuracy   ? "the transformer wins"
                 : t.accuracy < nb->second.accuracy ? "the baseline wins"
                                                    : "a tie",
                 wrong[0], wrong[1],
                 wrong[2]);
    fmt::print("misclassified test texts: {}\n", run.path("test_errors.tsv"));
    fmt::print("attention heatmap: {}\n", run.path("attention.svg"));
  } catch (const UsageError& e) {  // an option --eval-only would ignore
    apps::print_usage_error("textclf", e.what());
    return kExitUsage;
  } catch (const Error& e) {
    apps::print_error("textclf", e.what());
    return apps::error_exit(kExitError);
  }
  return 0;
}
