// The sample models (apps/gpt, apps/vit, apps/textclf model.h): names (the PyTorch twins' names), sizes, masks,
// the KV-cache decode, the initialisation, and the text classifier's subword n-grams (formula,
// gradient, padding rows, errors).
#include <cmath>

#include "apps/gpt/model.h"
#include "apps/textclf/model.h"
#include "apps/vit/model.h"
#include "attograd.h"
#include "optim/adam.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

bool has_name(const nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters())
    if (n == name) return true;
  return false;
}

double max_abs(const Tensor& t) { return max(abs(t.contiguous())).item<float>(); }

}  // namespace

TEST_CASE("models: ViT parameter names and count") {
  ViT vit(ViTConfig{});
  // patch 3136+64, cls 64, pos 17*64, 4 blocks of 49984, norm 128, head 650 (see the config)
  CHECK(vit.num_parameters() == 3200 + 64 + 1088 + 4 * 49984 + 128 + 650);
  for (const char* n : {"patch.proj.weight", "patch.cls_token", "pos_embed", "blocks.0.ln1.weight",
                        "blocks.3.attn.qkv.weight", "blocks.3.attn.proj.bias", "blocks.2.mlp.fc2.weight",
                        "norm.bias", "head.weight"})
    CHECK_MESSAGE(has_name(vit, n), n);
  Tensor logits = vit.forward(randn({2, 1, 28, 28}));
  CHECK(logits.shape() == Shape{2, 10});
  AG_CHECK_ERROR(vit.forward(randn({2, 3, 28, 28})), "ViT", "[2,3,28,28]");
}

TEST_CASE("models: GPT-2 style initialisation") {
  Generator gen(7);
  GPTConfig c;
  c.n_layers = 2, c.d_model = 64, c.mlp_hidden = 256;
  GPT gpt(c, &gen);
  CHECK_FALSE(has_name(gpt, "head.bias"));
  auto stddev = [](const Tensor& t) { return std::sqrt(var(t.to(DType::f64)).item<double>()); };
  for (const auto& [name, p] : gpt.named_parameters()) {
    if (name == "blocks.0.attn.proj.weight" || name == "blocks.1.mlp.fc2.weight")
      CHECK(stddev(p) == doctest::Approx(0.02 / std::sqrt(4.0)).epsilon(0.1));
    else if (name == "wte.weight" || name == "blocks.1.mlp.fc1.weight")
      CHECK(stddev(p) == doctest::Approx(0.02).epsilon(0.1));
    else if (name == "blocks.0.ln1.weight")
      CHECK(max_abs(p - 1.0) == 0.0);
    else if (name == "blocks.0.attn.qkv.bias")
      CHECK(max_abs(p) == 0.0);
  }
}

TEST_CASE("models: GPT decoding with KV caches equals the full causal forward, for every position scheme") {
  for (const char* pos : {"learned", "sinusoidal", "rope", "alibi"}) {
    CAPTURE(pos);
    Generator gen(3);
    GPTConfig c;
    c.vocab = 11, c.context = 16, c.d_model = 32, c.n_heads = 4, c.n_layers = 2, c.mlp_hidden = 64;
    c.pos = pos;
    if (std::string(pos) != "learned") c.kv_heads = 2, c.mlp_kind = "swiglu", c.norm = "rmsnorm";
    GPT gpt(c, &gen);
    CHECK((gpt.wpe != nullptr) == (std::string(pos) == "learned"));
    gpt.eval();
    NoGradGuard no_grad;
    Tensor idx = randint(0, c.vocab, {2, 9}, &gen);
    Tensor full = gpt.forward(idx);  // (2, 9, 11)
    if (std::string(pos) == "sinusoidal") {  // by hand: wte sqrt(d) + PE, the blocks, ln_f, head
      Tensor h = gpt.wte->forward(idx) * std::sqrt(32.0) + nn::sinusoidal_positions(9, 32);
      for (size_t i = 0; i < gpt.blocks->size(); ++i) h = (*gpt.blocks)[i].forward(h);
      check_close(full, gpt.head->forward(gpt.ln_f->forward(h)), 1e-5, 1e-5);
    }
    std::vector<nn::KVCache> caches(size_t(c.n_layers));
    // a 4-token prompt, then one token at a time
    Tensor first = gpt.forward(idx.narrow(1, 0, 4), &caches);
    check_close(first, full.narrow(1, 0, 4), 1e-5, 1e-5);
    for (int64_t t = 4; t < 9; ++t)
      check_close(gpt.forward(idx.narrow(1, t, 1), &caches), full.narrow(1, t, 1), 1e-5, 1e-5);
    CHECK(caches[1].length() == 9);
    CHECK(caches[1].k.size(1) == (std::string(pos) == "learned" ? 4 : 2));  // the cache holds kv_heads
    const Tensor more = randint(0, c.vocab, {2, 8}, &gen);
    if (std::string(pos) == "learned") {
      AG_CHECK_ERROR(gpt.forward(more, &caches), "GPT", "positions 9..16 exceed the 16 learned positions");
      AG_CHECK_ERROR(gpt.forward(randint(0, c.vocab, {1, 17}, &gen)), "exceed the 16 learned positions");
    } else {  // past the context: the same as one forward over all 17 tokens
      const Tensor all = gpt.forward(cat({idx, more}, 1));
      check_close(gpt.forward(more, &caches), all.narrow(1, 9, 8), 1e-5, 1e-5);
    }
  }
}

TEST_CASE("models: TextClassifier ignores padding and pools over valid tokens") {
  Generator gen(5);
  TextClassifierConfig c;
  c.vocab = 30, c.max_len = 12, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 32, c.dropout = 0.0;
  TextClassifier model(c, &gen);
  model.eval();
  CHECK(max_abs(model.tok->weight.select(0, 0)) == 0.0);  // padding row
  Tensor tokens = randint(1, c.vocab, {3, 7}, &gen);
  Tensor lengths = tensor<int64_t>({7, 4, 1});
  // zero the padded slots (id 0) in one copy, put random ids there in the other
  Tensor valid = lt(arange(7).reshape({1, 7}), lengths.reshape({-1, 1}));
  Tensor padded = where(valid, tokens, zeros({3, 7}, DType::i64));
  Tensor noisy = where(valid, tokens, randint(1, c.vocab, {3, 7}, &gen));
  Tensor a = model.forward(padded, lengths), b = model.forward(noisy, lengths);
  check_close(a, b, 1e-6, 1e-6);
  // the first sequence alone, unpadded, gives the same logits as inside the batch
  Tensor one = model.forward(padded.narrow(0, 1, 1).narrow(1, 0, 4), tensor<int64_t>({4}));
  check_close(one, a.narrow(0, 1, 1), 1e-5, 1e-5);
  AG_CHECK_ERROR(model.forward(padded, tensor<int64_t>({7, 4})), "TextClassifier", "lengths");
}

// ---- TextClassifier with subword n-grams ---------------------------------------------------------

TEST_CASE("models: subword_sum is a word's vector plus its n-grams' vectors (f64)") {
  // B 2, T 2, G 3, d 2; tok and ngram tables as f64 leaves below a zero padding row (as the
  // model keeps them), embedded with the plain embedding op
  Tensor tok_w = ag::test::leaf64({4, 2}, 1), ngram_w = ag::test::leaf64({6, 2}, 2);
  Tensor tokens = tensor<int64_t>({2, 4, 1, 0}).reshape({2, 2});
  Tensor ngrams = tensor<int64_t>({3, 5, 0, /**/ 6, 6, 2, /**/ 6, 6, 2, /**/ 0, 0, 0}).reshape({2, 2, 3});
  auto with_pad = [](const Tensor& w) { return cat({zeros({1, 2}, DType::f64), w}, 0); };
  auto f = [&](const std::vector<Tensor>& in) { return subword_sum(with_pad(in[0]), with_pad(in[1]), tokens, ngrams); };
  Tensor e = f({tok_w, ngram_w});
  REQUIRE(e.shape() == Shape{2, 2, 2});
  // by hand: tok[2] + ng[3] + ng[5]; tok[4] + 2 ng[6] + ng[2] (a repeated id counts twice);
  // tok[1] + 2 ng[6] + ng[2] (the same n-gram row, another word: one sum S_u, two tokens);
  // 0 (padding, whose rows are zero)
  auto row = [](const Tensor& w, int64_t i) { return w.detach().select(0, i - 1); };  // id i, i >= 1
  check_close(e.select(0, 0).select(0, 0), row(tok_w, 2) + row(ngram_w, 3) + row(ngram_w, 5), 1e-12, 1e-12);
  check_close(e.select(0, 0).select(0, 1), row(tok_w, 4) + row(ngram_w, 6) * 2.0 + row(ngram_w, 2), 1e-12, 1e-12);
  check_close(e.select(0, 1).select(0, 0), row(tok_w, 1) + row(ngram_w, 6) * 2.0 + row(ngram_w, 2), 1e-12, 1e-12);
  check_close(e.select(0, 1).select(0, 1), zeros({2}, DType::f64), 1e-12, 1e-12);
  expect_gradcheck(f, {tok_w, ngram_w});
  // the padding rows get no gradient, even when they are not zero
  Tensor tok_full = ag::test::leaf64({5, 2}, 3), ngram_full = ag::test::leaf64({7, 2}, 4);
  sum(subword_sum(tok_full, ngram_full, tokens, ngrams)).backward();
  CHECK(max(abs(tok_full.grad().select(0, 0))).item<double>() == 0.0);
  CHECK(max(abs(ngram_full.grad().select(0, 0))).item<double>() == 0.0);
  CHECK(max(abs(ngram_full.grad().select(0, 6))).item<double>() > 0.0);
  AG_CHECK_ERROR(subword_sum(tok_full, ngram_full, tokens, ngrams.narrow(1, 0, 1)), "TextClassifier subword_sum",
                 "[2,1,3]", "[2,2]");
  AG_CHECK_ERROR(subword_sum(tok_full, ngram_full.narrow(1, 0, 1), tokens, ngrams), "TextClassifier subword_sum",
                 "[7,1]");
}

TEST_CASE("models: TextClassifier with n-grams: shape, gradient, zero padding rows, invariances, errors") {
  Generator gen(9);
  TextClassifierConfig c;
  c.vocab = 20, c.max_len = 8, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 1, c.mlp_hidden = 32;
  c.dropout = 0.0, c.ngram_buckets = 50, c.ngram_min = 2, c.ngram_max = 3, c.ngrams_per_token = 4;
  TextClassifier model(c, &gen);
  CHECK(has_name(model, "ngram.weight"));
  CHECK(model.ngram->weight.shape() == Shape{51, 16});
  CHECK(max_abs(model.ngram->weight.select(0, 0)) == 0.0);
  Tensor tokens = tensor<int64_t>({3, 1, 7, 0, 5, 2, 0, 0}).reshape({2, 4});
  Tensor lengths = tensor<int64_t>({3, 2});
  Tensor ngrams = randint(1, 51, {2, 4, 4}, &gen);
  ngrams = where(lt(arange(4).reshape({1, 1, 4}), tensor<int64_t>({4, 2, 3, 0, 1, 4, 0, 0}).reshape({2, 4, 1})),
                 ngrams, zeros({2, 4, 4}, DType::i64));  // rows of 4, 2, 3, 0, 1, 4 n-grams, padding none
  Tensor logits = model.forward(tokens, lengths, ngrams);
  CHECK(logits.shape() == Shape{2, 3});
  // the gradient reaches the n-gram rows used, not the padding row
  sum(logits * randn({2, 3}, DType::f32, &gen)).backward();
  Tensor g = model.ngram->weight.grad();
  REQUIRE(g.defined());
  CHECK(max_abs(g) > 0.0);
  CHECK(max_abs(g.select(0, 0)) == 0.0);
  // a training step keeps the padding rows zero
  optim::AdamW opt(model.parameters(), {.lr = 0.1, .weight_decay = 0.1});
  opt.step();
  CHECK(max_abs(model.ngram->weight.select(0, 0)) == 0.0);
  CHECK(max_abs(model.tok->weight.select(0, 0)) == 0.0);
  // n-gram order within a token and extra padding columns change nothing
  NoGradGuard no_grad;
  Tensor ref = model.forward(tokens, lengths, ngrams);
  Tensor flipped = cat({ngrams.narrow(2, 2, 2), ngrams.narrow(2, 0, 2)}, 2).contiguous();
  Tensor wider = cat({zeros({2, 4, 3}, DType::i64), ngrams}, 2);
  check_close(model.forward(tokens, lengths, flipped), ref, 1e-5, 1e-5);
  check_close(model.forward(tokens, lengths, wider), ref, 1e-5, 1e-5);
  // ...but the n-grams do count
  CHECK(max_abs(model.forward(tokens, lengths, zeros({2, 4, 1}, DType::i64)) - ref) > 1e-4);
  AG_CHECK_ERROR(model.forward(tokens, lengths), "TextClassifier", "n-gram ids i64 [2, 4, G]", "none");
  AG_CHECK_ERROR(model.forward(tokens, lengths, ngrams.narrow(1, 0, 3)), "TextClassifier", "[2,3,4]");
  TextClassifierConfig off = c;
  off.ngram_buckets = 0;
  TextClassifier plain(off, &gen);
  CHECK(plain.ngram == nullptr);
  CHECK_FALSE(has_name(plain, "ngram.weight"));
  AG_CHECK_ERROR(plain.forward(tokens, lengths, ngrams), "TextClassifier", "ngram_buckets 0", "[2,4,4]");
}
