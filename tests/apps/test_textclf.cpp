// apps/textclf/lib.h: the naive Bayes baseline against hand-computed posteriors, the
// tokenizer's model ids and its round trip through a checkpoint, the subword n-gram ids of a set
// and a batch, length bucketing (deterministic, a partition, less padding), the prefetching
// loader's resume, the validation split, evaluation, heatmaps, the bag path's naive Bayes start
// (two and three classes, against hand-computed tables), and tiny training runs on a synthetic TSV
// through main's step (forward_backward, Run::optimizer_step) whose accuracy rises (one where only
// the n-grams can tell the classes apart).
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>
#include <span>

#include "apps/common/run.h"
#include "tests/apps/usage_error.h"
#include "apps/textclf/lib.h"
#include "core/parallel.h"
#include "optim/adam.h"
#include "tests/helpers.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::apps::textclf;
using ag::test::TempDir;

namespace {

data::TextDataset tiny_nb_set() {
  data::TextDataset ds;
  ds.classes = {"a", "b"};
  ds.examples = {{"ab", 0}, {"bb", 1}};
  return ds;
}

// Two "languages" over overlapping alphabets: class 0 draws from "abcde", class 1 from "cdefg";
// lengths 6..20. Written as a TSV, the way a user would bring their own data.
std::string synthetic_tsv(int n, uint64_t seed) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int label = i % 2;
    const char* alphabet = label == 0 ? "abcde" : "cdefg";
    const auto len = int64_t(6 + data::philox_below(seed, 0, uint64_t(i), 15));
    out += label == 0 ? "zero\t" : "one\t";
    for (int64_t t = 0; t < len; ++t)
      out += alphabet[data::philox_below(seed, 1 + uint64_t(i), uint64_t(t), 5)];
    out += '\n';
  }
  return out;
}

TextClassifierConfig tiny_config(int64_t vocab, int64_t classes) {
  TextClassifierConfig c;
  c.vocab = vocab, c.max_len = 24, c.classes = classes;
  c.d_model = 16, c.n_heads = 2, c.n_layers = 1, c.mlp_hidden = 32, c.dropout = 0.0;
  return c;
}

// `steps` updates of apps/textclf/main.cpp's training loop on the loader's batches, in a run
// directory `dir`: forward_backward, then Run::optimizer_step (clip to 1.0, AdamW's step), at the
// optimizer's own learning rate (no schedule). Returns the losses.
std::vector<double> train_steps(TextClassifier& model, optim::Optimizer& opt, data::DataLoader<Batch>& loader,
                                int64_t steps, const std::string& dir) {
  RunOptions o;
  o.steps = steps, o.out_dir = dir, o.quiet = true, o.clip = 1.0, o.threads = num_threads();
  apply_run_options(o, "textclf");
  Generator gen(1);
  Run run("textclf", o, model, opt, gen, {});
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    losses.push_back(forward_backward(model, opt, loader.next_step(), 0.0, run.loss_scale()));
    run.optimizer_step(s + 1, losses.back());
  }
  return losses;
}

}  // namespace

TEST_CASE("textclf: naive Bayes posteriors equal the hand computation") {
  // Unigrams, alpha 1. Training: class a "ab" (a:1, b:1, total 2), class b "bb" (b:2, total 2);
  // V = 2 distinct unigrams, priors 1/2 each. theta = (count + 1) / (2 + 1 * 2):
  //   theta_a(a) = 2/4, theta_a(b) = 2/4, theta_b(a) = 1/4, theta_b(b) = 3/4
  //   "a":  P(a) = (1/2) / (1/2 + 1/4) = 2/3
  //   "ab": P(a) = (1/2 * 1/2) / (1/4 + 1/4 * 3/4) = (4/16) / (7/16) = 4/7
  //   "ac": 'c' was never seen and is left out, so as "a": 2/3
  CharNgramNB nb({.min_n = 1, .max_n = 1, .alpha = 1.0});
  nb.fit(tiny_nb_set());
  CHECK(nb.vocabulary() == 2);
  auto p = [&](const char* text) { return std::exp(nb.log_posterior(text)[0]); };
  CHECK(p("a") == doctest::Approx(2.0 / 3.0).epsilon(1e-12));
  CHECK(p("ab") == doctest::Approx(4.0 / 7.0).epsilon(1e-12));
  CHECK(p("ac") == doctest::Approx(2.0 / 3.0).epsilon(1e-12));
  CHECK(std::exp(nb.log_posterior("ab")[1]) == doctest::Approx(3.0 / 7.0).epsilon(1e-12));
  CHECK(nb.predict("b") == 1);  // theta_b(b) = 3/4 > theta_a(b) = 1/2
  // alpha 1/2: theta_a(a) = 1.5 / 3 = 1/2, theta_b(a) = 0.5 / 3 = 1/6 -> P(a | "a") = 3/4
  nb.set_alpha(0.5);
  CHECK(p("a") == doctest::Approx(0.75).epsilon(1e-12));
  // a text of nothing known: the priors
  CHECK(p("zz") == doctest::Approx(0.5).epsilon(1e-12));
}

TEST_CASE("textclf: naive Bayes n-grams are codepoints and the classifier separates scripts") {
  CharNgramNB nb({.min_n = 1, .max_n = 2, .alpha = 0.1});
  // "héllo": 5 codepoints (é is two bytes) -> 5 unigrams + 4 bigrams, "hé" counted once
  CHECK(nb.ngrams("h\xc3\xa9llo").size() == 9);
  CHECK(nb.ngrams("").empty());
  data::TextDataset ds;
  ds.classes = {"latin", "cyrillic"};
  ds.examples = {{"hello world", 0}, {"good morning", 0}, {"\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", 1},
                 {"\xd0\xb4\xd0\xbe\xd0\xb1\xd1\x80\xd0\xbe\xd0\xb5 \xd1\x83\xd1\x82\xd1\x80\xd0\xbe", 1}};
  nb.fit(ds);
  CHECK(nb.predict("word") == 0);
  CHECK(nb.predict("\xd0\xbc\xd0\xb8\xd1\x80") == 1);  // "мир"
  EvalResult r = nb.evaluate(ds);
  CHECK(r.accuracy == 1.0);
  CHECK(r.confusion.at(1, 1) == 2);
  CHECK(r.predicted == std::vector<int64_t>{0, 0, 1, 1});
  double sum = 0;
  for (double lp : nb.log_posterior("world")) sum += std::exp(lp);
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
  AG_CHECK_ERROR(CharNgramNB({.min_n = 3, .max_n = 2}).fit(ds), "CharNgramNB", "[3, 2]");
  AG_CHECK_ERROR(nb.set_alpha(0.0), "CharNgramNB", "alpha");
  data::TextDataset other = ds;
  other.classes = {"x", "y", "z"};
  AG_CHECK_ERROR(nb.evaluate(other), "CharNgramNB", "3 classes differ", "2");
}

TEST_CASE("textclf: char tokenizer ids keep 0 for padding") {
  TextTokenizer tok = TextTokenizer::build_char({"ba", "ab c"});
  // codepoints ' ' a b c -> char ids 1..4 (0 <unk>) -> model ids 2..5 (0 <pad>, 1 <unk>)
  CHECK(tok.vocab_size() == 6);
  CHECK(tok.encode("abc z", 10) == std::vector<int64_t>{3, 4, 5, 2, 1});
  CHECK(tok.encode("abc z", 2) == std::vector<int64_t>{3, 4});
  CHECK(tok.label(0) == "<pad>");
  CHECK(tok.label(1) == "<unk>");
  CHECK(tok.label(2) == "\u2423");
  CHECK(tok.label(4) == "b");
  AG_CHECK_ERROR(tok.label(6), "TextTokenizer", "id 6", "[0, 6)");
  AG_CHECK_ERROR(TextTokenizer::from_json("{\"kind\": \"bpe\", \"tokenizer\": {}}"), "unknown kind 'bpe'");
  AG_CHECK_ERROR(TextTokenizer::from_json("not json"), "textclf tokenizer", "malformed JSON");

  TextTokenizer words = TextTokenizer::build_word({"the cat", "the dog"}, 1, 100);
  // <pad> <unk> the cat dog ("cat" < "dog" among the ties)
  CHECK(words.vocab_size() == 5);
  CHECK(words.encode("The bird, the cat", 4) == std::vector<int64_t>{2, 1, 1, 2});
  CHECK(words.label(3) == "cat");
}

TEST_CASE("textclf: n-gram ids of the encoded set and the batch") {
  // "Der Hund, der Hund!" -> der hund , der hund ! ; "x" ; "" (no tokens: one <unk>, no n-grams)
  data::TextDataset ds;
  ds.classes = {"a", "b"};
  ds.examples = {{"Der Hund, der Hund!", 0}, {"x", 1}, {"", 0}};
  TextTokenizer tok = TextTokenizer::build_word({"der hund der"}, 1, 10);  // <pad> <unk> der hund
  CHECK(tok.pieces("Der Hund, der", 3) == std::vector<std::string>{"der", "hund", ","});
  {  // layout tokens: ids and pieces stay one to one, and the plot label shows the newline
    TextTokenizer lt = TextTokenizer::build_word({"der\nhund\tder"}, 1, 10, /*layout=*/true);
    CHECK(lt.pieces("Der\n\tHund", 9) == std::vector<std::string>{"der", "\n", "\t", "hund"});
    CHECK(lt.encode("Der\n\tHund", 9).size() == 4);
    CHECK(lt.label(lt.encode("\n", 1)[0]) == "\u21b5");
    CHECK(TextTokenizer::from_json(lt.to_json()).encode("a\tb", 9) == lt.encode("a\tb", 9));
  }
  const data::NgramSpec spec{.buckets = 100, .min_n = 2, .max_n = 3, .max_per_token = 6};
  EncodedSet set = encode_dataset(ds, tok, 5, spec);
  REQUIRE(set.has_ngrams());
  CHECK(set.ids[0] == std::vector<int64_t>{2, 3, 1, 2, 3});  // truncated to 5: "!" dropped
  // forms: row 0 = none, then der hund , x in order of first sight; a repeated word shares its row
  CHECK(set.forms[0] == std::vector<int32_t>{1, 2, 3, 1, 2});
  CHECK(set.forms[1] == std::vector<int32_t>{4});
  CHECK(set.forms[2] == std::vector<int32_t>{0});
  REQUIRE(set.form_ngrams.size() == 5);
  CHECK(set.form_ngrams[0].empty());
  CHECK(set.form_ngrams[1] == data::hashed_ngrams("der", spec));  // "<d" "de" "er" "r>" "<de" "der" (6 of 7)
  CHECK(set.form_ngrams[1].size() == 6);
  CHECK(set.form_ngrams[3] == data::hashed_ngrams(",", spec));  // "<," ",>" "<,>"
  // the batch: (B, T, G) with G the most n-grams of a token in it, rows padded with 0
  Batch b = make_batch(set, std::vector<int64_t>{1, 0}, 5);
  REQUIRE(b.ngrams.shape() == Shape{2, 5, 6});
  std::vector<int64_t> ng = b.ngrams.to_vector<int64_t>();
  auto row = [&](int64_t r, int64_t t) { return std::vector<int64_t>(ng.begin() + (r * 5 + t) * 6, ng.begin() + (r * 5 + t + 1) * 6); };
  std::vector<int64_t> x = data::hashed_ngrams("x", spec);  // "<x" "x>" "<x>"
  x.resize(6, 0);
  CHECK(row(0, 0) == x);
  CHECK(row(0, 1) == std::vector<int64_t>(6, 0));  // a padded token
  CHECK(row(1, 3) == data::hashed_ngrams("der", spec));
  CHECK(make_batch(set, std::vector<int64_t>{2}, 5).ngrams.shape() == Shape{1, 1, 1});  // the empty text
  // off: no n-grams anywhere; the char tokenizer cannot have them
  CHECK_FALSE(encode_dataset(ds, tok, 5).has_ngrams());
  CHECK_FALSE(make_batch(encode_dataset(ds, tok, 5), std::vector<int64_t>{0}, 5).ngrams.defined());
  AG_CHECK_ERROR(encode_dataset(ds, TextTokenizer::build_char({"ab"}), 5, spec), "encode_dataset", "100 buckets",
                 "char");
  AG_CHECK_ERROR(TextTokenizer::build_char({"ab"}).pieces("ab", 3), "TextTokenizer::pieces", "char");
}

TEST_CASE("textclf: word dropout leaves out the tokens its draws name, the same on every shard and after a resume") {
  // 200 texts of 20 distinct words each (letters spelling 20 i + t), so that every kept token
  // says where it came from
  data::TextDataset ds;
  ds.classes = {"a", "b"};
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    std::string text;
    for (int t = 0; t < 20; ++t) {
      std::string word = "w";
      for (int k = 20 * i + t; k > 0; k /= 26) word += char('a' + k % 26);
      text += (t ? " " : "") + word;
    }
    texts.push_back(text);
    ds.examples.push_back({text, i % 2});
  }
  ds.examples.push_back({"lonely", 0});  // a one-word text (index 200)
  texts.push_back("lonely");
  const TextTokenizer tok = TextTokenizer::build_word(texts, 1, 100000);
  const data::NgramSpec spec{.buckets = 1000, .min_n = 2, .max_n = 3, .max_per_token = 8};
  const EncodedSet set = encode_dataset(ds, tok, 32, spec);
  std::vector<int64_t> all(200);
  std::iota(all.begin(), all.end(), int64_t(0));
  const std::vector<int64_t> some{7, 3, 150, 42};

  // p = 0 is the batch without dropout, bit for bit
  const Batch plain = make_batch(set, some, 32);
  const Batch off = make_batch(set, some, 32, {.p = 0.0, .seed = 5, .step = 3});
  CHECK(off.tokens.to_vector<int64_t>() == plain.tokens.to_vector<int64_t>());
  CHECK(off.ngrams.to_vector<int64_t>() == plain.ngrams.to_vector<int64_t>());

  // the kept tokens are those whose draw is at least p 2^24, in order, each with its own n-grams
  const WordDropout drop{.p = 0.3, .seed = 5, .step = 3, .first = 0};
  const Batch b = make_batch(set, all, 32, drop);
  const std::vector<int64_t> tokens = b.tokens.to_vector<int64_t>(), lengths = b.lengths.to_vector<int64_t>(),
                             ng = b.ngrams.to_vector<int64_t>();
  const int64_t T = b.tokens.size(1), G = b.ngrams.size(2);
  int64_t dropped = 0;
  for (int64_t r = 0; r < 200; ++r) {
    std::vector<int64_t> expect;
    for (uint64_t t = 0; t < 20; ++t) {
      const bool gone = data::philox_below(5, kWordDropoutStream + 3, uint64_t(r) * uint64_t(kMaxTextLen) + t,
                                           uint64_t(1) << 24) < uint64_t(std::ceil(0.3 * double(1 << 24)));
      if (!gone) expect.push_back(set.ids[size_t(r)][t]);
      dropped += gone;
    }
    REQUIRE(lengths[size_t(r)] == int64_t(expect.size()));
    CHECK(std::vector<int64_t>(tokens.begin() + r * T, tokens.begin() + r * T + lengths[size_t(r)]) == expect);
    for (int64_t t = 0; t < lengths[size_t(r)]; ++t) {  // the n-grams of the word now at position t
      std::vector<int64_t> g = data::hashed_ngrams(tok.pieces(texts[size_t(r)], 32)[size_t(
                                                       std::find(set.ids[size_t(r)].begin(), set.ids[size_t(r)].end(),
                                                                 expect[size_t(t)]) -
                                                       set.ids[size_t(r)].begin())],
                                                   spec);
      g.resize(size_t(G), 0);
      CHECK(std::vector<int64_t>(ng.begin() + (r * T + t) * G, ng.begin() + (r * T + t + 1) * G) == g);
    }
  }
  // 4000 tokens: the share left out is p within 4 standard deviations (sqrt(0.21 / 4000) = 0.0072)
  CHECK(std::abs(double(dropped) / 4000.0 - 0.3) < 0.029);
  CHECK(b.num_tokens == 4000 - dropped);

  // two shards of the batch (data parallel) are the global batch's two halves
  auto rows = [](const Batch& x) {  // each text's tokens, without the padding
    const std::vector<int64_t> tk = x.tokens.to_vector<int64_t>(), ln = x.lengths.to_vector<int64_t>();
    std::vector<std::vector<int64_t>> out;
    for (size_t r = 0; r < ln.size(); ++r)
      out.emplace_back(tk.begin() + int64_t(r) * x.tokens.size(1), tk.begin() + int64_t(r) * x.tokens.size(1) + ln[r]);
    return out;
  };
  std::vector<std::vector<int64_t>> halves = rows(make_batch(set, std::span<const int64_t>(all).first(100), 32, drop));
  WordDropout second = drop;
  second.first = 100;
  for (auto& r : rows(make_batch(set, std::span<const int64_t>(all).subspan(100), 32, second))) halves.push_back(r);
  CHECK(halves == rows(b));
  // another step draws again; a text whose every token would go keeps them all
  WordDropout next = drop;
  next.step = 4;
  CHECK(make_batch(set, all, 32, next).tokens.to_vector<int64_t>() != tokens);
  WordDropout heavy{.p = 0.9, .seed = 5};
  int64_t emptied = 0;
  for (heavy.step = 0; heavy.step < 64; ++heavy.step) {
    const Batch one = make_batch(set, std::vector<int64_t>{200}, 32, heavy);
    CHECK(one.lengths.to_vector<int64_t>() == std::vector<int64_t>{1});
    emptied += data::philox_below(5, kWordDropoutStream + uint64_t(heavy.step), 0, uint64_t(1) << 24) <
               uint64_t(std::ceil(0.9 * double(1 << 24)));
  }
  CHECK(emptied > 40);  // most of the 64 steps would have dropped the only word
  AG_CHECK_ERROR(make_batch(set, some, 32, {.p = 1.0}), "make_batch", "word dropout 1");

  // the loader draws by the step: a resumed loader gives the same batches
  std::vector<int64_t> lens;
  for (const auto& ids : set.ids) lens.push_back(int64_t(ids.size()));
  BucketSampler sampler(lens, 16, 2, 9);
  auto full = make_train_loader(set, sampler, 12, 32, 2, 0, 1, {.p = 0.3, .seed = 11});
  full->seek(0);
  std::vector<std::vector<int64_t>> seen;
  for (int s = 0; s < 12; ++s) seen.push_back(full->next_step().tokens.to_vector<int64_t>());
  auto resumed = make_train_loader(set, sampler, 12, 32, 0, 0, 1, {.p = 0.3, .seed = 11});
  resumed->seek(7);
  for (int s = 7; s < 12; ++s) CHECK(resumed->next_step().tokens.to_vector<int64_t>() == seen[size_t(s)]);
  auto without = make_train_loader(set, sampler, 12, 32, 0);
  without->seek(7);
  CHECK(without->next_step().tokens.to_vector<int64_t>() != seen[7]);
}

TEST_CASE("textclf: tokenizer and config round trip through a checkpoint") {
  TempDir tmp("textclf_ckpt");
  for (int kind : {0, 1, 2}) {  // char, word, word with n-grams
    const bool word = kind > 0;
    std::vector<std::string> texts = {"Hallo Welt!", "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 world"};
    TextTokenizer tok = word ? TextTokenizer::build_word(texts, 1, 50) : TextTokenizer::build_char(texts);
    Generator gen(3);
    TextClassifierConfig cfg = tiny_config(tok.vocab_size(), 3);
    if (kind == 2) cfg.ngram_buckets = 64, cfg.ngram_min = 1, cfg.ngram_max = 4, cfg.ngrams_per_token = 9;
    TextClassifier model(cfg, &gen);
    optim::AdamW opt(model.parameters(), {});
    const std::string path = tmp.file(fmt::format("kind{}.safetensors", kind));
    training::save_checkpoint(path, model, opt, 7, gen,
                        {{"tokenizer", tok.to_json()}, {"config", config_to_json(cfg).dump()}});

    // what --eval-only does: config and tokenizer from the metadata, then the weights
    Generator gen2(99);
    TextClassifier probe(cfg, &gen2);
    training::Checkpoint c = training::load_checkpoint(path, probe, nullptr, nullptr);
    CHECK(c.step == 7);
    TextTokenizer tok2 = TextTokenizer::from_json(c.extra.at("tokenizer"));
    TextClassifierConfig cfg2 = config_from_json(nlohmann::json::parse(c.extra.at("config")));
    CHECK(config_to_json(cfg2) == config_to_json(cfg));
    CHECK(cfg2.ngram_buckets == cfg.ngram_buckets);
    CHECK(cfg2.ngrams_per_token == cfg.ngrams_per_token);
    CHECK(tok2.kind() == tok.kind());
    CHECK(tok2.vocab_size() == tok.vocab_size());
    for (const auto& t : texts) CHECK(tok2.encode(t, 24) == tok.encode(t, 24));
    TextClassifier restored(cfg2, &gen2);
    training::load_checkpoint(path, restored, nullptr, nullptr);
    model.eval(), restored.eval();
    data::TextDataset one;
    one.classes = {"a", "b", "c"};
    one.examples = {{texts[1], 0}};
    EncodedSet set = encode_dataset(one, tok2, 24, ngram_spec(cfg2));
    CHECK(set.has_ngrams() == (kind == 2));
    Batch b = make_batch(set, std::vector<int64_t>{0}, 24);
    NoGradGuard no_grad;
    CHECK(max(abs(model.forward(b.tokens, b.lengths, b.ngrams) - restored.forward(b.tokens, b.lengths, b.ngrams)))
              .item<float>() == 0.0f);
  }
  AG_CHECK_ERROR(config_from_json(nlohmann::json{{"vocab", 10}}), "textclf config", "max_len");
  // a config from before the n-grams loads with them off
  nlohmann::json old = config_to_json(tiny_config(10, 2));
  for (const char* key : {"ngram_buckets", "ngram_min", "ngram_max", "ngrams_per_token"}) old.erase(key);
  CHECK(config_from_json(old).ngram_buckets == 0);
  nlohmann::json bad_ngrams = config_to_json(tiny_config(10, 2));
  bad_ngrams["ngram_max"] = 1;
  bad_ngrams["ngram_min"] = 3;
  AG_CHECK_ERROR(config_from_json(bad_ngrams), "textclf config", "'ngram_max' 1", "'ngram_min' 3");
  bad_ngrams["ngram_buckets"] = -4;
  AG_CHECK_ERROR(config_from_json(bad_ngrams), "textclf config", "ngram_buckets", "-4");
  nlohmann::json bad = config_to_json(tiny_config(10, 2));
  bad["dropout"] = 1.5;
  AG_CHECK_ERROR(config_from_json(bad), "textclf config", "dropout", "1.5");
}

TEST_CASE("textclf: bucketed batches are deterministic, a partition, and pad less") {
  std::vector<int64_t> lengths(1000);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = int64_t(1 + data::philox_below(5, 9, i, 200));
  BucketSampler a(lengths, 32, 8, 11), b(lengths, 32, 8, 11), other_seed(lengths, 32, 8, 12);
  BucketSampler plain(lengths, 32, 1, 11);
  CHECK(a.num_batches() == 31);  // 1000 / 32, the last partial batch dropped
  // a pure function of the step: asked in another order, from another object
  for (int64_t s : {40, 3, 0, 61, 31, 30})
    CHECK(a.batch(s) == b.batch(s));
  CHECK(a.batch(0) != other_seed.batch(0));
  CHECK(a.epoch_batches(0) != a.epoch_batches(1));
  // each epoch: 31 batches of 32 distinct indices
  std::set<int64_t> seen;
  for (const auto& batch : a.epoch_batches(1)) {
    CHECK(batch.size() == 32);
    seen.insert(batch.begin(), batch.end());
  }
  CHECK(seen.size() == 31 * 32);
  // padding: sum over batches of (longest * size - sum of lengths); windows of 8 batches sort
  auto padding = [&](const BucketSampler& s) {
    int64_t pad = 0;
    for (const auto& batch : s.epoch_batches(0)) {
      int64_t mx = 0, sum = 0;
      for (int64_t i : batch) mx = std::max(mx, lengths[size_t(i)]), sum += lengths[size_t(i)];
      pad += mx * int64_t(batch.size()) - sum;
    }
    return pad;
  };
  CHECK(padding(a) * 4 < padding(plain));
  AG_CHECK_ERROR(BucketSampler(std::vector<int64_t>(5, 1), 8, 1, 0), "BucketSampler", "5 texts", "batch of 8");
}

TEST_CASE("textclf: the training loader resumes at any step with the same batches") {
  TextTokenizer tok = TextTokenizer::build_char({"abcdefg"});
  data::TextDataset ds;
  ds.classes = {"zero", "one"};
  for (int i = 0; i < 20; ++i) ds.examples.push_back({std::string(size_t(1 + i % 13), char('a' + i % 7)), i % 2});
  EncodedSet set = encode_dataset(ds, tok, 8);
  CHECK(set.ids[12] == std::vector<int64_t>(8, tok.encode("f", 8)[0]));  // 13 characters truncated to 8
  std::vector<int64_t> lengths;
  for (const auto& ids : set.ids) lengths.push_back(int64_t(ids.size()));
  BucketSampler sampler(lengths, 6, 2, 4);
  auto full = make_train_loader(set, sampler, 15, 8, 2);
  full->seek(0);
  std::vector<Batch> all;
  for (int s = 0; s < 15; ++s) all.push_back(full->next_step());
  auto resumed = make_train_loader(set, sampler, 15, 8, 0);
  resumed->seek(9);
  for (int s = 9; s < 15; ++s) {
    Batch b = resumed->next_step();
    CHECK(b.tokens.to_vector<int64_t>() == all[size_t(s)].tokens.to_vector<int64_t>());
    CHECK(b.labels.to_vector<int64_t>() == all[size_t(s)].labels.to_vector<int64_t>());
    CHECK(b.num_tokens == sum(b.lengths).item<int64_t>());
  }
  // a batch pads to its longest text, and labels follow the texts
  Batch b = make_batch(set, std::vector<int64_t>{0, 12}, 8);
  CHECK(b.tokens.shape() == Shape{2, 8});
  CHECK(b.lengths.to_vector<int64_t>() == std::vector<int64_t>{1, 8});
  CHECK(b.labels.to_vector<int64_t>() == std::vector<int64_t>{0, 0});
  AG_CHECK_ERROR(make_batch(set, std::vector<int64_t>{20}, 8), "make_batch", "index 20", "[0, 20)");
}

TEST_CASE("textclf: test_errors.tsv lists what the model or the baseline got wrong") {
  data::TextDataset ds;
  ds.classes = {"en", "de"};
  ds.examples = {{"fine", 0}, {"a\tb\nc\\d\r", 1}, {"both wrong", 0}, {"baseline wrong", 1}};
  const std::vector<int64_t> model = {0, 0, 1, 1}, baseline = {0, 1, 1, 0};
  std::array<int64_t, 3> counts{};
  CHECK(errors_tsv(ds, model, &baseline, &counts) ==
        "index\ttrue\tmodel\tbaseline\ttext\n"
        "1\tde\ten\tde\ta\\tb\\nc\\\\d\\r\n"
        "2\ten\tde\tde\tboth wrong\n"
        "3\tde\tde\ten\tbaseline wrong\n");
  CHECK(counts == std::array<int64_t, 3>{2, 2, 1});
  CHECK(errors_tsv(ds, model) ==
        "index\ttrue\tmodel\tbaseline\ttext\n1\tde\ten\t-\ta\\tb\\nc\\\\d\\r\n2\ten\tde\t-\tboth wrong\n");
  AG_CHECK_ERROR(errors_tsv(ds, {0, 1}), "errors_tsv", "2 model predictions", "4 texts");
  const std::vector<int64_t> short_baseline = {0};
  AG_CHECK_ERROR(errors_tsv(ds, model, &short_baseline), "errors_tsv", "1 baseline predictions", "4 texts");
  AG_CHECK_ERROR(errors_tsv(ds, {0, 5, 0, 1}), "errors_tsv", "class 5", "[0, 2)");
}

TEST_CASE("textclf: missing fortune packages are named") {
  TempDir tmp("textclf_fortunes");
  std::filesystem::create_directories(tmp.dir / "de");
  std::vector<std::string> missing = missing_fortune_packages(tmp.dir.string());
  CHECK(std::find(missing.begin(), missing.end(), "fortunes-de") == missing.end());
  for (const char* p : {"fortunes", "fortunes-min", "fortunes-pl", "fortunes-ru"})
    CHECK_MESSAGE(std::find(missing.begin(), missing.end(), p) != missing.end(), p);
  CHECK(missing.size() == 8);  // every package of the table but fortunes-de, each once
  for (const auto& src : data::fortune_sources()) {
    std::string rel = src.path;
    if (rel.back() == '/') std::filesystem::create_directories(tmp.dir / rel);
    else test::write_bytes(tmp.file(rel), "x\n%\n");
  }
  CHECK(missing_fortune_packages(tmp.dir.string()).empty());
}

TEST_CASE("textclf: a TSV file of natural language gets the word tokenizer, other text the char one") {
  std::string why;
  const std::vector<std::string> sentences = {"The cat sat on the mat.", "Computers are fast but dumb.",
                                              "Two words", "A fool and his money are soon parted.",
                                              "Never trust a computer you cannot throw out of a window."};
  CHECK(choose_tsv_tokenizer(sentences, &why) == "word");  // 4 of 5 hold 3+ words: 80%
  CHECK(why.find("--tokenizer word: 80% of the 5 training texts hold 3 or more words") == 0);
  CHECK(why.find("natural language written with spaces") != std::string::npos);
  const std::vector<std::string> codes = {"AX-1734", "BQ-2231 C", "ZZ-0001", "KL-9 9 9", "MM-1"};
  CHECK(choose_tsv_tokenizer(codes, &why) == "char");  // 1 of 5
  CHECK(why.find("--tokenizer char: 20% of the 5 training texts") == 0);
  // no spaces at all (Chinese, Japanese): char
  CHECK(choose_tsv_tokenizer({"\u4eca\u65e5\u306f\u826f\u3044\u5929\u6c17\u3067\u3059\u306d"}) == "char");
  // "words" of 40 bytes are not words: char
  CHECK(choose_tsv_tokenizer({std::string(40, 'a') + " " + std::string(40, 'b') + " " + std::string(40, 'c')}) ==
        "char");
  CHECK(choose_tsv_tokenizer({}) == "char");
}

TEST_CASE("textclf: a small TSV set gets its defaults from its texts, each said in one line, and the best model tested") {
  TempDir tmp("textclf_small");
  // 600 short sentences of two topics (words from two overlapping vocabularies), and the same
  // labels on texts without spaces
  const char* a_words[] = {"cat", "dog", "mat", "sat", "the", "on", "a", "fur", "paw", "purr"};
  const char* b_words[] = {"disk", "byte", "code", "the", "on", "a", "bug", "chip", "ram", "cpu"};
  std::string words, glued;
  for (uint32_t i = 0; i < 600; ++i) {
    const bool b = i % 2 == 1;
    std::string text, nospace;
    for (uint32_t k = 0; k < 4 + (i * 7919u) % 5; ++k) {
      const char* w = (b ? b_words : a_words)[(i * 31u + k * 17u) % 10];
      if (k > 0) text += ' ';
      text += w, nospace += w;
    }
    words += std::string(b ? "tech" : "pets") + "\t" + text + "\n";
    glued += std::string(b ? "tech" : "pets") + "\t" + nospace + "\n";
  }
  ag::test::write_bytes(tmp.file("words.tsv"), words);
  ag::test::write_bytes(tmp.file("glued.tsv"), glued);
  auto run = [&](const std::string& name, const std::string& tsv, const std::string& more) {
    const std::string log = tmp.file(name + ".txt");
    const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/textclf' --dataset tsv --tsv-file '" + tsv +
                            "' --d-model 16 --heads 2 --layers 1 --mlp 32 --ngram-buckets 0 --threads 1 --quiet " +
                            "--eval-every 10 --out '" + tmp.file(name) + "' " + more + " > '" + log + "' 2>&1";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    return ag::test::read_bytes(log);
  };
  // 80% of 600 = 480 training texts: 20 epochs at batch 64 = ceil(9600 / 64) = 150 steps
  const std::string text = run("words", tmp.file("words.tsv"), "");
  INFO(text);
  CHECK(text.find("textclf: --tokenizer word: 100% of the 480 training texts hold 3 or more words") !=
        std::string::npos);
  CHECK(text.find("textclf: --dropout 0.1: word models") != std::string::npos);
  CHECK(text.find("textclf: --word-dropout 0.3: 480 training texts (< 20000: a small set)") != std::string::npos);
  CHECK(text.find("textclf: --steps 150: 20 epochs of 480 training texts (< 20000: a small set) at batch 64") !=
        std::string::npos);
  CHECK(text.find("textclf: --patience 5: 480 training texts") != std::string::npos);
  CHECK(text.find("textclf: --bag-path on: 480 training texts (< 20000: a small set): a linear bag") !=
        std::string::npos);
  CHECK(text.find("% on validation against the character n-gram naive Bayes' ") != std::string::npos);
  CHECK(text.find("baseline: character 1-5-gram naive Bayes") != std::string::npos);  // the yardstick, on by default
  CHECK(text.find("testing the best model by validation: step ") != std::string::npos);
  const auto report = nlohmann::json::parse(ag::test::read_bytes(tmp.file("words/report.json")));
  CHECK(report.at("config").at("data").at("tokenizer") == "word");
  CHECK(report.at("config").at("word_dropout").get<double>() == 0.3);  // what fixes the batches, for --resume
  CHECK(report.at("config").at("model").at("bag") == true);
  CHECK(report.at("accuracy").get<double>() > 0.9);  // the topics share only "the", "on" and "a"
  // no spaces: characters; and flags given on the command line win, unannounced
  const std::string g = run("glued", tmp.file("glued.tsv"), "--steps 20 --dropout 0 --patience 0");
  INFO(g);
  CHECK(g.find("textclf: --tokenizer char: 0% of the 480 training texts hold 3 or more words") != std::string::npos);
  for (const char* flag : {"textclf: --steps", "textclf: --dropout", "textclf: --patience", "textclf: --word-dropout",
                           "textclf: --bag-path"})
    CHECK_MESSAGE(g.find(flag) == std::string::npos, flag);
  // one word per text, nearly every word seen once: as words all are <unk>, so naive Bayes over
  // them is no start, where the character n-grams separate the classes: the bag path stays off
  ag::test::write_bytes(tmp.file("unk.tsv"), synthetic_tsv(600, 22));
  const std::string u = run("unk", tmp.file("unk.tsv"), "--tokenizer word --steps 5 --patience 0");
  INFO(u);
  CHECK(u.find("textclf: --bag-path off: 480 training texts (< 20000: a small set)") != std::string::npos);
  CHECK(u.find("worse by more than 2 standard errors of ") != std::string::npos);
  CHECK(u.find(" points) (--bag-path on: it anyway)") != std::string::npos);
  CHECK(nlohmann::json::parse(ag::test::read_bytes(tmp.file("unk/report.json"))).at("config").at("model").at("bag") ==
        false);
  // --ngram-buckets needs words: refused (exit 2, one line) once the texts say they are not words
  const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/textclf' --dataset tsv --tsv-file '" +
                          tmp.file("glued.tsv") + "' --ngram-buckets 64 --steps 2 --quiet --out '" + tmp.file("bad") +
                          "' > /dev/null 2> '" + tmp.file("bad.txt") + "'";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kExitUsage);
  const std::string err = ag::test::read_bytes(tmp.file("bad.txt"));
  CHECK(err.find("textclf: --ngram-buckets 64: subword n-grams need the word tokenizer (this run uses char)") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(tmp.file("bad/checkpoint.safetensors")));
}

TEST_CASE("textclf: --bag-path auto counts a gap within two standard errors as a tie, and a tie takes the path") {
  // 240 texts, the baseline at 81.25%: SE = sqrt(0.8125 x 0.1875 / 240) = 0.025195; one text
  // behind (80.83%) is a tie
  BagDecision b = decide_bag_path(0.8083, 0.8125, 240);
  CHECK(b.on);
  CHECK(b.standard_error == doctest::Approx(0.025195).epsilon(1e-4));
  // 162 texts, 87.04% against 93.21%: SE = sqrt(0.9321 x 0.0679 / 162) = 0.019766, and the gap
  // 0.0617 is over 3 of them
  b = decide_bag_path(0.8704, 0.9321, 162);
  CHECK_FALSE(b.on);
  CHECK(b.standard_error == doctest::Approx(0.019766).epsilon(1e-4));
  // the edge: 100 texts at 90% give SE 0.03 exactly, so the tie reaches down to 84%
  CHECK(decide_bag_path(0.8401, 0.9, 100).on);
  CHECK_FALSE(decide_bag_path(0.8399, 0.9, 100).on);
  CHECK(decide_bag_path(0.95, 0.9, 100).on);  // better than the baseline
  b = decide_bag_path(0.0, 0.0, 0);           // no validation texts: nothing speaks against it
  CHECK(b.on);
  CHECK(b.standard_error == 0);
}

TEST_CASE("textclf: data options pick the tokenizer, name missing data and split a TSV") {
  TempDir tmp("textclf_data");
  DataOptions d;
  CHECK(resolve_tokenizer(d) == "word");  // fortunes
  d.dataset = "tsv";
  CHECK(resolve_tokenizer(d) == "");  // decided by the texts: choose_tsv_tokenizer
  d.dataset = "imdb";
  CHECK(resolve_tokenizer(d) == "word");
  d.tokenizer = "char";
  CHECK(resolve_tokenizer(d) == "char");
  d.tokenizer = "bpe";
  AG_CHECK_ERROR(resolve_tokenizer(d), "textclf", "unknown tokenizer 'bpe'");
  d.tokenizer = "auto";
  d.root = tmp.file("nowhere");
  CHECK(missing_data(d).find("no aclImdb folder at") != std::string::npos);
  CHECK(missing_data(d).find("train/pos") != std::string::npos);
  d.dataset = "fortunes";
  CHECK(missing_data(d).find("sudo apt-get install fortunes fortunes-min") != std::string::npos);
  d.dataset = "tsv";
  CHECK(missing_data(d).find("--tsv-file") != std::string::npos);
  d.tsv_file = tmp.file("train.tsv");
  CHECK(missing_data(d).find("no TSV file at") != std::string::npos);

  // a TSV with a separate test file: validation is 10% of the training file
  test::write_bytes(d.tsv_file, synthetic_tsv(100, 3));
  test::write_bytes(tmp.file("test.tsv"), "zero\tabc\none\tefg\nzero\tbad\n");
  d.tsv_test = tmp.file("test.tsv");
  CHECK(missing_data(d).empty());
  data::TextSplit s = load_split(d);
  CHECK(s.train.size() == 90);
  CHECK(s.valid.size() == 10);
  CHECK(s.test.size() == 3);
  CHECK(s.test.classes == s.train.classes);
  CHECK(s.test.examples[1].label == 0);  // "one" sorts first
  {  // validation_size's cap: 5000 of 60,000 training texts validate, not 10% (each class gives
     // 5000 / 60000 = 1/12 of its 30,000 texts: 2500, a whole number)
    DataOptions big = d;
    big.tsv_file = tmp.file("big.tsv");
    test::write_bytes(big.tsv_file, synthetic_tsv(60000, 4));
    const data::TextSplit b = load_split(big);
    CHECK(b.valid.size() == 5000);
    CHECK(b.train.size() == 55000);
    CHECK(b.test.size() == 3);
    big.tsv_test.clear();  // one file: 10% of it is the test set, and validation keeps the cap
    const data::TextSplit one = load_split(big);
    CHECK(one.test.size() == 6000);
    CHECK(one.valid.size() == 5000);
    CHECK(one.train.size() == 49000);
    big.tsv_file = tmp.file("one.tsv");  // a single text: nothing would be left to train on
    test::write_bytes(big.tsv_file, "zero\tabc\n");
    check_usage_error([&] { load_split(big); },
                      {"textclf:", "one.tsv", "a validation split of 1", "leaves no training sample"});
  }
  test::write_bytes(d.tsv_test, "two\tabc\n");
  AG_CHECK_ERROR(load_split(d), "two", "test.tsv");
  {  // the fortunes follow the same rule: over 50,000 texts give 10% to test and validation_size's
     // 5000 (not 10%) to validation. Each source of the table gets its share of 60,000 distinct
     // entries; the table leaves some files out.
    DataOptions f;
    f.dataset = "fortunes", f.root = tmp.file("fortunes");
    const auto& sources = data::fortune_sources();
    const int64_t per_source = 60000 / int64_t(sources.size());
    for (const auto& src : sources) {
      std::string rel = src.path, text;
      if (rel.back() == '/') std::filesystem::create_directories(f.root + "/" + rel), rel += "entries";
      std::filesystem::create_directories(std::filesystem::path(f.root + "/" + rel).parent_path());
      for (int64_t i = 0; i < per_source; ++i) text += fmt::format("{} entry {}\n%\n", rel, i);
      test::write_bytes(f.root + "/" + rel, text);
    }
    const int64_t n = data::load_fortunes(f.root).size();  // the table leaves some files out
    REQUIRE(n > 50000);  // so that the cap, not 10%, sizes the validation split
    const data::TextSplit fs = load_split(f);
    CHECK(fs.train.size() + fs.valid.size() + fs.test.size() == n);
    // each class rounds its own share, so the totals may differ by up to half a text per class
    const double half = 0.5 * double(fs.train.classes.size());
    CHECK(std::abs(double(fs.valid.size()) - 5000.0) <= half);
    CHECK(std::abs(double(fs.test.size()) - 0.1 * double(n)) <= half);
  }

  DataOptions back = data_from_json(data_to_json(d));
  CHECK(data_to_json(back) == data_to_json(d));
  d.layout = true;
  CHECK(data_from_json(data_to_json(d)).layout);
  nlohmann::json before_layout = data_to_json(d);
  before_layout.erase("layout");  // a checkpoint made before the option
  CHECK_FALSE(data_from_json(before_layout).layout);
  nlohmann::json bad = data_to_json(d);
  bad.erase("max_len");
  AG_CHECK_ERROR(data_from_json(bad), "textclf config", "malformed data entry", "'max_len' is missing");
  // wrong types and out-of-range numbers are refused before any conversion (a float such as 1e22
  // has no integer value: converting it would be undefined behaviour)
  auto refused = [&](const char* key, nlohmann::json value, const char* why) {
    nlohmann::json j = data_to_json(d);
    j[key] = std::move(value);
    AG_CHECK_ERROR(data_from_json(j), "textclf config", "malformed data entry", why);
  };
  refused("max_len", 1.2892e22, "'max_len' must be an integer in [1, 4096]");
  refused("max_len", 0, "'max_len' must be an integer");
  refused("max_len", uint64_t(1) << 63, "'max_len' must be an integer");
  refused("min_freq", int64_t(1) << 40, "'min_freq' must be an integer");
  refused("max_words", 2, "'max_words' must be an integer in [3,");
  refused("split_seed", -1, "'split_seed' must be an integer >= 0");
  refused("split_seed", 0.5, "'split_seed'");
  refused("dataset", 7, "'dataset' must be a string");
  refused("layout", "yes", "'layout' must be true or false");
  AG_CHECK_ERROR(data_from_json(nlohmann::json::array()), "textclf config", "a JSON object");
}

TEST_CASE("textclf: a 30-step run on a synthetic TSV learns, and the heatmap has one panel per head") {
  TempDir tmp("textclf_run");
  test::write_bytes(tmp.file("train.tsv"), synthetic_tsv(400, 21));
  data::TextDataset all = data::load_tsv(tmp.file("train.tsv"));
  CHECK(all.classes == std::vector<std::string>{"one", "zero"});
  data::TextSplit split = data::split_dataset(all, 1, 0.0, 0.25);
  std::vector<std::string> texts;
  for (const auto& ex : split.train.examples) texts.push_back(ex.text);
  TextTokenizer tok = TextTokenizer::build_char(texts);
  TextClassifierConfig cfg = tiny_config(tok.vocab_size(), 2);
  EncodedSet train = encode_dataset(split.train, tok, cfg.max_len), test = encode_dataset(split.test, tok, cfg.max_len);
  Generator gen(1);
  TextClassifier model(cfg, &gen);
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  std::vector<int64_t> lengths;
  for (const auto& s : train.ids) lengths.push_back(int64_t(s.size()));
  BucketSampler sampler(lengths, 16, 4, 1);
  EvalResult before = evaluate(model, test, all.classes, 64);
  auto loader = make_train_loader(train, sampler, 30, cfg.max_len);
  loader->seek(0);
  const std::vector<double> losses = train_steps(model, opt, *loader, 30, tmp.file("run"));
  const double first_loss = std::accumulate(losses.begin(), losses.begin() + 5, 0.0) / 5,
               last_loss = std::accumulate(losses.end() - 5, losses.end(), 0.0) / 5;
  EvalResult after = evaluate(model, test, all.classes, 64);
  INFO("accuracy " << before.accuracy << " -> " << after.accuracy << ", loss " << first_loss << " -> " << last_loss);
  CHECK(after.confusion.total() == 100);
  CHECK(after.accuracy >= 0.9);
  CHECK(after.accuracy > before.accuracy + 0.2);
  CHECK(last_loss < 0.5 * first_loss);
  {  // the step's loss scale (--precision fp16) multiplies every gradient, exactly for a power of
     // two, and the loss it returns is the batch's own
    const Batch b = make_batch(train, std::vector<int64_t>{0, 1, 2, 3}, cfg.max_len);
    const double plain = forward_backward(model, opt, b);
    std::vector<std::vector<float>> grads;
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad().to_vector<float>());
    CHECK(forward_backward(model, opt, b, 0.0, 4.0) == plain);
    int differ = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::vector<float> scaled = model.parameters()[i].grad().to_vector<float>();
      for (size_t k = 0; k < scaled.size(); ++k) differ += scaled[k] != 4 * grads[i][k];
    }
    CHECK(differ == 0);
  }
  // evaluate in small batches gives the same numbers (padding never leaks)
  EvalResult small = evaluate(model, test, all.classes, 20);
  CHECK(small.loss == doctest::Approx(after.loss).epsilon(1e-5));
  CHECK(small.accuracy == after.accuracy);
  // the per-text predictions, in the set's order, agree with the confusion matrix and the batching
  REQUIRE(after.predicted.size() == size_t(test.size()));
  CHECK(small.predicted == after.predicted);
  ConfusionMatrix again(all.classes);
  for (size_t k = 0; k < after.predicted.size(); ++k) again.add(test.labels[k], after.predicted[k]);
  CHECK(again.counts == after.confusion.counts);
  {  // the model alone on one text gives the class recorded for it
    const int64_t k = test.size() - 1;
    Batch one = make_batch(test, std::vector<int64_t>{k}, cfg.max_len);
    model.eval();
    NoGradGuard no_grad;
    CHECK(argmax(model.forward(one.tokens, one.lengths), 1).item<int64_t>() == after.predicted[size_t(k)]);
    model.train();
  }
  CHECK(evaluate(model, test, all.classes, 64, 7).predicted.size() == 7);  // --eval-samples: the first 7

  int64_t i = pick_heatmap_sample(test, 10, 12);
  REQUIRE(i >= 0);
  const auto T = int64_t(test.ids[size_t(i)].size());
  CHECK((T >= 10 && T <= 12));
  int64_t predicted = -1;
  std::vector<Heatmap> panels = attention_heatmaps(model, tok, test, i, &predicted);
  CHECK((predicted == 0 || predicted == 1));
  REQUIRE(panels.size() == 2);  // 1 layer x 2 heads
  CHECK(panels[1].title == "layer 0, head 1");
  CHECK(panels[0].rows == T);
  CHECK(panels[0].col_labels.size() == size_t(T));
  for (int r = 0; r < panels[0].rows; ++r) {  // every query's weights sum to 1
    double row = 0;
    for (int c = 0; c < panels[0].cols; ++c) row += panels[0].values[size_t(r * panels[0].cols + c)];
    CHECK(row == doctest::Approx(1.0).epsilon(1e-5));
  }
  CHECK_FALSE(model.need_weights);
  CHECK(svg_heatmaps(panels).find("layer 0, head 1") != std::string::npos);
}

TEST_CASE("textclf: with n-grams a word model learns from subwords where every word is <unk>") {
  // Each synthetic text is one word of 6..20 letters, nearly all distinct: the word vocabulary
  // (min_freq 2) knows none, so every token is <unk> and only the n-grams tell the classes apart.
  TempDir tmp("textclf_ngram_run");
  test::write_bytes(tmp.file("train.tsv"), synthetic_tsv(400, 22));
  data::TextSplit split = data::split_dataset(data::load_tsv(tmp.file("train.tsv")), 1, 0.0, 0.25);
  std::vector<std::string> texts;
  for (const auto& ex : split.train.examples) texts.push_back(ex.text);
  TextTokenizer tok = TextTokenizer::build_word(texts, 2, 1000);
  TextClassifierConfig cfg = tiny_config(tok.vocab_size(), 2);
  cfg.ngram_buckets = 512, cfg.ngram_min = 1, cfg.ngram_max = 2, cfg.ngrams_per_token = 24;
  EncodedSet train = encode_dataset(split.train, tok, cfg.max_len, ngram_spec(cfg)),
             test = encode_dataset(split.test, tok, cfg.max_len, ngram_spec(cfg));
  int64_t unknown = 0;
  for (const auto& ids : test.ids) unknown += ids == std::vector<int64_t>{1};
  CHECK(unknown >= 95);
  Generator gen(2);
  TextClassifier model(cfg, &gen);
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  std::vector<int64_t> lengths(size_t(train.size()), 1);
  BucketSampler sampler(lengths, 16, 1, 3);
  auto loader = make_train_loader(train, sampler, 40, cfg.max_len);
  loader->seek(0);
  train_steps(model, opt, *loader, 40, tmp.file("run"));
  EvalResult after = evaluate(model, test, split.train.classes, 64);
  INFO("accuracy " << after.accuracy);
  CHECK(after.accuracy >= 0.9);
  // the heatmap path carries the n-grams too
  int64_t predicted = -1;
  CHECK(attention_heatmaps(model, tok, test, 0, &predicted).size() == 2);
  CHECK(predicted == argmax(model.forward(make_batch(test, std::vector<int64_t>{0}, cfg.max_len).tokens,
                                          make_batch(test, std::vector<int64_t>{0}, cfg.max_len).lengths,
                                          make_batch(test, std::vector<int64_t>{0}, cfg.max_len).ngrams),
                            1)
                         .item<int64_t>());
}

TEST_CASE("textclf: the bag path starts as naive Bayes over the model's words and n-grams") {
  // class 0: "der hund", "der katze"; class 1: "ein hund". Word counts: class 0 der 2, hund 1,
  // katze 1 (total 4); class 1 ein 1, hund 1 (total 2). The table has V = 6 rows (<pad> <unk> and
  // the four words): F = 5 features without the padding row.
  data::TextDataset ds;
  ds.classes = {"a", "b"};
  ds.examples = {{"der hund", 0}, {"der katze", 0}, {"ein hund", 1}};
  TextTokenizer tok = TextTokenizer::build_word({"der hund", "der katze", "ein hund"}, 1, 100);
  REQUIRE(tok.vocab_size() == 6);
  TextClassifierConfig cfg = tiny_config(tok.vocab_size(), 2);
  cfg.ngram_buckets = 64, cfg.ngram_min = 2, cfg.ngram_max = 3, cfg.ngrams_per_token = 8, cfg.bag = true;
  const EncodedSet set = encode_dataset(ds, tok, cfg.max_len, ngram_spec(cfg));
  Generator gen(3);
  TextClassifier model(cfg, &gen);
  REQUIRE(model.bag_tok);
  REQUIRE(model.bag_ngram);
  for (const Tensor& t : {model.bag_tok->weight, model.bag_ngram->weight}) {  // zeros until filled
    const std::vector<float> v = t.to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.f; }));
  }
  const double alpha = 0.5;
  init_bag_from_naive_bayes(model, bag_naive_bayes(set, cfg.vocab, cfg.ngram_buckets, 2, alpha));
  const std::vector<float> w = model.bag_tok->weight.to_vector<float>();
  auto id = [&](const char* word) { return tok.encode(word, 1).at(0); };
  // bag[f] = (l0 - l1) / 2 * (1, -1), l_c = log((count_c(f) + alpha) / (total_c + 5 alpha))
  auto want = [&](double c0, double c1) {
    return (std::log((c0 + alpha) / (4 + 5 * alpha)) - std::log((c1 + alpha) / (2 + 5 * alpha))) / 2;
  };
  const std::pair<const char*, std::array<double, 2>> words[] = {
      {"der", {2, 0}}, {"hund", {1, 1}}, {"katze", {1, 0}}, {"ein", {0, 1}}, {"<unk>", {0, 0}}};
  for (const auto& [word, counts] : words) {
    CAPTURE(word);
    const int64_t r = std::string(word) == "<unk>" ? 1 : id(word);
    CHECK(w[size_t(2 * r)] == doctest::Approx(want(counts[0], counts[1])).epsilon(1e-6));
    CHECK(w[size_t(2 * r + 1)] == doctest::Approx(-want(counts[0], counts[1])).epsilon(1e-6));
  }
  CHECK(w[0] == 0.f);  // padding
  CHECK(w[1] == 0.f);
  // the n-gram table: counted here from each word's n-grams (data::hashed_ngrams), not from the
  // encoded set's rows
  std::vector<double> count(size_t(65 * 2), 0.0), total(2, 0.0);
  for (const auto& ex : ds.examples)
    for (const std::string& word : tok.pieces(ex.text, cfg.max_len))
      for (int64_t g : data::hashed_ngrams(word, ngram_spec(cfg))) count[size_t(2 * g + ex.label)] += 1, total[size_t(ex.label)] += 1;
  const std::vector<float> wg = model.bag_ngram->weight.to_vector<float>();
  int bad = 0;
  for (int64_t g = 1; g <= 64; ++g) {
    const double l0 = std::log((count[size_t(2 * g)] + alpha) / (total[0] + 64 * alpha)),
                 l1 = std::log((count[size_t(2 * g + 1)] + alpha) / (total[1] + 64 * alpha));
    bad += std::abs(wg[size_t(2 * g)] - (l0 - l1) / 2) > 1e-6 || std::abs(wg[size_t(2 * g + 1)] + (l0 - l1) / 2) > 1e-6;
  }
  CHECK(bad == 0);
  CHECK(wg[0] == 0.f);
  // the path's logits: the forward with the bag less the forward without it is each text's mean
  // over its tokens of (word row + its n-gram rows)
  const Batch b = make_batch(set, std::vector<int64_t>{0, 1, 2}, cfg.max_len);
  model.eval();
  NoGradGuard no_grad;
  const std::vector<float> with = model.forward(b.tokens, b.lengths, b.ngrams).to_vector<float>();
  model.bag_tok->weight.fill_(0.0);
  model.bag_ngram->weight.fill_(0.0);
  const std::vector<float> without = model.forward(b.tokens, b.lengths, b.ngrams).to_vector<float>();
  for (int64_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const std::vector<int64_t>& ids = set.ids[size_t(i)];
    for (int64_t c = 0; c < 2; ++c) {
      double bag = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        bag += w[size_t(2 * ids[t] + c)];
        for (int64_t g : set.form_ngrams[size_t(set.forms[size_t(i)][t])]) bag += wg[size_t(2 * g + c)];
      }
      bag /= double(ids.size());
      CHECK(with[size_t(2 * i + c)] - without[size_t(2 * i + c)] == doctest::Approx(bag).epsilon(1e-5));
    }
  }
  // the config keeps it; a config without it (an older checkpoint) has none; a bad value is refused
  CHECK(config_from_json(config_to_json(cfg)).bag);
  nlohmann::json older = config_to_json(cfg);
  older.erase("bag");
  CHECK_FALSE(config_from_json(older).bag);
  older["bag"] = 1;
  AG_CHECK_ERROR(config_from_json(older), "textclf config", "'bag'", "true or false");
  // refused: a model without the path, alpha <= 0
  TextClassifierConfig plain = cfg;
  plain.bag = false;
  TextClassifier no_bag(plain, &gen);
  CHECK_FALSE(no_bag.bag_tok);
  AG_CHECK_ERROR(init_bag_from_naive_bayes(no_bag, bag_naive_bayes(set, cfg.vocab, cfg.ngram_buckets, 2, alpha)),
                 "init_bag_from_naive_bayes", "no bag path");
  AG_CHECK_ERROR(bag_naive_bayes(set, cfg.vocab, cfg.ngram_buckets, 2, 0.0), "bag_naive_bayes", "alpha");
  AG_CHECK_ERROR(init_bag_from_naive_bayes(model, bag_naive_bayes(set, cfg.vocab, 0, 2, alpha)),
                 "init_bag_from_naive_bayes", "0 n-gram");
  // the tables alone: their accuracy is the argmax of the path's logits (the first class on a tie)
  const BagTables t = bag_naive_bayes(set, cfg.vocab, cfg.ngram_buckets, 2, alpha);
  CHECK(t.words == w);
  CHECK(t.ngrams == wg);
  int right = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const double d0 = with[size_t(2 * i)] - without[size_t(2 * i)], d1 = with[size_t(2 * i + 1)] - without[size_t(2 * i + 1)];
    right += (d1 > d0 ? 1 : 0) == set.labels[size_t(i)];
  }
  CHECK(bag_accuracy(t, set) == doctest::Approx(right / 3.0));
  CHECK(bag_accuracy(t, set) > 0.5);  // it separates its own training texts
}

TEST_CASE("textclf: over three classes the bag path starts as centred naive Bayes without its prior") {
  // Words only, alpha 1. Class a: "x x y", "x", "x"; class b: "y z"; class c: "z". The vocabulary:
  // <pad> <unk> x y z (x seen 4 times, then y and z twice each), so F = 4 rows besides the padding.
  // Counts (total): a x 4, y 1 (5); b y 1, z 1 (2); c z 1 (1). theta_c(f) = (count + 1) / (total_c + 4):
  //          <unk>   x     y     z
  //     a    1/9    5/9   2/9   1/9
  //     b    1/6    1/6   2/6   2/6
  //     c    1/5    1/5   1/5   2/5
  //   bag[f, c] = log theta_c(f) - (1/3) sum_c' log theta_c'(f)
  data::TextDataset ds;
  ds.classes = {"a", "b", "c"};
  ds.examples = {{"x x y", 0}, {"x", 0}, {"x", 0}, {"y z", 1}, {"z", 2}};
  std::vector<std::string> texts;
  for (const auto& ex : ds.examples) texts.push_back(ex.text);
  const TextTokenizer tok = TextTokenizer::build_word(texts, 1, 100);
  REQUIRE(tok.vocab_size() == 5);
  REQUIRE(tok.encode("q x y z", 4) == std::vector<int64_t>{1, 2, 3, 4});
  const double theta[4][3] = {{1. / 9, 1. / 6, 1. / 5}, {5. / 9, 1. / 6, 1. / 5}, {2. / 9, 2. / 6, 1. / 5},
                              {1. / 9, 2. / 6, 2. / 5}};  // rows <unk> x y z, columns a b c
  TextClassifierConfig cfg = tiny_config(5, 3);
  cfg.bag = true;
  const BagTables t = bag_naive_bayes(encode_dataset(ds, tok, cfg.max_len), cfg.vocab, 0, 3, 1.0);
  REQUIRE(t.words.size() == 15);
  CHECK(t.ngrams.empty());
  for (int c = 0; c < 3; ++c) CHECK(t.words[size_t(c)] == 0.f);  // padding
  for (int f = 0; f < 4; ++f) {
    CAPTURE(f);
    const double mean = (std::log(theta[f][0]) + std::log(theta[f][1]) + std::log(theta[f][2])) / 3;
    double row = 0;
    for (int c = 0; c < 3; ++c) {
      CHECK(t.words[size_t(3 * (f + 1) + c)] == doctest::Approx(std::log(theta[f][c]) - mean).epsilon(1e-6));
      row += t.words[size_t(3 * (f + 1) + c)];
    }
    CHECK(std::abs(row) < 1e-6);  // centred: the classes' values of a row sum to 0
  }

  // Naive Bayes by hand: S_c = log prior_c + sum_t log theta_c(x_t), priors 3/5, 1/5, 1/5. The
  // tables' argmax is that of S_c with a uniform prior. The prior changes two answers: "q" (an
  // unknown word) is c without it (theta 1/5 the largest) and a with it (3/5 * 1/9 = 1/15 against
  // 1/5 * 1/5 = 1/25); "y" is b without it (2/6) and a with it (3/5 * 2/9 = 2/15 against 1/15).
  data::TextDataset probe;
  probe.classes = ds.classes;
  const std::vector<std::vector<int>> probes = {{0}, {1}, {2}, {3}, {1, 2}, {2, 3}, {1, 3, 3}, {0, 0, 2}};
  const char* words[] = {"q", "x", "y", "z"};
  const double prior[3] = {3. / 5, 1. / 5, 1. / 5};
  int64_t differ = 0;
  std::vector<int> with_prior;
  for (const std::vector<int>& p : probes) {
    std::string text;
    double s[3] = {0, 0, 0}, sp[3];
    for (int f : p) {
      if (!text.empty()) text += ' ';
      text += words[f];
      for (int c = 0; c < 3; ++c) s[c] += std::log(theta[f][c]);
    }
    for (int c = 0; c < 3; ++c) sp[c] = s[c] + std::log(prior[c]);
    const int nb = int(std::max_element(s, s + 3) - s), nb_prior = int(std::max_element(sp, sp + 3) - sp);
    probe.examples.push_back({text, nb});  // labelled with naive Bayes' answer without the prior
    with_prior.push_back(nb_prior);
    differ += nb != nb_prior;
  }
  REQUIRE(differ == 2);  // "q" and "y"
  const EncodedSet set = encode_dataset(probe, tok, cfg.max_len);
  CHECK(bag_accuracy(t, set) == 1.0);  // every start prediction is naive Bayes' without its prior
  EncodedSet relabelled = set;
  for (size_t i = 0; i < with_prior.size(); ++i) relabelled.labels[i] = with_prior[i];
  CHECK(bag_accuracy(t, relabelled) == doctest::Approx(double(probes.size() - 2) / double(probes.size())));

  // the model's start: the path adds (1/n) (S_c without the prior) less a constant of the text, so
  // the logits of two classes differ by (S_c - S_c') / n
  Generator gen(5);
  TextClassifier model(cfg, &gen);
  init_bag_from_naive_bayes(model, t);
  model.eval();
  NoGradGuard no_grad;
  std::vector<int64_t> all(probes.size());
  std::iota(all.begin(), all.end(), int64_t(0));
  const Batch b = make_batch(set, all, cfg.max_len);
  const std::vector<float> with = model.forward(b.tokens, b.lengths).to_vector<float>();
  model.bag_tok->weight.fill_(0.0);
  const std::vector<float> without = model.forward(b.tokens, b.lengths).to_vector<float>();
  for (size_t i = 0; i < probes.size(); ++i) {
    CAPTURE(i);
    double s[3] = {0, 0, 0};
    for (int f : probes[i])
      for (int c = 0; c < 3; ++c) s[c] += std::log(theta[f][c]);
    const auto n = double(probes[i].size());
    auto path = [&](int c) { return double(with[3 * i + size_t(c)]) - double(without[3 * i + size_t(c)]); };
    CHECK(path(0) - path(1) == doctest::Approx((s[0] - s[1]) / n).epsilon(1e-5));
    CHECK(path(2) - path(1) == doctest::Approx((s[2] - s[1]) / n).epsilon(1e-5));
  }
}

TEST_CASE("textclf: the command line is checked before any data is read") {
  const DataOptions d0;  // fortunes, auto (word) tokenizer, max_len 128
  TextClassifierConfig m0;
  m0.d_model = 64, m0.n_heads = 4, m0.n_layers = 2, m0.mlp_hidden = 256;
  const TrainSettings t0;
  CHECK_NOTHROW(validate_config(d0, m0, t0));
  auto with_data = [&](auto edit) {
    DataOptions d = d0;
    edit(d);
    return [=] { validate_config(d, m0, t0); };
  };
  auto with_model = [&](auto edit) {
    TextClassifierConfig m = m0;
    edit(m);
    return [=] { validate_config(d0, m, t0); };
  };
  auto with_settings = [&](auto edit) {
    TrainSettings t = t0;
    edit(t);
    return [=] { validate_config(d0, m0, t); };
  };
  check_usage_error(with_model([](auto& m) { m.n_heads = 3; }), {"textclf:", "--heads 3", "--d-model 64"});
  check_usage_error(with_model([](auto& m) { m.d_model = 0; }), {"--d-model 0"});
  check_usage_error(with_model([](auto& m) { m.n_layers = -1; }), {"--layers -1"});
  check_usage_error(with_model([](auto& m) { m.mlp_hidden = 0; }), {"--mlp 0"});
  check_usage_error(with_model([](auto& m) { m.ngrams_per_token = 0; }), {"--ngrams-per-token 0"});
  check_usage_error(with_data([](auto& d) { d.max_len = 0; }), {"--max-len 0"});
  check_usage_error(with_data([](auto& d) { d.max_len = 5000; }), {"--max-len 5000", "4096"});
  check_usage_error(with_data([](auto& d) { d.min_freq = 0; }), {"--min-freq 0"});
  check_usage_error(with_data([](auto& d) { d.max_words = 2; }), {"--max-words 2", "<unk>"});
  check_usage_error(with_data([](auto& d) { d.layout = true, d.tokenizer = "char"; }), {"--layout-tokens", "char"});
  CHECK_NOTHROW(with_data([](auto& d) { d.layout = true; })());
  check_usage_error(with_data([](auto& d) { d.tsv_file = "x.tsv"; }), {"--tsv-file", "x.tsv", "--dataset tsv", "fortunes"});
  check_usage_error(with_settings([](auto& t) { t.label_smoothing = 1.0; }), {"--label-smoothing 1"});
  check_usage_error(with_settings([](auto& t) { t.bucket_window = 0; }), {"--bucket-window 0"});
  check_usage_error(with_settings([](auto& t) { t.word_dropout = 0.95; }), {"--word-dropout 0.95", "[0, 0.9]"});
  check_usage_error(with_settings([](auto& t) { t.word_dropout = -0.1; }), {"--word-dropout -0.1"});
  check_usage_error(with_settings([](auto& t) { t.eval_samples = -5; }), {"--eval-samples -5"});
  check_usage_error(with_settings([](auto& t) { t.eval_batch_tokens = 0; }), {"--eval-batch-tokens 0"});
  check_usage_error(with_settings([](auto& t) { t.ngram_buckets = -2; }), {"--ngram-buckets -2"});
  check_usage_error(with_settings([](auto& t) { t.ngram_range = "2-"; }), {"--ngrams '2-'", "MIN-MAX"});
  check_usage_error(with_settings([](auto& t) { t.ngram_range = "5-2"; }), {"--ngrams 5-2", "MIN <= MAX"});
  check_usage_error(with_settings([](auto& t) { t.ngram_range = "0-3"; }), {"--ngrams 0-3"});
  check_usage_error(with_settings([](auto& t) { t.nb_alpha = 0; }), {"--nb-alpha 0"});
  // n-grams need the word tokenizer: refused with char; a TSV's auto tokenizer is decided by its
  // texts (checked again then, the case above the data options'), so it passes here
  DataOptions tsv = d0;
  tsv.dataset = "tsv", tsv.tsv_file = "x.tsv";
  TrainSettings buckets = t0;
  buckets.ngram_buckets = 1024;
  CHECK_NOTHROW(validate_config(tsv, m0, buckets));
  tsv.tokenizer = "char";
  check_usage_error([&] { validate_config(tsv, m0, buckets); }, {"--ngram-buckets 1024", "char"});
  tsv.tokenizer = "word";
  CHECK_NOTHROW(validate_config(tsv, m0, buckets));
  CHECK(parse_ngram_range("3-6") == std::pair<int64_t, int64_t>{3, 6});
}
