// Attention diagnostics (nn/diagnostics.h) on constructed weights that trigger each check, on
// hand-computed statistics, with padding and causal masks, and on the capture of a real model.
#include <cmath>
#include <functional>
#include <string>

#include "nn/diagnostics.h"
#include "nn/sequential.h"
#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// weights (1, H, T, T) with row i of head h given by row(h, i) (T values)
Tensor make_weights(int64_t H, int64_t T, const std::function<std::vector<double>(int64_t, int64_t)>& row) {
  std::vector<double> w;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> r = row(h, i);
      w.insert(w.end(), r.begin(), r.end());
    }
  return from_vector(w, {1, H, T, T});
}

// 0.6 on key (i + shift) mod T, the rest spread evenly: a sharp but not one-hot pattern
std::vector<double> shifted(int64_t T, int64_t i, int64_t shift) {
  std::vector<double> r(size_t(T), 0.4 / double(T - 1));
  r[size_t(((i + shift) % T + T) % T)] = 0.6;
  return r;
}

bool has_check(const std::vector<nn::AttentionWarning>& ws, const std::string& check) {
  for (const auto& w : ws)
    if (w.check == check) return true;
  return false;
}

}  // namespace

TEST_CASE("diagnostics: uniform weights are near-uniform (init or learning rate)") {
  Tensor w = make_weights(2, 4, [](int64_t, int64_t) { return std::vector<double>(4, 0.25); });
  nn::LayerAttentionStats s = nn::attention_stats(w, {}, "blocks.0.attn");
  REQUIRE(s.heads.size() == 2);
  CHECK(s.rows == 4);
  CHECK(s.heads[0].entropy == doctest::Approx(1.0));
  CHECK(s.heads[0].diagonal == doctest::Approx(0.25));
  CHECK(s.heads[0].uniform_diagonal == doctest::Approx(0.25));
  CHECK(s.heads[0].max_similarity == doctest::Approx(1.0));
  auto ws = nn::check_attention(s);
  REQUIRE(ws.size() == 1);  // two uniform heads are alike, but that is the uniform warning's to say
  CHECK(ws[0].check == "near_uniform");
  CHECK(ws[0].heads == std::vector<int64_t>{0, 1});
  CHECK(ws[0].message ==
        "blocks.0.attn: heads 0, 1 near-uniform (normalised entropy 1.00, 1.00 >= 0.90): suspect the initialisation "
        "or a too-high learning rate");
}

TEST_CASE("diagnostics: an identity map has a strong diagonal (positional encoding)") {
  Tensor w = make_weights(2, 4, [](int64_t, int64_t i) {
    std::vector<double> r(4, 0.0);
    r[size_t(i)] = 1.0;
    return r;
  });
  nn::LayerAttentionStats s = nn::attention_stats(w, {}, "enc");
  CHECK(s.heads[1].entropy == doctest::Approx(0.0));
  CHECK(s.heads[1].diagonal == doctest::Approx(1.0));
  auto ws = nn::check_attention(s);
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].check == "strong_diagonal");
  CHECK(ws[0].heads == std::vector<int64_t>{0, 1});
  CHECK(ws[0].message.find("diagonal mass 1.00, 1.00 >= 0.50): suspect the positional encoding") != std::string::npos);
}

TEST_CASE("diagnostics: identical heads are similar heads, distinct sharp heads pass every check") {
  // three copies of one healthy pattern
  Tensor same = make_weights(3, 5, [](int64_t, int64_t i) { return shifted(5, i, 1); });
  nn::LayerAttentionStats s = nn::attention_stats(same, {}, "blocks.1.attn");
  CHECK(s.heads[0].entropy < 0.9);
  CHECK(s.heads[0].diagonal < 0.5);
  CHECK(s.heads[2].max_similarity == doctest::Approx(1.0));
  auto ws = nn::check_attention(s);
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].check == "similar_heads");
  CHECK(ws[0].heads == std::vector<int64_t>{0, 1, 2});
  CHECK(ws[0].message ==
        "blocks.1.attn: heads 0, 1, 2 have near-identical maps (similarity 1.00 >= 0.95): the heads did not "
        "differentiate (blocky, repeated patterns)");

  // each head looks somewhere else: no warning at all
  Tensor mixed = make_weights(3, 5, [](int64_t h, int64_t i) { return shifted(5, i, h == 2 ? -1 : h + 1); });
  nn::LayerAttentionStats m = nn::attention_stats(mixed, {}, "blocks.1.attn");
  CHECK(m.heads[0].max_similarity < 0.8);
  CHECK(nn::check_attention(m).empty());
  // the same heads, judged with a looser similarity threshold, are flagged: the threshold is what decides
  nn::AttentionThresholds loose;
  loose.head_similarity = m.heads[0].max_similarity - 1e-9;
  CHECK(has_check(nn::check_attention(m, loose), "similar_heads"));
}

TEST_CASE("diagnostics: entropy and diagonal mass equal hand-computed values under a causal mask") {
  // one head, T = 3, causal: row 0 sees one key (left out); rows 1 and 2 are measured
  Tensor w = from_vector(std::vector<double>{1, 0, 0, 0.25, 0.75, 0, 0.5, 0.25, 0.25}, {1, 1, 3, 3});
  nn::AttentionMask mask;
  mask.causal = true;
  nn::LayerAttentionStats s = nn::attention_stats(w, mask);
  CHECK(s.rows == 2);
  // row 1: -(0.25 ln 0.25 + 0.75 ln 0.75) / ln 2;  row 2: -(0.5 ln 0.5 + 2 * 0.25 ln 0.25) / ln 3
  const double e1 = -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)) / std::log(2.0);
  const double e2 = -(0.5 * std::log(0.5) + 0.5 * std::log(0.25)) / std::log(3.0);
  CHECK(s.heads[0].entropy == doctest::Approx((e1 + e2) / 2).epsilon(1e-12));
  CHECK(s.heads[0].diagonal == doctest::Approx((0.75 + 0.25) / 2).epsilon(1e-12));
  CHECK(s.heads[0].uniform_diagonal == doctest::Approx((1.0 / 2 + 1.0 / 3) / 2).epsilon(1e-12));
  CHECK(s.heads[0].most_similar == -1);  // one head: nothing to compare with

  // similarity of [0.5, 0.5] and [1, 0]: M = [0.75, 0.25],
  // JSD = (0.5 log2(0.5/0.75) + 0.5 log2(0.5/0.25) + log2(1/0.75)) / 2
  Tensor two = from_vector(std::vector<double>{0.5, 0.5, 1, 0}, {1, 2, 1, 2});
  nn::LayerAttentionStats t = nn::attention_stats(two);
  const double jsd = (0.5 * std::log2(0.5 / 0.75) + 0.5 * std::log2(0.5 / 0.25) + std::log2(1 / 0.75)) / 2;
  CHECK(t.similarity[1] == doctest::Approx(1 - jsd).epsilon(1e-12));
  CHECK(t.heads[0].most_similar == 1);
  CHECK(t.heads[1].max_similarity == doctest::Approx(1 - jsd).epsilon(1e-12));
}

TEST_CASE("diagnostics: padded keys and padded queries are left out") {
  // B = 1, T = 4, 2 valid tokens: rows 0 and 1 weigh keys 0 and 1 evenly; rows 2 and 3 are padded
  // queries whose one-hot rows would pull the entropy down if they were counted
  Tensor w = from_vector(std::vector<double>{0.5, 0.5, 0, 0, 0.5, 0.5, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0}, {1, 1, 4, 4});
  nn::AttentionMask by_length;
  by_length.key_padding_lengths = from_vector(std::vector<int64_t>{2}, {1});
  nn::LayerAttentionStats a = nn::attention_stats(w, by_length);
  CHECK(a.rows == 2);
  CHECK(a.heads[0].entropy == doctest::Approx(1.0));  // uniform over the 2 visible keys, not over 4
  CHECK(a.heads[0].diagonal == doctest::Approx(0.5));

  nn::AttentionMask by_mask;  // the same padding as a mask (true = ignore)
  by_mask.key_padding_mask = from_vector(std::vector<int64_t>{0, 0, 1, 1}, {1, 4}).to(DType::b8);
  nn::LayerAttentionStats b = nn::attention_stats(w, by_mask);
  CHECK(b.rows == 2);
  CHECK(b.heads[0].entropy == doctest::Approx(1.0));

  // weight on a key the mask hides: the weights do not belong to that mask
  nn::AttentionMask one;
  one.key_padding_lengths = from_vector(std::vector<int64_t>{1}, {1});
  CHECK_THROWS_WITH_AS(nn::attention_stats(w, one, "blocks.0.attn"),
                       "attention_stats: 'blocks.0.attn' weights [1,1,4,4] put 0.5 on key 1 that query 0 of batch "
                       "element 0 cannot see (head 0): the weights and the mask do not belong together",
                       Error);
  CHECK_THROWS_WITH_AS(nn::attention_stats(zeros({2, 3})),
                       "attention_stats: expected weights f32/f64 [B, H, Tq, Tk] for 'attention', got f32 [2,3]",
                       Error);
}

TEST_CASE("diagnostics: a capture over a 2-layer model names every attention and keeps the forward") {
  Generator gen(3);
  nn::ModuleList<nn::TransformerBlock> model;
  for (int i = 0; i < 2; ++i)
    model.push_back(std::make_shared<nn::TransformerBlock>(
        8, 2, nn::TransformerBlock::Options{.mlp_hidden = 16, .generator = &gen}));
  model.eval();
  Tensor x = randn({3, 5, 8}, DType::f32, &gen);
  Tensor lengths = from_vector(std::vector<int64_t>{5, 3, 4}, {3});
  auto forward = [&](bool need_weights) {
    nn::AttentionOptions o;
    o.key_padding_lengths = lengths;
    o.need_weights = need_weights;
    Tensor h = x;
    for (const auto& b : model) h = b->forward(h, o);
    return h;
  };
  Tensor plain = forward(false);
  Tensor with_weights = forward(true);
  Tensor last_weights = model[1].attn_weights;

  nn::AttentionCapture capture;
  Tensor captured = forward(false);
  REQUIRE(capture.entries().size() == 2);
  CHECK(model[1].attn_weights.defined() == false);  // need_weights stays the caller's choice
  check_close(captured, plain, 1e-5, 1e-4);          // the composed path, same values
  check_close(capture.entries()[1].weights, last_weights, 1e-6, 1e-5);
  CHECK(capture.entries()[0].module == model[0].attn.get());
  CHECK(capture.entries()[0].mask.key_padding_lengths.to_vector<int64_t>() == std::vector<int64_t>{5, 3, 4});

  nn::AttentionReport r = nn::diagnose_attention(model, capture);
  REQUIRE(r.layers.size() == 2);
  CHECK(r.layers[0].layer == "0.attn");
  CHECK(r.layers[1].layer == "1.attn");
  CHECK(r.layers[1].shape == Shape{3, 2, 5, 5});
  CHECK(r.layers[0].rows == 5 + 3 + 4);  // the valid queries of each sequence
  CHECK(r.layers[0].heads.size() == 2);
  CHECK(r.to_text().find("1.attn") != std::string::npos);

  // the one-call form, and captures nest: the inner one receives
  nn::AttentionReport again = nn::diagnose_attention(model, [&] { forward(false); });
  REQUIRE(again.layers.size() == 2);
  CHECK(again.layers[1].heads[1].entropy == doctest::Approx(r.layers[1].heads[1].entropy));
  CHECK(capture.entries().size() == 2);
}

TEST_CASE("diagnostics: a freshly initialised model's near-zero logits are flagged near-uniform") {
  // weights that small make every q k^T ~ 0: each head averages the visible keys
  Generator gen(5);
  nn::MultiHeadAttention mha(8, 2, {.generator = &gen});
  {
    NoGradGuard no_grad;
    mha.qkv->weight.mul_(1e-3);
  }
  Tensor x = randn({2, 6, 8}, DType::f32, &gen);
  nn::AttentionReport r = nn::diagnose_attention(mha, [&] { mha.forward(x); });
  REQUIRE(r.layers.size() == 1);
  CHECK(r.layers[0].layer == "(model)");
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0].check == "near_uniform");
  CHECK(r.to_text().find("attention checks: 1 warning\n  warning: (model): heads 0, 1 near-uniform") != std::string::npos);
}
