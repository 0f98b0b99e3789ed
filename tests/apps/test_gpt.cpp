// The char-level GPT app's library (apps/gpt/lib.h): data split and tokenizer, the ids generation
// never samples, the training step main runs (forward_backward), evaluation windows and loss,
// sampling (greedy limits, top-k, determinism), cached == uncached generation past the context,
// the attention plot, and the config JSON. Tiny models, synthetic text.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>

#include "apps/common/run.h"
#include "apps/gpt/lib.h"
#include "tests/apps/usage_error.h"
#include "attograd.h"
#include "data/loader.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab = 11, c.context = 16, c.d_model = 32, c.n_heads = 4, c.n_layers = 2, c.mlp_hidden = 64;
  return c;
}

// Greedy decoding written out: a full forward over all tokens so far, argmax of the last position
// (only valid while prompt + n_new <= context, so no window restarts).
std::vector<int64_t> greedy_reference(GPT& model, std::vector<int64_t> ids, int64_t n_new) {
  NoGradGuard no_grad;
  for (int64_t i = 0; i < n_new; ++i) {
    Tensor logits = model.forward(from_vector(ids, {1, int64_t(ids.size())}));
    ids.push_back(argmax(logits.select(0, 0).select(0, int64_t(ids.size()) - 1), 0).item<int64_t>());
  }
  return ids;
}

}  // namespace

TEST_CASE("gpt: make_lm_data splits the codepoints 90/10 in order, vocabulary from the training part") {
  // 20 codepoints: "abab...ab" (18) then "é" + "a"; k = floor(20 * 0.9) = 18, so "é" is only in
  // validation and encodes to <unk> (0); the vocabulary is {a, b}: ids 1, 2.
  std::string text;
  for (int i = 0; i < 9; ++i) text += "ab";
  text += "\xC3\xA9" "a";
  LMData d = make_lm_data(text);
  CHECK(d.tokenizer.vocab_size() == 3);
  REQUIRE(d.train.size() == 18);
  REQUIRE(d.valid.size() == 2);
  CHECK(d.train[0] == 1);
  CHECK(d.train[17] == 2);
  CHECK(d.valid == std::vector<int64_t>{data::CharTokenizer::kUnk, 1});
  LMData q = make_lm_data(text, 0.25);  // k = floor(20 * 0.75) = 15
  CHECK(q.train.size() == 15);
  CHECK(q.valid.size() == 5);
  AG_CHECK_ERROR(make_lm_data("abc"), "make_lm_data", "3 codepoints", "2 train and 1 validation");
  AG_CHECK_ERROR(make_lm_data(text, 1.5), "make_lm_data", "1.5");
}

TEST_CASE("gpt: the ids a tokenizer built from the training text never produces are <unk> alone") {
  // the make_lm_data case above: training "abab...ab" holds ids 1 (a) and 2 (b); validation "éa"
  // holds <unk> (é, not in the training part) and a
  std::string text;
  for (int i = 0; i < 9; ++i) text += "ab";
  text += "\xC3\xA9" "a";
  const LMData d = make_lm_data(text);
  CHECK(unproduced_ids(d.train, 3) == std::vector<int64_t>{data::CharTokenizer::kUnk});
  CHECK(unproduced_ids(d.valid, 3) == std::vector<int64_t>{2});
  // every codepoint of a text gets an id its encoding produces, so only <unk> (0) is left: 13
  // distinct codepoints (n a ï v e, space, c f é, the dash, o k, newline), ids 1..13
  const std::string words = "na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 ok\n";
  const data::CharTokenizer tok = data::CharTokenizer::from_text(words);
  REQUIRE(tok.vocab_size() == 14);
  CHECK(unproduced_ids(tok.encode(words), 14) == std::vector<int64_t>{0});
  // the byte tokenizer: every byte the text lacks
  const std::vector<int64_t> bytes = unproduced_ids(data::CharTokenizer::bytes().encode("abca"), 256);
  CHECK(bytes.size() == 253);
  for (int64_t b : {97, 98, 99}) CHECK(std::find(bytes.begin(), bytes.end(), b) == bytes.end());
  AG_CHECK_ERROR(unproduced_ids(std::vector<int64_t>{1, 5}, 5), "unproduced_ids", "id 5", "[0, 5)");
}

TEST_CASE("gpt: eval_starts spreads the windows evenly") {
  // len 20, T 4: the last start is 20 - 4 - 1 = 15; start_i = i * 15 / 4 = 0, 3, 7, 11, 15
  CHECK(eval_starts(20, 4, 5) == std::vector<int64_t>{0, 3, 7, 11, 15});
  CHECK(eval_starts(20, 4, 1) == std::vector<int64_t>{0});
  CHECK(eval_starts(5, 4, 3) == std::vector<int64_t>{0, 0, 0});
  AG_CHECK_ERROR(eval_starts(4, 4, 2), "eval_starts", "4 tokens", "4 + 1");
  AG_CHECK_ERROR(eval_starts(20, 4, 0), "eval_starts", "0 windows");
}

TEST_CASE("gpt: lm_loss is the mean cross-entropy over the windows, whatever the batch") {
  Generator gen(11);
  GPT model(tiny_config(), &gen);
  std::vector<int64_t> ids = randint(0, 11, {60}, &gen).to_vector<int64_t>();
  std::vector<int64_t> starts = eval_starts(60, 8, 5);
  double l1 = lm_loss(model, ids, starts, 8, 1), l2 = lm_loss(model, ids, starts, 8, 2),
         l5 = lm_loss(model, ids, starts, 8, 64);
  CHECK(l1 == doctest::Approx(l5).epsilon(1e-6));
  CHECK(l2 == doctest::Approx(l5).epsilon(1e-6));
  CHECK(model.is_training());  // restored
  // by hand: the windows stacked into one batch, cross_entropy's mean over the 5 * 8 targets
  std::vector<int64_t> x, y;
  for (int64_t s : starts)
    for (int64_t t = 0; t < 8; ++t) x.push_back(ids[size_t(s + t)]), y.push_back(ids[size_t(s + t + 1)]);
  model.eval();
  NoGradGuard no_grad;
  Tensor logits = model.forward(from_vector(x, {5, 8}));
  double ref = cross_entropy(logits.reshape({40, 11}), from_vector(y, {40})).item<double>();
  CHECK(l5 == doctest::Approx(ref).epsilon(1e-6));
  // an untrained model is close to uniform: about log 11
  CHECK(std::abs(l5 - std::log(11.0)) < 0.5);
  AG_CHECK_ERROR(lm_loss(model, ids, {55}, 8, 1), "lm_loss", "55", "60 tokens");
  AG_CHECK_ERROR(lm_loss(model, ids, starts, 17, 1), "lm_loss", "17", "context 16");
}

TEST_CASE("gpt: the loss by position, past the context for relative positions, and the length evaluation file") {
  Generator gen(12);
  GPTConfig c = tiny_config();
  c.pos = "rope";
  GPT model(c, &gen);
  const std::vector<int64_t> ids = randint(0, 11, {120}, &gen).to_vector<int64_t>();
  const std::vector<int64_t> starts = eval_starts(120, 24, 4);  // windows of 24 > context 16
  const std::vector<double> by = lm_loss_by_position(model, ids, starts, 24, 3);
  REQUIRE(by.size() == 24);
  // by hand: position t's loss averaged over the 4 windows
  std::vector<int64_t> x, y;
  for (int64_t s : starts)
    for (int64_t t = 0; t < 24; ++t) x.push_back(ids[size_t(s + t)]), y.push_back(ids[size_t(s + t + 1)]);
  {
    model.eval();
    NoGradGuard no_grad;
    const Tensor per = cross_entropy(model.forward(from_vector(x, {4, 24})).reshape({96, 11}), from_vector(y, {96}),
                                     "none");
    const std::vector<double> ref = mean(per.reshape({4, 24}).to(DType::f64), {0}).to_vector<double>();
    for (size_t t = 0; t < 24; ++t) CHECK(by[t] == doctest::Approx(ref[t]).epsilon(1e-6));
    model.train();
  }
  double m = 0;
  for (double v : by) m += v / 24;
  CHECK(lm_loss(model, ids, starts, 24, 4) == doctest::Approx(m).epsilon(1e-12));
  // learned positions refuse windows past the context; evaluate_lengths records that as a line
  GPT learned(tiny_config(), &gen);
  AG_CHECK_ERROR(lm_loss_by_position(learned, ids, starts, 24, 3), "window 24", "context 16", "learned");
  TempDir tmp("gpt_lengths");
  const std::string file = tmp.file("lengths.jsonl");
  const auto lines = evaluate_lengths(learned, "learned", ids, {16, 24}, 4, 4, file);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].at("loss").get<double>() == doctest::Approx(lm_loss(learned, ids, eval_starts(120, 16, 4), 16, 4)));
  CHECK(lines[1].contains("error"));
  CHECK(lines[1].at("error").get<std::string>().find("learned positions stop at the context of 16") !=
        std::string::npos);
  evaluate_lengths(model, "rope", ids, {24}, 4, 4, file);  // appended, and the plot redrawn from all lines
  const std::string text = read_bytes(file);
  CHECK(std::count(text.begin(), text.end(), '\n') == 3);
  const std::string svg = read_bytes(tmp.file("lengths.svg"));
  CHECK(svg.find("windows of 16") != std::string::npos);
  CHECK(svg.find("windows of 24") != std::string::npos);
  CHECK(svg.find("rope (trained on 16)") != std::string::npos);
  CHECK(std::count(svg.begin(), svg.end(), '\n') > 10);
}

TEST_CASE("gpt: sample_next known values") {
  // logits {1, 3, 2, 3}: the max 3 is shared by ids 1 and 3; greedy takes the lower id
  std::vector<float> l = {1, 3, 2, 3};
  CHECK(sample_next(l, 0.0, 0, 0.9) == 1);
  CHECK(sample_next(l, 1.0, 1, 0.9) == 1);  // top_k 1 is greedy whatever u
  // temperature -> 0: exp((l - 3) / 1e-6) underflows to 0 except at the two maxima, each 1/2;
  // order 1, 3: u < 0.5 -> 1, u >= 0.5 -> 3
  CHECK(sample_next(l, 1e-6, 0, 0.2) == 1);
  CHECK(sample_next(l, 1e-6, 0, 0.7) == 3);
  // logits {0, ln 3}, temperature 1: p = {1/4, 3/4}, order id 1 then id 0: u < 0.75 -> 1
  std::vector<float> two = {0.0f, float(std::log(3.0))};
  CHECK(sample_next(two, 1.0, 0, 0.74) == 1);
  CHECK(sample_next(two, 1.0, 0, 0.76) == 0);
  // temperature 2 on {0, ln 4}: weights exp(0) = 1 and exp(ln 4 / 2) = 2: p = {1/3, 2/3}
  std::vector<float> t2 = {0.0f, float(std::log(4.0))};
  CHECK(sample_next(t2, 2.0, 0, 0.66) == 1);
  CHECK(sample_next(t2, 2.0, 0, 0.67) == 0);
  // top_k 2 of {5, 0, 4, 1}: ids 0 and 2 only, p = {e/(e+1), 1/(e+1)} = {0.731, 0.269}
  std::vector<float> four = {5, 0, 4, 1};
  CHECK(sample_next(four, 1.0, 2, 0.72) == 0);
  CHECK(sample_next(four, 1.0, 2, 0.74) == 2);
  CHECK(sample_next(four, 1.0, 2, 0.999999) == 2);  // never 1 or 3
  CHECK(sample_next(four, 1.0, 0, 0.999999) == 1);  // without top-k the smallest comes last
}

TEST_CASE("gpt: sample_next never returns an id whose logit is -inf") {
  const float inf = std::numeric_limits<float>::infinity();
  // {-inf, 0, ln 3}: p = {0, 1/4, 3/4}; order id 2 then id 1: u < 0.75 -> 2
  const std::vector<float> l = {-inf, 0.0f, float(std::log(3.0))};
  CHECK(sample_next(l, 1.0, 0, 0.74) == 2);
  CHECK(sample_next(l, 1.0, 0, 0.76) == 1);
  CHECK(sample_next(l, 0.5, 0, 0.999999) == 1);
  // u = 1: the cumulative sum never exceeds u Z, as rounding can make it for u just below 1; the
  // last id that can be drawn is returned, not the -inf one behind it (with top-k 3 of 3 too)
  CHECK(sample_next(l, 1.0, 0, 1.0) == 1);
  CHECK(sample_next(l, 1.0, 3, 1.0) == 1);
  // greedy: the largest finite logit
  CHECK(sample_next(std::vector<float>{-inf, -inf, -5.0f}, 0.0, 0, 0.5) == 2);
  AG_CHECK_ERROR(sample_next(std::vector<float>{-inf, -inf}, 1.0, 0, 0.5), "sample_next", "every one of the 2");
}

TEST_CASE("gpt: generation never samples a never-sampled id, even where the model favours it") {
  Generator gen(8);
  GPT model(tiny_config(), &gen);  // V 11, d 32
  // hand-built logits at every position: ln_f's output is all ones (weight 0, bias 1), the head's
  // row 0 all ones and the other rows zero, so l_0 = 32 and l_1 .. l_10 = 0: p_0 = 1 in float
  {
    NoGradGuard no_grad;
    int found = 0;
    for (auto& [name, p] : model.named_parameters()) {
      if (name == "ln_f.weight") p.fill_(0.0), ++found;
      if (name == "ln_f.bias") p.fill_(1.0), ++found;
    }
    REQUIRE(found == 2);
    model.head->weight.fill_(0.0);
    model.head->weight.narrow(0, 0, 1).fill_(1.0);
  }
  const std::vector<int64_t> prompt = {3, 4};
  auto new_tokens = [&](const GenerateOptions& g, int64_t n) {
    const std::vector<int64_t> ids = generate(model, prompt, n, g);
    return std::vector<int64_t>(ids.begin() + 2, ids.end());
  };
  // unmasked, the model writes id 0 and nothing else
  CHECK(new_tokens({.temperature = 1.0, .seed = 3}, 50) == std::vector<int64_t>(50, 0));
  // masked: ids 1..10, equally likely; 200 draws miss one of them with probability 10 x 0.9^200 < 1e-8
  const std::vector<int64_t> masked = new_tokens({.temperature = 1.0, .seed = 3, .never = {0}}, 200);
  CHECK(std::set<int64_t>(masked.begin(), masked.end()) == std::set<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(new_tokens({.temperature = 1.0, .seed = 3, .kv_cache = false, .never = {0}}, 200) == masked);
  // the mask comes before top-k: the 3 largest of the ids that may be drawn are 1, 2, 3 (ties go to
  // the lower id), not 0, 1, 2 with 0 then dropped
  const std::vector<int64_t> top3 = new_tokens({.temperature = 1.0, .top_k = 3, .seed = 4, .never = {0}}, 100);
  CHECK(std::set<int64_t>(top3.begin(), top3.end()) == std::set<int64_t>{1, 2, 3});
  // greedy: the lowest of the tied ids left
  CHECK(new_tokens({.temperature = 0.0, .never = {0}}, 20) == std::vector<int64_t>(20, 1));
  CHECK(new_tokens({.temperature = 0.0, .never = {0, 1, 2}}, 20) == std::vector<int64_t>(20, 3));
  std::vector<int64_t> every(11);
  std::iota(every.begin(), every.end(), int64_t(0));
  AG_CHECK_ERROR(generate(model, prompt, 4, {.never = {11}}), "generate", "never-sampled id 11", "[0, 11)");
  AG_CHECK_ERROR(generate(model, prompt, 4, {.never = every}), "generate", "all 11 ids");
}

TEST_CASE("gpt: cached and uncached generation produce identical tokens past the context") {
  Generator gen(3);
  GPT model(tiny_config(), &gen);
  const std::vector<int64_t> prompt = {1, 2, 3};
  // 3 + 40 tokens > context 16: the window restarts at the last 8 tokens several times
  for (int64_t top_k : {0, 5}) {
    CAPTURE(top_k);
    std::vector<int64_t> cached = generate(model, prompt, 40, {.temperature = 1.0, .top_k = top_k, .seed = 42});
    std::vector<int64_t> plain =
        generate(model, prompt, 40, {.temperature = 1.0, .top_k = top_k, .seed = 42, .kv_cache = false});
    REQUIRE(cached.size() == 43);
    CHECK(std::vector<int64_t>(cached.begin(), cached.begin() + 3) == prompt);
    CHECK(cached == plain);
    CHECK(std::set<int64_t>(cached.begin() + 3, cached.end()).size() > 3);  // really sampled
  }
  CHECK(model.is_training());  // restored
  // greedy too (no randomness: the logits alone decide), past the context
  CHECK(generate(model, prompt, 40, {.temperature = 0.0, .seed = 1}) ==
        generate(model, prompt, 40, {.temperature = 0.0, .seed = 1, .kv_cache = false}));
}

TEST_CASE("gpt: temperature -> 0 and top_k 1 are greedy argmax") {
  Generator gen(4);
  GPT model(tiny_config(), &gen);
  model.eval();
  const std::vector<int64_t> prompt = {5, 0, 7};
  std::vector<int64_t> greedy = greedy_reference(model, prompt, 12);  // 15 <= context 16
  CHECK(generate(model, prompt, 12, {.temperature = 1e-7, .seed = 9}) == greedy);
  CHECK(generate(model, prompt, 12, {.temperature = 1e-7, .seed = 9, .kv_cache = false}) == greedy);
  CHECK(generate(model, prompt, 12, {.temperature = 0.0, .seed = 9}) == greedy);
  CHECK(generate(model, prompt, 12, {.temperature = 1.0, .top_k = 1, .seed = 9}) == greedy);
  CHECK(generate(model, prompt, 12, {.temperature = 5.0, .top_k = 1, .seed = 123, .kv_cache = false}) == greedy);
}

TEST_CASE("gpt: sampling is deterministic for a seed and changes with it") {
  Generator gen(5);
  GPT model(tiny_config(), &gen);
  std::vector<int64_t> a = generate(model, {1}, 40, {.temperature = 1.0, .seed = 7});
  CHECK(generate(model, {1}, 40, {.temperature = 1.0, .seed = 7}) == a);
  CHECK(generate(model, {1}, 40, {.temperature = 1.0, .seed = 8}) != a);
  CHECK(generate(model, {1}, 0, {.temperature = 1.0, .seed = 7}) == std::vector<int64_t>{1});
  AG_CHECK_ERROR(generate(model, {}, 4, {.temperature = 1.0, .seed = 7}), "generate", "prompt is empty");
  AG_CHECK_ERROR(generate(model, {1, 11}, 4, {.temperature = 1.0, .seed = 7}), "generate", "token 11", "[0, 11)");
  AG_CHECK_ERROR(generate(model, {1}, -1, {.temperature = 1.0, .seed = 7}), "generate", "-1");
}

TEST_CASE("gpt: forward_backward is the batch's mean next-token loss, scaled for backward by the loss scale") {
  std::string text;
  for (int i = 0; i < 40; ++i) text += i % 3 ? "the cat sat. " : "a dog ran! ";
  const LMData d = make_lm_data(text);
  GPTConfig c = tiny_config();
  c.vocab = d.tokenizer.vocab_size();
  Generator gen(2);
  GPT model(c, &gen);
  optim::AdamW opt(model.parameters(), {});
  const data::Windows w = train_windows(d.train, 4, 8, 5, 3);  // 4 windows of 8, seed 5, step 3
  REQUIRE(w.x.shape() == Shape{4, 8});
  auto grads = [&] {
    std::vector<std::vector<float>> g;
    for (const Tensor& p : model.parameters()) g.push_back(p.grad().contiguous().to_vector<float>());
    return g;
  };
  // the loss by hand: the cross-entropy of each of the 32 positions against the next token, averaged
  double ref = 0;
  {
    NoGradGuard no_grad;
    const std::vector<float> logits = model.forward(w.x).contiguous().to_vector<float>();
    const std::vector<int64_t> y = w.y.to_vector<int64_t>();
    const size_t V = size_t(c.vocab);
    for (size_t n = 0; n < 32; ++n) {
      double m = -1e30, z = 0;
      for (size_t v = 0; v < V; ++v) m = std::max(m, double(logits[n * V + v]));
      for (size_t v = 0; v < V; ++v) z += std::exp(double(logits[n * V + v]) - m);
      ref += (m + std::log(z) - double(logits[n * V + size_t(y[n])])) / 32;
    }
  }
  const double loss = forward_backward(model, opt, w);
  CHECK(loss == doctest::Approx(ref).epsilon(1e-5));  // f32 logits and loss, f64 here
  const auto g1 = grads();
  // fp16's loss scale: backward from 4 x the loss, the loss itself returned; x4 is exact in floating
  // point, so every gradient is 4 x the unscaled one bit for bit (and zeroed first: not 5 x)
  CHECK(forward_backward(model, opt, w, 4.0) == loss);
  const auto g4 = grads();
  for (size_t i = 0; i < g1.size(); ++i)
    for (size_t j = 0; j < g1[i].size(); ++j) REQUIRE(g4[i][j] == 4 * g1[i][j]);
  // data parallel: rank r of 2 takes windows [2r, 2r + 2) of the same global batch, and the mean of
  // the two slices' gradients is the global batch's (each slice's loss is its own mean)
  const data::Windows w0 = train_windows(d.train, 4, 8, 5, 3, 0, 2), w1 = train_windows(d.train, 4, 8, 5, 3, 1, 2);
  std::vector<int64_t> both = w0.x.to_vector<int64_t>(), second = w1.x.to_vector<int64_t>();
  both.insert(both.end(), second.begin(), second.end());
  CHECK(both == w.x.to_vector<int64_t>());
  forward_backward(model, opt, w0);
  const auto a = grads();
  forward_backward(model, opt, w1);
  const auto b = grads();
  for (size_t i = 0; i < g1.size(); ++i) {
    std::vector<double> mean(g1[i].size()), whole(g1[i].begin(), g1[i].end());
    for (size_t j = 0; j < mean.size(); ++j) mean[j] = (double(a[i][j]) + double(b[i][j])) / 2;
    check_close(mean, whole, 1e-6, 1e-4);  // f32 sums over 16 and 32 positions, in other orders
  }
}

TEST_CASE("gpt: a few AdamW steps of the app's step learn a periodic text") {
  // "abcd" repeated: after a few steps the next character is predictable, the loss falls from
  // about log 5 (vocabulary {<unk>, a, b, c, d}) towards 0
  std::string text;
  for (int i = 0; i < 100; ++i) text += "abcd";
  LMData d = make_lm_data(text);
  GPTConfig c = tiny_config();
  c.vocab = d.tokenizer.vocab_size(), c.n_layers = 1;
  Generator gen(1);
  GPT model(c, &gen);
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  std::vector<int64_t> starts = eval_starts(int64_t(d.valid.size()), 8, 4);
  const double before = lm_loss(model, d.valid, starts, 8, 4);
  for (int64_t step = 0; step < 30; ++step) {  // main's loop, with Run::optimizer_step's clip and update
    forward_backward(model, opt, train_windows(d.train, 8, 8, 1, step));
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
  }
  const double after = lm_loss(model, d.valid, starts, 8, 4);
  CHECK(before > 1.3);
  CHECK(after < 0.2);
  // the trained model continues the pattern greedily
  CHECK(d.tokenizer.decode(generate(model, d.tokenizer.encode("abc"), 9, {.temperature = 0.0})) == "abcdabcdabcd");
}

TEST_CASE("gpt: attention_maps are causal rows of probabilities with token labels") {
  Generator gen(6);
  data::CharTokenizer tok = data::CharTokenizer::from_text("\n abcdefghi");  // 11 codepoints -> vocab 12
  GPTConfig c = tiny_config();
  c.vocab = tok.vocab_size();
  GPT m(c, &gen);
  std::vector<int64_t> ids = tok.encode("a b\ncab ca");  // 10 tokens
  std::vector<Heatmap> maps = attention_maps(m, ids, tok, 6);
  REQUIRE(maps.size() == 4);
  CHECK(maps[3].title == "head 3");
  CHECK(maps[0].rows == 6);
  CHECK(maps[0].cols == 6);
  // the last 6 tokens of "a b\ncab ca" are "cab ca"
  CHECK(maps[0].row_labels == std::vector<std::string>{"c", "a", "b", "\u2423", "c", "a"});
  for (const Heatmap& h : maps)
    for (int r = 0; r < h.rows; ++r) {
      double sum = 0;
      for (int k = 0; k < h.cols; ++k) {
        double v = h.values[size_t(r * h.cols + k)];
        if (k > r) CHECK(v == 0.0);  // causal: no query sees a later key
        sum += v;
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    }
  CHECK_FALSE(m.need_weights);
  CHECK(token_label(tok, tok.encode("\n")[0]) == "\\n");
  CHECK(token_label(tok, tok.encode("b")[0]) == "b");
  CHECK(svg_heatmaps(maps).find("<svg") != std::string::npos);
  AG_CHECK_ERROR(attention_maps(m, {}, tok), "attention_maps", "no tokens");
}

TEST_CASE("gpt: config JSON round trip and data errors") {
  GPTConfig c = tiny_config();
  c.dropout = 0.1;
  GPTConfig back = gpt_config_from_json(gpt_config_to_json(c));
  CHECK(back.vocab == 11);
  CHECK(back.context == 16);
  CHECK(back.d_model == 32);
  CHECK(back.n_heads == 4);
  CHECK(back.n_layers == 2);
  CHECK(back.mlp_hidden == 64);
  CHECK(back.dropout == 0.1);
  nlohmann::json j = gpt_config_to_json(c);
  // the choices at their defaults are not written: configs of older checkpoints still match
  CHECK_FALSE(j.contains("pos"));
  CHECK_FALSE(j.contains("kv_heads"));
  CHECK_FALSE(j.contains("norm"));
  CHECK(back.pos == "learned");
  c.pos = "rope", c.kv_heads = 2, c.mlp_kind = "swiglu", c.norm = "rmsnorm";
  const GPTConfig modern = gpt_config_from_json(gpt_config_to_json(c));
  CHECK(modern.pos == "rope");
  CHECK(modern.kv_heads == 2);
  CHECK(modern.mlp_kind == "swiglu");
  CHECK(modern.norm == "rmsnorm");
  nlohmann::json bad = gpt_config_to_json(c);
  bad["pos"] = "relative";
  AG_CHECK_ERROR(gpt_config_from_json(bad), "gpt config", "'pos'", "relative", "learned, sinusoidal, rope, alibi");
  j.erase("n_heads");
  AG_CHECK_ERROR(gpt_config_from_json(j), "gpt config", "n_heads");
  // the run's config as a checkpoint saves it, and what --eval-only reads back from it
  const TextSource src{.dataset = "fortunes", .text_file = "", .data_dir = "/somewhere"};
  const nlohmann::json run = gpt_run_config(c, src, 64, 7, false);
  CHECK(run.at("data") == nlohmann::json{{"dataset", "fortunes"}, {"text_file", ""}, {"valid_fraction", 0.1}});
  CHECK(run.at("train") == nlohmann::json{{"batch", 64}, {"seed", 7}});  // grad_checkpointing only when on
  CHECK(gpt_run_config(c, src, 64, 7, true).at("train").at("grad_checkpointing") == true);
  const data::CharTokenizer tok = data::CharTokenizer::from_text("abc");
  const GptCheckpoint ck = read_gpt_checkpoint(run, {{"tokenizer", tok.to_json()}}, "f.safetensors");
  CHECK(ck.model.pos == "rope");
  CHECK(ck.text.dataset == "fortunes");
  CHECK(ck.text.data_dir.empty());  // where the text is comes from the command line, not the file
  CHECK(ck.tokenizer.to_json() == tok.to_json());
  AG_CHECK_ERROR(read_gpt_checkpoint(run, {}, "f.safetensors"), "'f.safetensors' is not a gpt checkpoint");
  nlohmann::json no_text_file = run;
  no_text_file["data"].erase("text_file");
  AG_CHECK_ERROR(read_gpt_checkpoint(no_text_file, {{"tokenizer", tok.to_json()}}, "f"), "gpt", "'text_file'");

  TempDir tmp("gpt");
  write_bytes(tmp.file("t.txt"), "hello\nworld\n");
  CHECK(load_gpt_text("bible", tmp.file("t.txt"), tmp.file("cache"), tmp.file("none")) == "hello\nworld\n");
  CHECK_FALSE(missing_gpt_data("bible", tmp.file("t.txt"), tmp.file("cache"), tmp.file("none")).has_value());
  auto missing = missing_gpt_data("fortunes", "", tmp.file("cache"), tmp.file("none"));
  REQUIRE(missing.has_value());
  CHECK(missing->find("apt-get install fortunes") != std::string::npos);
  auto no_file = missing_gpt_data("bible", tmp.file("nope.txt"), tmp.file("cache"), tmp.file("none"));
  REQUIRE(no_file.has_value());
  CHECK(no_file->find("nope.txt") != std::string::npos);
  // a cached bible text is used without the program
  std::filesystem::create_directories(tmp.file("cache"));
  write_bytes(tmp.file("cache") + "/bible-kjv.txt", "In the beginning");
  CHECK_FALSE(missing_gpt_data("bible", "", tmp.file("cache"), tmp.file("none")).has_value());
  AG_CHECK_ERROR(load_gpt_text("poems", "", tmp.file("cache"), tmp.file("none")), "load_gpt_text", "poems");
}

TEST_CASE("gpt: the command line is checked before any text is read") {
  GPTConfig c0;  // the defaults: context 128, d 128, 4 heads
  const SampleSettings s0;
  CHECK_NOTHROW(validate_gpt_config(c0, 256, s0));
  auto with_model = [&](auto edit) {
    GPTConfig c = c0;
    edit(c);
    return [=] { validate_gpt_config(c, 256, s0); };
  };
  auto with_sample = [&](auto edit) {
    SampleSettings s = s0;
    edit(s);
    return [=] { validate_gpt_config(c0, 256, s); };
  };
  check_usage_error(with_model([](auto& c) { c.n_heads = 3; }), {"gpt:", "--heads 3", "--d-model 128"});
  check_usage_error(with_model([](auto& c) { c.kv_heads = 3; }), {"gpt:", "--kv-heads 3", "--heads 4"});
  check_usage_error(with_model([](auto& c) { c.pos = "rope", c.d_model = 12; }), {"gpt:", "--pos rope", "= 3"});
  check_usage_error(with_model([](auto& c) { c.context = 0; }), {"--context 0"});
  check_usage_error(with_model([](auto& c) { c.context = 4097; }), {"--context 4097"});
  check_usage_error(with_model([](auto& c) { c.d_model = 0; }), {"--d-model 0"});
  check_usage_error(with_model([](auto& c) { c.n_layers = 0; }), {"--layers 0"});
  check_usage_error(with_model([](auto& c) { c.mlp_hidden = -1; }), {"--mlp -1"});
  check_usage_error([&] { validate_gpt_config(c0, 0, s0); }, {"--eval-windows 0"});
  check_usage_error(with_sample([](auto& s) { s.tokens = -1; }), {"--sample-tokens -1"});
  check_usage_error(with_sample([](auto& s) { s.temperature = -0.5; }), {"--temperature -0.5"});
  check_usage_error(with_sample([](auto& s) { s.top_k = -1; }), {"--top-k -1"});
  check_usage_error(with_sample([](auto& s) { s.seed = -2; }), {"--sample-seed -2"});
}

TEST_CASE("gpt: the binary exits 2 with one line for --eval-lengths without --eval-only, and for a bad --pos") {
  TempDir dir("gpt_cli");
  const std::string out = dir.file("run"), err = dir.file("stderr.txt");
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/gpt' " + args + " --out '" + out +
                            "' > /dev/null 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == kExitUsage);
    return read_bytes(err);
  };
  CHECK(run("--eval-lengths 128,256") ==
        "gpt: --eval-lengths 128,256: works with --eval-only --checkpoint FILE (gpt --help lists every option)\n");
  CHECK(run("--pos relative").find("--pos: relative not in {learned,sinusoidal,rope,alibi}") != std::string::npos);
  CHECK(run("--kv-heads 3").find("--kv-heads 3 does not divide --heads 4") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));  // nothing started
}
