// The text classifier's data, batching, training step, evaluation, heatmaps, naive Bayes baseline,
// and the pieces of main's run (data, defaults, --eval-only): see lib.h for what each one computes.
#include "apps/textclf/lib.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <tuple>

#include <fmt/ranges.h>

#include "apps/common/clock.h"
#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "data/images.h"
#include "dist/dist.h"

namespace ag::apps::textclf {

namespace fs = std::filesystem;

// ---- tokenizer ---------------------------------------------------------------------------------

TextTokenizer TextTokenizer::build_char(const std::vector<std::string>& train_texts) {
  std::string all;
  size_t bytes = 0;
  for (const auto& t : train_texts) bytes += t.size();
  all.reserve(bytes);
  for (const auto& t : train_texts) all += t;
  TextTokenizer tok;
  tok.kind_ = Kind::char_level;
  tok.chars_ = data::CharTokenizer::from_text(all);
  return tok;
}

TextTokenizer TextTokenizer::build_word(const std::vector<std::string>& train_texts, int min_freq, int max_words,
                                        bool layout) {
  TextTokenizer tok;
  tok.kind_ = Kind::word_level;
  tok.words_ = data::WordTokenizer::build(train_texts, min_freq, max_words, layout);
  return tok;
}

int64_t TextTokenizer::vocab_size() const {
  return kind_ == Kind::char_level ? int64_t(chars_.vocab_size()) + 1 : int64_t(words_.vocab_size());
}

std::vector<int64_t> TextTokenizer::encode(std::string_view text, int64_t max_len) const {
  check(max_len > 0, "TextTokenizer::encode: max_len must be > 0, got {}", max_len);
  std::vector<int64_t> ids;
  if (kind_ == Kind::char_level) {
    ids = chars_.encode(text);
    if (int64_t(ids.size()) > max_len) ids.resize(size_t(max_len));
    for (auto& id : ids) id += 1;  // 0 is the padding
  } else {
    ids = words_.encode(text, int(max_len));
  }
  return ids;
}

std::vector<std::string> TextTokenizer::pieces(std::string_view text, int64_t max_len) const {
  check(kind_ == Kind::word_level, "TextTokenizer::pieces: subword n-grams need the word tokenizer, this one is {}",
        kind_name());
  check(max_len > 0, "TextTokenizer::pieces: max_len must be > 0, got {}", max_len);
  std::vector<std::string> words = data::word_split(text, words_.layout());
  if (int64_t(words.size()) > max_len) words.resize(size_t(max_len));
  return words;
}

std::string TextTokenizer::label(int64_t id) const {
  check(id >= 0 && id < vocab_size(), "TextTokenizer::label: id {} outside [0, {})", id, vocab_size());
  if (id == 0) return "<pad>";
  if (kind_ == Kind::char_level && chars_.mode() == data::CharTokenizer::Mode::codepoint && id == 1) return "<unk>";
  std::string s = kind_ == Kind::word_level ? words_.token(id) : chars_.decode({id - 1});
  if (s == " ") return "\u2423";   // ␣
  if (s == "\n") return "\u21b5";  // ↵
  if (s == "\t") return "\u2192";  // →
  return s;
}

std::string TextTokenizer::to_json() const {
  nlohmann::json j;
  j["kind"] = kind_name();
  j["tokenizer"] = nlohmann::json::parse(kind_ == Kind::char_level ? chars_.to_json() : words_.to_json());
  return j.dump();
}

TextTokenizer TextTokenizer::from_json(const std::string& json, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: malformed JSON: {}", what, e.what()));
  }
  check(j.is_object() && j.contains("kind") && j["kind"].is_string() && j.contains("tokenizer"),
        "{}: expected {{\"kind\": \"char\"|\"word\", \"tokenizer\": {{...}}}}, got {}", what, json.substr(0, 80));
  const std::string kind = j["kind"].get<std::string>();
  TextTokenizer tok;
  if (kind == "char") {
    tok.kind_ = Kind::char_level;
    tok.chars_ = data::CharTokenizer::from_json(j["tokenizer"].dump(), what);
  } else if (kind == "word") {
    tok.kind_ = Kind::word_level;
    tok.words_ = data::WordTokenizer::from_json(j["tokenizer"].dump(), what);
  } else {
    throw Error(fmt::format("{}: unknown kind '{}' (expected char or word)", what, kind));
  }
  return tok;
}

// ---- config ----------------------------------------------------------------------------------------

nlohmann::json config_to_json(const TextClassifierConfig& c) { return c; }  // the keys of model.h's to_json

TextClassifierConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) fail("textclf config: expected a JSON object, got {}", j.dump());
  auto get_int = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
      fail("textclf config: '{}' must be a positive integer, got {}", key, j.contains(key) ? j[key].dump() : "nothing");
    return j[key].get<int64_t>();
  };
  TextClassifierConfig c;
  c.vocab = get_int("vocab");
  c.max_len = get_int("max_len");
  c.classes = get_int("classes");
  c.d_model = get_int("d_model");
  c.n_heads = get_int("n_heads");
  c.n_layers = get_int("n_layers");
  c.mlp_hidden = get_int("mlp_hidden");
  if (!j.contains("dropout") || !j["dropout"].is_number() || !(j["dropout"].get<double>() >= 0) ||
      !(j["dropout"].get<double>() < 1))
    fail("textclf config: 'dropout' must be a number in [0, 1), got {}", j.contains("dropout") ? j["dropout"].dump() : "nothing");
  c.dropout = j["dropout"].get<double>();
  // n-gram settings: optional, so that checkpoints made before them load (n-grams off)
  auto get_optional = [&](const char* key, int64_t fallback, int64_t lo) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo)
      fail("textclf config: '{}' must be an integer >= {}, got {}", key, lo, j[key].dump());
    return j[key].get<int64_t>();
  };
  c.ngram_buckets = get_optional("ngram_buckets", 0, 0);
  c.ngram_min = get_optional("ngram_min", c.ngram_min, 1);
  c.ngram_max = get_optional("ngram_max", c.ngram_max, 1);
  c.ngrams_per_token = get_optional("ngrams_per_token", c.ngrams_per_token, 1);
  check(c.ngram_max >= c.ngram_min, "textclf config: 'ngram_max' {} is below 'ngram_min' {}", c.ngram_max, c.ngram_min);
  if (j.contains("bag")) {  // optional: checkpoints made before the bag path have none
    if (!j["bag"].is_boolean()) fail("textclf config: 'bag' must be true or false, got {}", j["bag"].dump());
    c.bag = j["bag"].get<bool>();
  }
  return c;
}

data::NgramSpec ngram_spec(const TextClassifierConfig& c) {
  return {.buckets = c.ngram_buckets, .min_n = c.ngram_min, .max_n = c.ngram_max, .max_per_token = c.ngrams_per_token};
}

// ---- data --------------------------------------------------------------------------------------------

int64_t EncodedSet::tokens() const {
  int64_t n = 0;
  for (const auto& s : ids) n += int64_t(s.size());
  return n;
}

std::vector<int64_t> EncodedSet::lengths() const {
  std::vector<int64_t> n;
  n.reserve(ids.size());
  for (const auto& s : ids) n.push_back(int64_t(s.size()));
  return n;
}

BagTables bag_naive_bayes(const EncodedSet& train, int64_t vocab, int64_t ngram_buckets, int64_t classes,
                          double alpha) {
  check(alpha > 0, "bag_naive_bayes: alpha must be > 0, got {}", alpha);
  check(vocab > 1 && classes > 1 && ngram_buckets >= 0, "bag_naive_bayes: vocab {}, classes {}, n-gram buckets {}",
        vocab, classes, ngram_buckets);
  check(ngram_buckets == 0 || train.has_ngrams(), "bag_naive_bayes: {} n-gram buckets and an encoded set without n-grams",
        ngram_buckets);
  const int64_t K = classes, V = vocab, G = ngram_buckets > 0 ? ngram_buckets + 1 : 0;
  // counts (rows, K) of each family, and their totals per class
  std::vector<double> words(size_t(V * K), 0.0), grams(size_t(G * K), 0.0), word_total(size_t(K), 0.0),
      gram_total(size_t(K), 0.0);
  for (int64_t i = 0; i < train.size(); ++i) {
    const int64_t c = train.labels[size_t(i)];
    check(c >= 0 && c < K, "bag_naive_bayes: text {}'s label {} is not one of {} classes", i, c, K);
    const std::vector<int64_t>& ids = train.ids[size_t(i)];
    for (size_t t = 0; t < ids.size(); ++t) {
      check(ids[t] > 0 && ids[t] < V, "bag_naive_bayes: text {} has token id {} outside [1, {})", i, ids[t], V);
      words[size_t(ids[t] * K + c)] += 1, word_total[size_t(c)] += 1;
      if (G == 0) continue;
      for (int64_t g : train.form_ngrams[size_t(train.forms[size_t(i)][t])]) {
        check(g >= 0 && g < G, "bag_naive_bayes: text {} has n-gram id {} outside [0, {})", i, g, G);
        if (g > 0) grams[size_t(g * K + c)] += 1, gram_total[size_t(c)] += 1;
      }
    }
  }
  auto table = [&](const std::vector<double>& count, const std::vector<double>& total, int64_t rows) {
    std::vector<float> w(size_t(rows * K), 0.f);  // row 0: padding
    std::vector<double> logp(static_cast<size_t>(K));
    for (int64_t r = 1; r < rows; ++r) {
      double mean = 0;
      for (int64_t c = 0; c < K; ++c) {
        const double theta = (count[size_t(r * K + c)] + alpha) / (total[size_t(c)] + alpha * double(rows - 1));
        logp[size_t(c)] = std::log(theta);
        mean += logp[size_t(c)] / double(K);
      }
      for (int64_t c = 0; c < K; ++c) w[size_t(r * K + c)] = float(logp[size_t(c)] - mean);
    }
    return w;
  };
  return {K, table(words, word_total, V), G > 0 ? table(grams, gram_total, G) : std::vector<float>{}};
}

double bag_accuracy(const BagTables& t, const EncodedSet& set) {
  check(t.ngrams.empty() || set.has_ngrams(), "bag_accuracy: tables with n-grams and a set without");
  const auto K = size_t(t.classes);
  int64_t right = 0;
  std::vector<double> score(K);
  for (int64_t i = 0; i < set.size(); ++i) {
    std::fill(score.begin(), score.end(), 0.0);
    const std::vector<int64_t>& ids = set.ids[size_t(i)];
    for (size_t n = 0; n < ids.size(); ++n) {
      for (size_t c = 0; c < K; ++c) score[c] += t.words.at(size_t(ids[n]) * K + c);
      if (!t.ngrams.empty())
        for (int64_t g : set.form_ngrams[size_t(set.forms[size_t(i)][n])])
          for (size_t c = 0; c < K; ++c) score[c] += t.ngrams.at(size_t(g) * K + c);
    }
    // the first class of the highest score (the mean over the length has the same argmax)
    right += int64_t(std::max_element(score.begin(), score.end()) - score.begin()) == set.labels[size_t(i)];
  }
  return set.size() > 0 ? double(right) / double(set.size()) : 0.0;
}

void init_bag_from_naive_bayes(TextClassifier& model, const BagTables& t) {
  check(model.bag_tok != nullptr, "init_bag_from_naive_bayes: the model has no bag path (config bag false)");
  const int64_t K = model.cfg.classes, V = model.cfg.vocab, G = model.bag_ngram ? model.cfg.ngram_buckets + 1 : 0;
  check(t.classes == K && int64_t(t.words.size()) == V * K && int64_t(t.ngrams.size()) == G * K,
        "init_bag_from_naive_bayes: tables of {} classes, {} word and {} n-gram values for a model of {} classes, "
        "vocab {} and {} n-gram rows",
        t.classes, t.words.size(), t.ngrams.size(), K, V, G);
  NoGradGuard no_grad;
  model.bag_tok->weight.copy_(from_vector(t.words, {V, K}, model.bag_tok->weight.device()));
  if (model.bag_ngram) model.bag_ngram->weight.copy_(from_vector(t.ngrams, {G, K}, model.bag_ngram->weight.device()));
}

EncodedSet encode_dataset(const data::TextDataset& ds, const TextTokenizer& tok, int64_t max_len,
                          const data::NgramSpec& ngrams) {
  const bool with_ngrams = ngrams.buckets > 0;
  check(!with_ngrams || tok.kind() == TextTokenizer::Kind::word_level,
        "textclf encode_dataset: subword n-grams ({} buckets) need the word tokenizer, not the {} one", ngrams.buckets,
        tok.kind_name());
  EncodedSet set;
  set.ids.reserve(ds.examples.size());
  set.labels.reserve(ds.examples.size());
  std::unordered_map<std::string, int32_t> form_row;  // token string -> row of set.form_ngrams
  if (with_ngrams) set.form_ngrams.emplace_back();    // row 0: no n-grams
  for (const auto& ex : ds.examples) {
    std::vector<int64_t> ids = tok.encode(ex.text, max_len);
    if (with_ngrams) {
      std::vector<int32_t> forms;
      for (std::string& w : tok.pieces(ex.text, max_len)) {
        auto [it, fresh] = form_row.try_emplace(std::move(w), int32_t(set.form_ngrams.size()));
        if (fresh) set.form_ngrams.push_back(data::hashed_ngrams(it->first, ngrams));
        forms.push_back(it->second);
      }
      if (forms.empty()) forms.push_back(0);
      set.forms.push_back(std::move(forms));
    }
    if (ids.empty()) ids.push_back(1);  // nothing the vocabulary knows: one <unk> (a length of 0 cannot be pooled)
    set.ids.push_back(std::move(ids));
    set.labels.push_back(ex.label);
  }
  return set;
}

nlohmann::json data_to_json(const DataOptions& d) {
  return {{"dataset", d.dataset},     {"root", d.root},           {"tsv_file", d.tsv_file},
          {"tsv_test", d.tsv_test},   {"split_seed", d.split_seed}, {"tokenizer", d.tokenizer},
          {"max_len", d.max_len},     {"min_freq", d.min_freq},   {"max_words", d.max_words},
          {"layout", d.layout}};
}

DataOptions data_from_json(const nlohmann::json& j) {
  auto bad = [&](const std::string& why) {
    return Error(fmt::format("textclf config: malformed data entry {}: {}", j.dump(), why));
  };
  if (!j.is_object()) throw bad("expected a JSON object");
  auto entry = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw bad(fmt::format("'{}' is missing", key));
    return j[key];
  };
  auto text = [&](const char* key) {
    const nlohmann::json& v = entry(key);
    if (!v.is_string()) throw bad(fmt::format("'{}' must be a string, got {}", key, v.dump()));
    return v.get<std::string>();
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    const nlohmann::json& v = entry(key);
    if (!json_integer_in(v, lo, hi))
      throw bad(fmt::format("'{}' must be an integer in [{}, {}], got {}", key, lo, hi, v.dump()));
    return v.get<int64_t>();
  };
  DataOptions d;
  d.dataset = text("dataset");
  d.root = text("root");
  d.tsv_file = text("tsv_file");
  d.tsv_test = text("tsv_test");
  const nlohmann::json& seed = entry("split_seed");  // any uint64_t
  if (!seed.is_number_unsigned() && !json_integer_in(seed, 0, std::numeric_limits<int64_t>::max()))
    throw bad(fmt::format("'split_seed' must be an integer >= 0, got {}", seed.dump()));
  d.split_seed = seed.get<uint64_t>();
  d.tokenizer = text("tokenizer");
  d.max_len = integer("max_len", 1, kMaxTextLen);
  d.min_freq = int(integer("min_freq", 1, std::numeric_limits<int>::max()));
  d.max_words = int(integer("max_words", 3, std::numeric_limits<int>::max()));
  if (j.contains("layout")) {  // absent in checkpoints made before it: off
    if (!j["layout"].is_boolean()) throw bad(fmt::format("'layout' must be true or false, got {}", j["layout"].dump()));
    d.layout = j["layout"].get<bool>();
  }
  return d;
}

std::pair<int64_t, int64_t> parse_ngram_range(const std::string& text) {
  const char *first = text.data(), *last = first + text.size();
  const char* dash = std::find(first, last, '-');
  int64_t lo_n = 0, hi_n = 0;
  const auto lo = std::from_chars(first, dash, lo_n);
  const auto hi =
      dash == last ? std::from_chars_result{last, std::errc::invalid_argument} : std::from_chars(dash + 1, last, hi_n);
  usage_check(lo.ec == std::errc() && lo.ptr == dash && hi.ec == std::errc() && hi.ptr == last,
              "textclf: --ngrams '{}' is not MIN-MAX (e.g. 2-5)", text);
  usage_check(lo_n >= 1 && hi_n >= lo_n && hi_n <= 64, "textclf: --ngrams {}: expected 1 <= MIN <= MAX <= 64", text);
  return {lo_n, hi_n};
}

void validate_config(const DataOptions& d, const TextClassifierConfig& mc, const TrainSettings& t) {
  usage_check(d.max_len >= 1 && d.max_len <= kMaxTextLen, "textclf: --max-len {}: expected 1..{} tokens per text",
              d.max_len, kMaxTextLen);
  usage_check(d.min_freq >= 1, "textclf: --min-freq {}: expected at least 1", d.min_freq);
  usage_check(d.max_words >= 3, "textclf: --max-words {}: expected at least 3 (<pad>, <unk> and one word)",
              d.max_words);
  usage_check(d.dataset == "tsv" || (d.tsv_file.empty() && d.tsv_test.empty()),
              "textclf: --tsv-file/--tsv-test '{}{}' need --dataset tsv (not {})", d.tsv_file,
              d.tsv_test.empty() ? "" : "', '" + d.tsv_test, d.dataset);
  usage_check(d.dataset == "fortunes" || d.dataset == "imdb" || d.dataset == "tsv",
              "textclf: --dataset {}: expected fortunes, imdb or tsv", d.dataset);
  usage_check(d.tokenizer == "auto" || d.tokenizer == "char" || d.tokenizer == "word",
              "textclf: --tokenizer {}: expected char, word or auto", d.tokenizer);
  usage_check(mc.d_model >= 1 && mc.n_heads >= 1 && mc.n_layers >= 1 && mc.mlp_hidden >= 1,
              "textclf: --d-model {}, --heads {}, --layers {}, --mlp {}: every size must be at least 1", mc.d_model,
              mc.n_heads, mc.n_layers, mc.mlp_hidden);
  usage_check(mc.d_model % mc.n_heads == 0,
              "textclf: --heads {} does not divide --d-model {} (each head gets d-model/heads)", mc.n_heads,
              mc.d_model);
  usage_check(t.label_smoothing >= 0 && t.label_smoothing < 1, "textclf: --label-smoothing {}: expected [0, 1)",
              t.label_smoothing);
  usage_check(t.word_dropout >= 0 && t.word_dropout <= 0.9, "textclf: --word-dropout {}: expected [0, 0.9]",
              t.word_dropout);
  usage_check(t.bucket_window >= 1, "textclf: --bucket-window {}: expected at least 1 (1: no bucketing)",
              t.bucket_window);
  usage_check(t.eval_samples >= 0, "textclf: --eval-samples {}: expected >= 0 (0: all)", t.eval_samples);
  usage_check(t.eval_batch_tokens >= 1, "textclf: --eval-batch-tokens {}: expected at least 1", t.eval_batch_tokens);
  usage_check(t.ngram_buckets == -1 || (t.ngram_buckets >= 0 && t.ngram_buckets <= (int64_t(1) << 26)),
              "textclf: --ngram-buckets {}: expected 0..{} (0: off)", t.ngram_buckets, int64_t(1) << 26);
  const std::string tok = resolve_tokenizer(d);
  usage_check(t.ngram_buckets <= 0 || tok != "char",
              "textclf: --ngram-buckets {}: subword n-grams need the word tokenizer (this run uses {}); pass "
              "--ngram-buckets 0 or leave it out",
              t.ngram_buckets, tok);
  usage_check(!d.layout || tok != "char",
              "textclf: --layout-tokens: newline and tab tokens need the word tokenizer (this run uses {})", tok);
  parse_ngram_range(t.ngram_range);
  usage_check(mc.ngrams_per_token >= 1, "textclf: --ngrams-per-token {}: expected at least 1", mc.ngrams_per_token);
  usage_check(t.nb_alpha > 0 && std::isfinite(t.nb_alpha), "textclf: --nb-alpha {}: expected a finite value > 0",
              t.nb_alpha);
}

std::string resolve_tokenizer(const DataOptions& d) {
  check(d.dataset == "fortunes" || d.dataset == "imdb" || d.dataset == "tsv",
        "textclf: unknown dataset '{}' (expected fortunes, imdb or tsv)", d.dataset);
  if (d.tokenizer == "auto") return d.dataset == "tsv" ? "" : "word";
  check(d.tokenizer == "char" || d.tokenizer == "word", "textclf: unknown tokenizer '{}' (expected char, word or auto)",
        d.tokenizer);
  return d.tokenizer;
}

std::string choose_tsv_tokenizer(const std::vector<std::string>& texts, std::string* why) {
  int64_t worded = 0, words = 0, word_bytes = 0;
  for (const std::string& t : texts) {
    int64_t n = 0;
    for (size_t i = 0; i < t.size();) {
      while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
      const size_t start = i;
      while (i < t.size() && !std::isspace(static_cast<unsigned char>(t[i]))) ++i;
      if (i > start) ++n, word_bytes += int64_t(i - start);
    }
    words += n, worded += n >= 3;
  }
  const double share = texts.empty() ? 0 : double(worded) / double(texts.size());
  const double mean_len = words > 0 ? double(word_bytes) / double(words) : 0;
  const bool natural = share >= 0.8 && mean_len <= 20;
  if (why)
    *why = fmt::format("--tokenizer {}: {:.0f}% of the {} training texts hold 3 or more words, {:.1f} bytes long on "
                       "average: {}",
                       natural ? "word" : "char", 100 * share, texts.size(), mean_len,
                       natural ? "natural language written with spaces" : "not text of words separated by spaces");
  return natural ? "word" : "char";
}

std::string missing_data(const DataOptions& d) {
  std::error_code ec;
  if (d.dataset == "fortunes") {
    const std::string root = d.root.empty() ? data::kFortuneRoot : d.root;
    std::vector<std::string> missing = missing_fortune_packages(root);
    if (missing.empty()) return "";
    std::string list;
    for (const auto& p : missing) list += (list.empty() ? "" : " ") + p;
    return fmt::format("the fortunes under {} lack the Debian packages {}: install them with\n  sudo apt-get install {}",
                       root, list, list);
  }
  if (d.dataset == "imdb") {
    for (const char* part : {"train/pos", "train/neg", "test/pos", "test/neg"})
      if (!fs::is_directory(fs::path(d.root) / part, ec))
        return fmt::format("no aclImdb folder at '{}' (missing {}/): download aclImdb_v1.tar.gz from "
                           "https://ai.stanford.edu/~amaas/data/sentiment/, unpack it and pass --data-dir <path>/aclImdb",
                           d.root, part);
    return "";
  }
  if (d.dataset == "tsv") {
    if (d.tsv_file.empty()) return "--dataset tsv needs --tsv-file <label<TAB>text file>";
    for (const std::string& f : {d.tsv_file, d.tsv_test})
      if (!f.empty() && !fs::is_regular_file(f, ec)) return fmt::format("no TSV file at '{}'", f);
    return "";
  }
  return fmt::format("unknown dataset '{}' (expected fortunes, imdb or tsv)", d.dataset);
}

data::TextSplit load_split(const DataOptions& d) {
  // validation_size's count of the `n` texts of `file`, as the fraction split_dataset takes
  auto validation = [](int64_t n, const std::string& file) {
    return double(validation_size(-1, n, fmt::format("textclf: {}: a validation split of", file))) / double(n);
  };
  data::TextDataset train, test;
  if (d.dataset == "fortunes") {
    const std::string root = d.root.empty() ? data::kFortuneRoot : d.root;
    train = data::load_fortunes(root);
    return data::split_dataset(train, d.split_seed, validation(train.size(), root), 0.1);
  }
  if (d.dataset == "imdb") {
    train = data::load_imdb(d.root, "train");
    test = data::load_imdb(d.root, "test");
  } else if (d.dataset == "tsv") {
    train = data::load_tsv(d.tsv_file);
    if (d.tsv_test.empty()) return data::split_dataset(train, d.split_seed, validation(train.size(), d.tsv_file), 0.1);
    test = data::load_tsv(d.tsv_test, train.classes);
  } else {
    throw Error(fmt::format("textclf: unknown dataset '{}' (expected fortunes, imdb or tsv)", d.dataset));
  }
  const std::string& file = d.dataset == "imdb" ? d.root : d.tsv_file;
  data::TextSplit s = data::split_dataset(train, d.split_seed, validation(train.size(), file), 0.0);
  s.test = std::move(test);
  return s;
}

std::vector<std::string> missing_fortune_packages(const std::string& root) {
  std::vector<std::string> missing;
  for (const data::FortuneSource& src : data::fortune_sources()) {
    std::error_code ec;
    if (fs::exists(fs::path(root) / src.path, ec)) continue;
    if (std::find(missing.begin(), missing.end(), src.package) == missing.end()) missing.push_back(src.package);
  }
  return missing;
}

Batch make_batch(const EncodedSet& set, std::span<const int64_t> indices, int64_t max_len, const WordDropout& drop) {
  check(drop.p >= 0 && drop.p < 1, "textclf make_batch: word dropout {} outside [0, 1)", drop.p);
  std::vector<std::vector<int64_t>> seqs;
  std::vector<std::vector<int32_t>> forms;  // with n-grams: each kept token's form
  std::vector<int64_t> labels;
  seqs.reserve(indices.size());
  labels.reserve(indices.size());
  // a token is kept when its draw, uniform in [0, 2^24), is at least p 2^24
  const auto threshold = uint64_t(std::ceil(drop.p * double(kWordDropoutDraws)));
  for (size_t r = 0; r < indices.size(); ++r) {
    const int64_t i = indices[r];
    check(i >= 0 && i < set.size(), "textclf make_batch: index {} outside [0, {})", i, set.size());
    const std::vector<int64_t>& ids = set.ids[size_t(i)];
    const std::vector<int32_t>* f = set.has_ngrams() ? &set.forms[size_t(i)] : nullptr;
    const uint64_t text = uint64_t(drop.first) + r;  // the text's place in the global batch
    std::vector<int64_t> s;
    std::vector<int32_t> sf;
    s.reserve(ids.size());
    for (size_t t = 0; t < ids.size(); ++t)
      if (threshold == 0 || data::philox_below(drop.seed, kWordDropoutStream + uint64_t(drop.step),
                                               text * uint64_t(kMaxTextLen) + t, kWordDropoutDraws) >= threshold) {
        s.push_back(ids[t]);
        if (f) sf.push_back((*f)[t]);
      }
    if (s.empty()) {  // a text never becomes empty: one whose every token would go keeps them all
      s = ids;
      if (f) sf = *f;
    }
    seqs.push_back(std::move(s));
    if (f) forms.push_back(std::move(sf));
    labels.push_back(set.labels[size_t(i)]);
  }
  data::PaddedBatch p = data::pad_batch(seqs, 0, max_len);
  Batch b;
  b.tokens = p.tokens;
  b.lengths = p.lengths;
  b.labels = from_vector(labels, {int64_t(labels.size())});
  for (const auto& s : seqs) b.num_tokens += std::min<int64_t>(int64_t(s.size()), max_len);
  if (set.has_ngrams()) {
    // (B, T, G): token t of text b gets its form's n-gram ids, the rest of the row stays 0
    const auto B = int64_t(indices.size()), T = p.tokens.size(1);
    int64_t G = 1;
    for (const auto& fr : forms)
      for (int32_t f : fr) G = std::max(G, int64_t(set.form_ngrams[size_t(f)].size()));
    std::vector<int64_t> ng(size_t(B * T * G), 0);
    for (int64_t r = 0; r < B; ++r) {
      const std::vector<int32_t>& fr = forms[size_t(r)];
      for (int64_t t = 0; t < std::min(T, int64_t(fr.size())); ++t) {
        const std::vector<int64_t>& g = set.form_ngrams[size_t(fr[size_t(t)])];
        std::copy(g.begin(), g.end(), ng.begin() + (r * T + t) * G);
      }
    }
    b.ngrams = from_vector(ng, {B, T, G});
  }
  return b;
}

BucketSampler::BucketSampler(std::vector<int64_t> lengths, int64_t batch_size, int64_t window, uint64_t seed)
    : lengths_(std::move(lengths)), batch_size_(batch_size), window_(window), seed_(seed) {
  check(batch_size > 0 && window > 0, "BucketSampler: batch size {} and window {} must be > 0", batch_size, window);
  check(int64_t(lengths_.size()) >= batch_size, "BucketSampler: {} texts are fewer than one batch of {}",
        lengths_.size(), batch_size);
  num_batches_ = int64_t(lengths_.size()) / batch_size;
}

std::vector<std::vector<int64_t>> BucketSampler::epoch_batches(uint64_t epoch) const {
  const int64_t n = int64_t(lengths_.size());
  std::vector<int64_t> order = data::epoch_permutation(n, seed_, epoch);
  const int64_t span = window_ * batch_size_;
  for (int64_t w = 0; w < n; w += span) {
    auto first = order.begin() + w, last = order.begin() + std::min(n, w + span);
    std::stable_sort(first, last, [&](int64_t a, int64_t b) { return lengths_[size_t(a)] < lengths_[size_t(b)]; });
  }
  std::vector<std::vector<int64_t>> batches(static_cast<size_t>(num_batches_));
  for (int64_t b = 0; b < num_batches_; ++b)
    batches[size_t(b)].assign(order.begin() + b * batch_size_, order.begin() + (b + 1) * batch_size_);
  // Fisher-Yates over the batches: i = k-1 down to 1 swaps batch i with batch j, j uniform in [0, i].
  for (int64_t i = num_batches_ - 1; i > 0; --i) {
    const auto j = int64_t(data::philox_below(seed_, 1 + epoch, uint64_t(i), uint64_t(i + 1)));
    std::swap(batches[size_t(i)], batches[size_t(j)]);
  }
  return batches;
}

std::vector<int64_t> BucketSampler::batch(int64_t step) const {
  check(step >= 0, "BucketSampler: step {} must be >= 0", step);
  const int64_t epoch = step / num_batches_;
  std::lock_guard lock(mu_);
  if (epoch != cached_epoch_) {
    cached_ = epoch_batches(uint64_t(epoch));
    cached_epoch_ = epoch;
  }
  return cached_[size_t(step % num_batches_)];
}

std::unique_ptr<data::DataLoader<Batch>> make_train_loader(const EncodedSet& set, const BucketSampler& sampler,
                                                           int64_t steps, int64_t max_len, int prefetch,
                                                           int shard_rank, int shard_count, WordDropout drop) {
  check(steps > 0, "textclf make_train_loader: steps must be > 0, got {}", steps);
  data::LoaderOptions o;
  o.batch_size = 1;
  o.shuffle = false;
  o.prefetch = prefetch;
  return std::make_unique<data::DataLoader<Batch>>(
      steps, o, [&set, &sampler, max_len, shard_rank, shard_count, drop](std::span<const int64_t> s) {
        const std::vector<int64_t> idx = sampler.batch(s[0]);  // the global batch of step s[0]
        const data::Range mine = data::shard(int64_t(idx.size()), shard_rank, shard_count);
        WordDropout d = drop;
        d.step = s[0], d.first = mine.begin;
        return make_batch(set, std::span<const int64_t>(idx).subspan(size_t(mine.begin), size_t(mine.size())),
                          max_len, d);
      });
}

// ---- training and evaluation --------------------------------------------------------------------

double forward_backward(TextClassifier& model, optim::Optimizer& opt, const Batch& b, double label_smoothing,
                        double loss_scale) {
  model.train();
  const Tensor logits = model.forward(b.tokens, b.lengths, b.ngrams);  // (B, K)
  const Tensor loss = cross_entropy(logits, b.labels.to(logits.device()), "mean", -100, label_smoothing);
  return compute_gradients(opt, loss, loss_scale);
}

EvalResult evaluate(TextClassifier& model, const EncodedSet& set, const std::vector<std::string>& classes,
                    int64_t batch_tokens, int64_t limit, bool sharded) {
  check(batch_tokens > 0, "textclf evaluate: batch_tokens must be > 0, got {}", batch_tokens);
  EvalResult r(classes);
  const int64_t n = limit > 0 ? std::min(limit, set.size()) : set.size();
  if (n == 0) {
    r.loss = r.accuracy = std::numeric_limits<double>::quiet_NaN();
    return r;
  }
  // longest first: each batch pads to its first text, and similar lengths pad little
  std::vector<int64_t> sorted(static_cast<size_t>(n));
  std::iota(sorted.begin(), sorted.end(), int64_t(0));
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](int64_t a, int64_t b) { return set.ids[size_t(a)].size() > set.ids[size_t(b)].size(); });
  // this rank's part, still longest first (all of it unless sharded)
  std::vector<int64_t> order;
  for (int64_t i : sharded ? eval_part(n, dist::rank(), dist::world_size()) : eval_part(n, 0, 1))
    order.push_back(sorted[size_t(i)]);
  const int64_t m = int64_t(order.size());
  r.predicted.assign(size_t(n), -1);
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  std::vector<double> loss_sum = {0.0};
  for (int64_t begin = 0; begin < m;) {
    const int64_t T = int64_t(set.ids[size_t(order[size_t(begin)])].size());
    const int64_t count = std::clamp<int64_t>(batch_tokens / std::max<int64_t>(T, 1), 1, m - begin);
    std::span<const int64_t> idx(order.data() + begin, size_t(count));
    Batch b = make_batch(set, idx, model.cfg.max_len);
    Tensor logits = model.forward(b.tokens, b.lengths, b.ngrams);
    loss_sum[0] += cross_entropy(logits, b.labels.to(logits.device()), "sum").item<double>();
    std::vector<int64_t> pred = argmax(logits, 1).to_vector<int64_t>();
    std::vector<int64_t> truth = b.labels.to_vector<int64_t>();
    r.confusion.add(truth, pred);
    for (size_t j = 0; j < idx.size(); ++j) r.predicted[size_t(idx[j])] = pred[j];
    begin += count;
  }
  if (sharded && dist::world_size() > 1) {
    // each text was evaluated by one rank: the others hold -1, so the sum of (class + 1) over
    // the ranks is the class + 1
    for (int64_t p : r.predicted) loss_sum.push_back(double(p + 1));
    sum_over_ranks(loss_sum, &r.confusion);
    for (size_t i = 0; i < r.predicted.size(); ++i) r.predicted[i] = int64_t(loss_sum[1 + i]) - 1;
  }
  model.train(was_training);
  r.loss = loss_sum[0] / double(n);
  r.accuracy = r.confusion.accuracy();
  return r;
}

std::string errors_tsv(const data::TextDataset& ds, const std::vector<int64_t>& model,
                       const std::vector<int64_t>* baseline, std::array<int64_t, 3>* counts) {
  const size_t n = ds.examples.size();
  check(model.size() == n, "errors_tsv: {} model predictions for {} texts", model.size(), n);
  check(!baseline || baseline->size() == n, "errors_tsv: {} baseline predictions for {} texts",
        baseline ? baseline->size() : 0, n);
  auto name = [&](int64_t c) {
    check(c >= 0 && c < int64_t(ds.classes.size()), "errors_tsv: class {} outside [0, {})", c, ds.classes.size());
    return ds.classes[size_t(c)];
  };
  std::array<int64_t, 3> k{0, 0, 0};
  std::string out = "index\ttrue\tmodel\tbaseline\ttext\n";
  for (size_t i = 0; i < n; ++i) {
    const data::TextExample& ex = ds.examples[i];
    const bool model_wrong = model[i] != ex.label, baseline_wrong = baseline && (*baseline)[i] != ex.label;
    if (!model_wrong && !baseline_wrong) continue;
    k[0] += model_wrong, k[1] += baseline_wrong, k[2] += model_wrong && baseline_wrong;
    out += fmt::format("{}\t{}\t{}\t{}\t", i, name(ex.label), name(model[i]), baseline ? name((*baseline)[i]) : "-");
    for (char c : ex.text) {
      switch (c) {
        case '\t': out += "\\t"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\\': out += "\\\\"; break;
        default: out += c;
      }
    }
    out += '\n';
  }
  if (counts) *counts = k;
  return out;
}

std::vector<Heatmap> attention_heatmaps(TextClassifier& model, const TextTokenizer& tok, const EncodedSet& set,
                                        int64_t i, int64_t* predicted) {
  check(i >= 0 && i < set.size(), "textclf attention_heatmaps: text {} outside [0, {})", i, set.size());
  const std::vector<int64_t>& ids = set.ids[size_t(i)];
  check(!ids.empty() && int64_t(ids.size()) <= model.cfg.max_len,
        "textclf attention_heatmaps: expected 1..{} tokens, got {}", model.cfg.max_len, ids.size());
  const bool was_training = model.is_training(), had_weights = model.need_weights;
  model.eval();
  model.need_weights = true;
  NoGradGuard no_grad;
  const std::vector<int64_t> one{i};
  Batch b = make_batch(set, one, model.cfg.max_len);
  Tensor logits = model.forward(b.tokens, b.lengths, b.ngrams);
  if (predicted) *predicted = argmax(logits, 1).to_vector<int64_t>()[0];
  std::vector<std::string> labels;
  for (int64_t id : ids) labels.push_back(tok.label(id));
  std::vector<Heatmap> panels;
  for (size_t l = 0; l < model.blocks->size(); ++l) {
    const Tensor& w = (*model.blocks)[l].attn_weights;  // (1, H, T, T)
    check(w.defined() && w.ndim() == 4, "textclf attention_heatmaps: block {} kept no attention weights", l);
    for (int64_t h = 0; h < w.size(1); ++h)
      panels.push_back(heatmap_from_tensor(w.select(0, 0).select(0, h), fmt::format("layer {}, head {}", l, h),
                                           labels, labels));
  }
  model.need_weights = had_weights;
  for (size_t l = 0; l < model.blocks->size(); ++l) (*model.blocks)[l].attn_weights = Tensor();
  model.train(was_training);
  return panels;
}

int64_t pick_heatmap_sample(const EncodedSet& set, int64_t lo, int64_t hi) {
  int64_t shortest = -1;
  for (int64_t i = 0; i < set.size(); ++i) {
    const auto len = int64_t(set.ids[size_t(i)].size());
    if (len >= lo && len <= hi) return i;
    if (shortest < 0 || len < int64_t(set.ids[size_t(shortest)].size())) shortest = i;
  }
  return shortest;
}

// ---- naive Bayes ---------------------------------------------------------------------------------

namespace {

// Byte offsets where each codepoint of valid UTF-8 starts, plus the end.
std::vector<size_t> codepoint_starts(std::string_view s) {
  std::vector<size_t> starts;
  starts.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

}  // namespace

std::vector<uint64_t> CharNgramNB::ngrams(std::string_view text) const {
  std::vector<size_t> starts = codepoint_starts(text);
  const size_t cps = starts.size() - 1;
  std::vector<uint64_t> out;
  for (int n = o_.min_n; n <= o_.max_n; ++n)
    for (size_t i = 0; i + size_t(n) <= cps; ++i)
      out.push_back(data::fnv1a64(text.substr(starts[i], starts[i + size_t(n)] - starts[i])));
  return out;
}

void CharNgramNB::fit(const data::TextDataset& train) {
  check(o_.min_n >= 1 && o_.max_n >= o_.min_n, "CharNgramNB: n-gram range [{}, {}] is empty or starts below 1",
        o_.min_n, o_.max_n);
  check(o_.alpha > 0, "CharNgramNB: alpha must be > 0, got {}", o_.alpha);
  check(train.size() > 0 && train.num_classes() > 0, "CharNgramNB: the training set is empty");
  classes_ = train.classes;
  const size_t K = classes_.size();
  id_.clear();
  counts_.clear();
  total_.assign(K, 0.0);
  std::vector<double> docs(K, 0.0);
  for (const auto& ex : train.examples) {
    docs[size_t(ex.label)] += 1;
    for (uint64_t g : ngrams(ex.text)) {
      auto [it, fresh] = id_.try_emplace(g, uint32_t(id_.size()));
      if (fresh) counts_.resize(counts_.size() + K, 0);
      counts_[size_t(it->second) * K + size_t(ex.label)] += 1;
      total_[size_t(ex.label)] += 1;
    }
  }
  log_prior_.resize(K);
  for (size_t c = 0; c < K; ++c)
    log_prior_[c] = docs[c] > 0 ? std::log(docs[c] / double(train.size())) : -std::numeric_limits<double>::infinity();
}

void CharNgramNB::set_alpha(double alpha) {
  check(alpha > 0, "CharNgramNB: alpha must be > 0, got {}", alpha);
  o_.alpha = alpha;
}

std::vector<double> CharNgramNB::log_posterior(std::string_view text) const {
  check(!classes_.empty(), "CharNgramNB: log_posterior before fit");
  const size_t K = classes_.size();
  const double V = double(id_.size()), a = o_.alpha, log_a = std::log(a);
  // sum_g log(count_c(g) + alpha) = m log(alpha) + sum over nonzero counts of log(1 + count / alpha)
  std::vector<double> score(K, 0.0);
  double m = 0;  // n-grams of the text that training saw
  for (uint64_t g : ngrams(text)) {
    auto it = id_.find(g);
    if (it == id_.end()) continue;
    m += 1;
    const uint32_t* row = counts_.data() + size_t(it->second) * K;
    for (size_t c = 0; c < K; ++c)
      if (row[c]) score[c] += std::log1p(double(row[c]) / a);
  }
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < K; ++c) {
    score[c] += log_prior_[c] + m * (log_a - std::log(total_[c] + a * V));
    mx = std::max(mx, score[c]);
  }
  double z = 0;
  for (double s : score) z += std::exp(s - mx);
  const double log_z = mx + std::log(z);
  for (double& s : score) s -= log_z;
  return score;
}

int CharNgramNB::predict(std::string_view text) const {
  std::vector<double> lp = log_posterior(text);
  return int(std::max_element(lp.begin(), lp.end()) - lp.begin());
}

EvalResult CharNgramNB::evaluate(const data::TextDataset& ds) const {
  check(ds.classes == classes_, "CharNgramNB: the evaluation set's {} classes differ from the training set's {}",
        ds.classes.size(), classes_.size());
  EvalResult r(classes_);
  double nll = 0;
  for (const auto& ex : ds.examples) {
    std::vector<double> lp = log_posterior(ex.text);
    nll -= lp[size_t(ex.label)];
    r.predicted.push_back(int64_t(std::max_element(lp.begin(), lp.end()) - lp.begin()));
    r.confusion.add(ex.label, r.predicted.back());
  }
  r.accuracy = r.confusion.accuracy();
  r.loss = ds.size() ? nll / double(ds.size()) : std::numeric_limits<double>::quiet_NaN();
  return r;
}

// ---- the run ----------------------------------------------------------------------------------

TextData load_text_data(DataOptions& d, TextClassifierConfig& mc, const TrainSettings& s, const std::string& data_dir,
                        const TextTokenizer* saved, std::vector<std::string>* chosen) {
  if (!data_dir.empty()) d.root = data_dir;
  if (d.dataset == "imdb" && d.root.empty()) d.root = "aclImdb";
  if (const std::string missing = missing_data(d); !missing.empty()) throw data::DatasetNotFound(missing);
  double t0 = now_seconds();
  TextData data;
  data.split = load_split(d);
  const data::TextSplit& split = data.split;
  fmt::print(stderr, "data: {} with {} classes ({}): {} train, {} validation, {} test texts ({:.1f} s)\n", d.dataset,
             data.classes().size(), fmt::join(data.classes(), " "), split.train.size(), split.valid.size(),
             split.test.size(), seconds_since(t0));
  for (const auto& skipped : split.train.skipped) fmt::print(stderr, "  skipped {}\n", skipped);

  t0 = now_seconds();
  if (saved) {
    data.tok = *saved;
  } else {
    std::vector<std::string> texts;
    for (const auto& ex : split.train.examples) texts.push_back(ex.text);
    if (d.tokenizer == "auto" && d.dataset == "tsv") {
      std::string why;
      d.tokenizer = choose_tsv_tokenizer(texts, &why);
      if (chosen) chosen->push_back(why);
      validate_config(d, mc, s);  // --ngram-buckets and --layout-tokens need words: checked now the kind is known
    }
    const std::string kind = resolve_tokenizer(d);
    data.tok = kind == "char" ? TextTokenizer::build_char(texts)
                              : TextTokenizer::build_word(texts, d.min_freq, d.max_words, d.layout);
    mc.ngram_buckets = s.ngram_buckets >= 0 ? s.ngram_buckets : kind == "word" ? kWordNgramBuckets : 0;
    std::tie(mc.ngram_min, mc.ngram_max) = parse_ngram_range(s.ngram_range);  // checked by validate_config
  }
  const data::NgramSpec ngrams = ngram_spec(mc);
  data.train = encode_dataset(split.train, data.tok, d.max_len, ngrams);
  data.valid = encode_dataset(split.valid, data.tok, d.max_len, ngrams);
  data.test = encode_dataset(split.test, data.tok, d.max_len, ngrams);
  std::string subwords;
  if (ngrams.buckets > 0)
    subwords = fmt::format("; {}..{}-grams of {} distinct words hashed into {} buckets, at most {} per word",
                           ngrams.min_n, ngrams.max_n, data.train.form_ngrams.size() - 1, ngrams.buckets,
                           ngrams.max_per_token);
  fmt::print(stderr,
             "tokens: {} tokenizer{}, vocabulary {}, max length {}: {:.1f} tokens per training text{} ({:.1f} s)\n",
             data.tok.kind_name(), d.layout ? " with newline and tab tokens" : "", data.tok.vocab_size(), d.max_len,
             double(data.train.tokens()) / double(data.train.size()), subwords, seconds_since(t0));
  return data;
}

BagDecision decide_bag_path(double start, double chars, int64_t n_valid) {
  if (n_valid <= 0) return {};
  const double se = std::sqrt(chars * (1 - chars) / double(n_valid));
  return {.on = start >= chars - kBagTieStandardErrors * se, .standard_error = se};
}

std::vector<std::string> fit_defaults_to_data(RunOptions& o, TextClassifierConfig& mc, TrainSettings& s,
                                              const DataOptions& d, const TextData& data,
                                              std::optional<BagTables>& bag_start) {
  std::vector<std::string> chosen;
  const bool words = data.tok.kind() == TextTokenizer::Kind::word_level;
  const int64_t n = data.train.size(), classes = int64_t(data.classes().size());
  const bool small = n < kSmallTrainSet;
  const std::string size =
      fmt::format("{} training texts{}", n, small ? fmt::format(" (< {}: a small set)", kSmallTrainSet) : "");
  if (small && words && !was_given(o, "--word-dropout")) {
    s.word_dropout = kSmallSetWordDropout;
    chosen.push_back(fmt::format("--word-dropout {}: {}: words left out of the training texts against "
                                 "memorising (--word-dropout 0: off)",
                                 kSmallSetWordDropout, size));
  }
  bag_start.reset();
  if (s.bag_path == "on" || (s.bag_path == "auto" && small && words)) {
    bag_start = bag_naive_bayes(data.train, data.tok.vocab_size(), mc.ngram_buckets, classes, s.nb_alpha);
    if (s.bag_path == "auto") {
      const double start = bag_accuracy(*bag_start, data.valid),
                   chars = fitted_baseline(data.split, s.nb_alpha).evaluate(data.split.valid).accuracy;
      const BagDecision b = decide_bag_path(start, chars, data.valid.size());
      chosen.push_back(fmt::format(
          "--bag-path {}: {}: a linear bag of the words and their n-grams beside the encoder, started as naive "
          "Bayes on them, {:.2f}% on validation against the character n-gram naive Bayes' {:.2f}% ({} {} "
          "standard errors of {:.2f} points){}",
          b.on ? "on" : "off", size, 100 * start, 100 * chars, b.on ? "better, or a tie: within" : "worse by more than",
          kBagTieStandardErrors, 100 * b.standard_error,
          b.on ? " (--bag-path off: the encoder alone)" : " (--bag-path on: it anyway)"));
      if (!b.on) bag_start.reset();
    }
  }
  mc.bag = bag_start.has_value();
  mc.vocab = data.tok.vocab_size();
  mc.max_len = d.max_len;
  mc.classes = classes;
  mc.dropout = was_given(o, "--dropout") ? o.dropout : words ? kWordDropout : 0.0;
  if (!was_given(o, "--dropout"))
    chosen.push_back(words ? fmt::format("--dropout {}: word models with subword n-grams fit their training set, "
                                         "and dropout holds them back",
                                         kWordDropout)
                           : "--dropout 0: character models underfit, dropout would not help");
  if (small && !was_given(o, "--steps")) {
    const int64_t batch = global_batch(o), epochs20 = std::max<int64_t>(1, (20 * n + batch - 1) / batch);
    if (epochs20 < o.steps) {
      chosen.push_back(fmt::format("--steps {}: 20 epochs of {} at batch {} (the default {} would be {:.0f} epochs)",
                                   epochs20, size, batch, o.steps, double(o.steps) * double(batch) / double(n)));
      set_steps(o, epochs20);
    }
  }
  if (const std::string p = resolve_patience(o, small, size); !p.empty()) chosen.push_back(p);
  return chosen;
}

nlohmann::json run_config(const TextClassifierConfig& mc, const DataOptions& d, const TrainSettings& s,
                          const RunOptions& o) {
  nlohmann::json config = {{"model", config_to_json(mc)},           {"data", data_to_json(d)},
                           {"label_smoothing", s.label_smoothing}, {"bucket_window", s.bucket_window},
                           {"batch", global_batch(o)},             {"seed", o.seed}};
  if (s.word_dropout > 0) config["word_dropout"] = s.word_dropout;
  return config;
}

namespace {

// The options whose values --eval-only takes from the checkpoint, and their keys in checked_config.
const std::vector<SavedOption>& saved_options() {
  static const std::vector<SavedOption> options = {
      {"--dataset", "/data/dataset"},       {"--tsv-file", "/data/tsv_file"},       {"--tsv-test", "/data/tsv_test"},
      {"--split-seed", "/data/split_seed"}, {"--tokenizer", "/data/tokenizer"},     {"--max-len", "/data/max_len"},
      {"--min-freq", "/data/min_freq"},     {"--max-words", "/data/max_words"},     {"--layout-tokens", "/data/layout"},
      {"--d-model", "/model/d_model"},      {"--heads", "/model/n_heads"},          {"--layers", "/model/n_layers"},
      {"--mlp", "/model/mlp_hidden"},       {"--ngram-buckets", "/model/ngram_buckets"}, {"--ngrams", "/ngrams"},
      {"--ngrams-per-token", "/model/ngrams_per_token"}};
  return options;
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

SavedRun saved_run(const CheckpointInfo& info, const RunOptions& o, const TextClassifierConfig& mc,
                   const DataOptions& d, const TrainSettings& s) {
  check(info.config.contains("model") && info.config.contains("data"),
        "textclf: '{}' holds no textclf config (model and data)", o.checkpoint);
  check(info.extra.count("tokenizer") > 0, "textclf: '{}' holds no tokenizer", o.checkpoint);
  SavedRun saved;
  saved.model = config_from_json(info.config.at("model"));
  saved.data = data_from_json(info.config.at("data"));
  // the command line's model before the data is read: the n-gram settings as given (buckets -1 is
  // auto, which checked_config reads as the checkpoint's choice)
  TextClassifierConfig given = mc;
  given.ngram_buckets = s.ngram_buckets;
  std::tie(given.ngram_min, given.ngram_max) = parse_ngram_range(s.ngram_range);  // checked by validate_config
  check_eval_only_options(o, checked_config(saved.model, saved.data, saved.model, saved.data),
                          checked_config(given, d, saved.model, saved.data), saved_options(), "textclf");
  saved.tok = TextTokenizer::from_json(info.extra.at("tokenizer"), o.checkpoint + ": tokenizer");
  check(saved.model.vocab == saved.tok.vocab_size(),
        "textclf: '{}': the model's vocabulary {} differs from its tokenizer's {}", o.checkpoint, saved.model.vocab,
        saved.tok.vocab_size());
  return saved;
}

CharNgramNB fitted_baseline(const data::TextSplit& split, double alpha) {
  CharNgramNB nb({.min_n = 1, .max_n = 5, .alpha = alpha});
  nb.fit(split.train);
  return nb;
}

std::pair<EvalResult, EvalResult> naive_bayes_baseline(const data::TextSplit& split, double alpha) {
  const double t0 = now_seconds();
  const CharNgramNB nb = fitted_baseline(split, alpha);
  EvalResult val = nb.evaluate(split.valid), test = nb.evaluate(split.test);
  fmt::print(stderr,
             "baseline: character 1-5-gram naive Bayes (alpha {}, {} n-grams): val {:.2f}%, test {:.2f}% ({:.1f} s)\n",
             alpha, nb.vocabulary(), 100 * val.accuracy, 100 * test.accuracy, seconds_since(t0));
  return {std::move(val), std::move(test)};
}

std::string versus_baseline(const EvalResult& model, const EvalResult& baseline, const std::array<int64_t, 3>& wrong) {
  return fmt::format("test accuracy {:.2f}% vs the naive Bayes baseline's {:.2f}%: {} ({} errors against {}, {} of "
                     "them made by both)\n",
                     100 * model.accuracy, 100 * baseline.accuracy,
                     model.accuracy > baseline.accuracy   ? "the transformer wins"
                     : model.accuracy < baseline.accuracy ? "the baseline wins"
                                                          : "a tie",
                     wrong[0], wrong[1], wrong[2]);
}

void write_attention_svg(TextClassifier& model, const TextData& data, const std::string& path) {
  const int64_t i = pick_heatmap_sample(data.test);
  if (i < 0) return;
  int64_t predicted = -1;
  std::vector<Heatmap> panels = attention_heatmaps(model, data.tok, data.test, i, &predicted);
  HeatmapOptions ho;
  ho.columns = int(model.cfg.n_heads);
  ho.cell = 14;
  ho.title = fmt::format("attention weights (query rows, key columns) of test text {}: true {}, predicted {}", i,
                         data.classes()[size_t(data.test.labels[size_t(i)])], data.classes()[size_t(predicted)]);
  write_file_atomic(path, svg_heatmaps(panels, ho));
}

Batch first_texts(const EncodedSet& set, int64_t batch, int64_t max_len) {
  std::vector<int64_t> indices(size_t(std::clamp<int64_t>(batch, 1, int64_t(set.size()))));
  std::iota(indices.begin(), indices.end(), int64_t(0));
  return make_batch(set, indices, max_len);
}

void diagnose(TextClassifier& model, const EncodedSet& test, int64_t batch, int64_t max_len, const std::string& dir) {
  const Batch b = first_texts(test, batch, max_len);
  std::string path;
  const nn::AttentionReport r =
      write_attention_diagnostics(model, [&] { model.forward(b.tokens, b.lengths, b.ngrams); }, dir, &path);
  fmt::print("attention diagnostics on {} test texts:\n{}written to {}\n", b.labels.size(0), r.to_text(), path);
}

}  // namespace ag::apps::textclf
