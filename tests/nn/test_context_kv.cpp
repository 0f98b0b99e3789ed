// Cross-attention over a context projected once (nn/attention.h ContextKV): the output and the
// gradients into both the queries and the context equal those of a cross-attention composed by hand
// from basic ops, finite differences agree, an expanded single context serves a batch of queries,
// and a decoder that projects its context once and decodes token by token through a KV cache gives
// the logits of one causal forward over the whole sequence.
#include <cmath>
#include <cstdint>
#include <vector>

#include "autograd/ops.h"
#include "nn/attention.h"
#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// Cross-attention from basic ops, independent of MultiHeadAttention's code:
//   q = x Wq^T + bq (B, Tq, d),  k = c Wk^T + bk,  v = c Wv^T + bv (B, Tk, d)
//   per head h (columns [h hs, (h + 1) hs)):  o_h = softmax(q_h k_h^T / sqrt(hs)) v_h
//   y = concat_h(o_h) Wo^T + bo
// with Wq, Wk, Wv rows [0, d), [d, 2d), [2d, 3d) of the fused qkv weight.
Tensor composed_cross(const nn::MultiHeadAttention& m, const Tensor& x, const Tensor& c) {
  const int64_t d = m.d_model, H = m.n_heads, hs = d / H;
  const Tensor &W = m.qkv->weight, &b = m.qkv->bias;
  Tensor q = matmul(x, W.narrow(0, 0, d).transpose(0, 1)) + b.narrow(0, 0, d);
  Tensor k = matmul(c, W.narrow(0, d, d).transpose(0, 1)) + b.narrow(0, d, d);
  Tensor v = matmul(c, W.narrow(0, 2 * d, d).transpose(0, 1)) + b.narrow(0, 2 * d, d);
  std::vector<Tensor> heads;
  for (int64_t h = 0; h < H; ++h) {
    Tensor qh = q.narrow(2, h * hs, hs), kh = k.narrow(2, h * hs, hs), vh = v.narrow(2, h * hs, hs);
    Tensor scores = mul(matmul(qh, kh.transpose(1, 2)), 1.0 / std::sqrt(double(hs)));  // (B, Tq, Tk)
    heads.push_back(matmul(softmax(scores, 2), vh));                                   // (B, Tq, hs)
  }
  return matmul(cat(heads, 2), m.proj->weight.transpose(0, 1)) + m.proj->bias;
}

}  // namespace

TEST_CASE("ContextKV: cross-attention over a context projected once equals the composed reference, gradients into both inputs") {
  Generator g(5);
  nn::MultiHeadAttention mha(6, 3, {.dtype = DType::f64, .generator = &g});
  const Tensor x = leaf64({2, 4, 6}, 1), c = leaf64({2, 5, 6}, 2);
  const nn::ContextKV kv = mha.context_kv(c);
  CHECK(kv.k.shape() == Shape{2, 3, 5, 2});  // (B, H, Tk, hs)
  CHECK(kv.v.shape() == Shape{2, 3, 5, 2});
  const Tensor y = mha.forward(x, kv).out;
  const Tensor ref = composed_cross(mha, x, c);
  check_close(y, ref, 1e-12, 1e-12);
  check_close(mha.forward(x, c).out, ref, 1e-12, 1e-12);  // the one-call form goes the same way

  // gradients of L = sum(r * y) into x, the context and the weights, against the composed graph's
  const Tensor r = leaf64({2, 4, 6}, 9).detach();
  auto fresh = [](const Tensor& t) { return t.detach().clone().set_requires_grad(true); };
  const Tensor x1 = fresh(x), c1 = fresh(c);
  mha.zero_grad();
  sum(mul(mha.forward(x1, mha.context_kv(c1)).out, r)).backward();
  const Tensor dx = x1.grad(), dc = c1.grad(), dw = mha.qkv->weight.grad().detach().clone();
  const Tensor x2 = fresh(x), c2 = fresh(c);
  mha.zero_grad();
  sum(mul(composed_cross(mha, x2, c2), r)).backward();
  check_close(dx, x2.grad(), 1e-12, 1e-10);
  check_close(dc, c2.grad(), 1e-12, 1e-10);  // the gradient reaches the context through k and v
  check_close(dw, mha.qkv->weight.grad(), 1e-12, 1e-10);
  CHECK(sum(abs(dc)).item<double>() > 1e-3);  // and it is not zero

  // finite differences, w.r.t. the queries and the context
  expect_gradcheck([&](const std::vector<Tensor>& in) { return mha.forward(in[0], mha.context_kv(in[1])).out; },
                   {leaf64({1, 3, 6}, 3), leaf64({1, 4, 6}, 4)});
}

TEST_CASE("ContextKV: one context expanded to a batch of queries, and shape errors") {
  Generator g(6);
  nn::MultiHeadAttention mha(8, 2, {.dtype = DType::f64, .generator = &g});
  const Tensor c = leaf64({1, 5, 8}, 2).detach(), x = leaf64({3, 2, 8}, 1).detach();
  const nn::ContextKV one = mha.context_kv(c);  // (1, H, Tk, hs)
  const nn::ContextKV many{one.k.expand({3, 2, 5, 4}), one.v.expand({3, 2, 5, 4})};  // views, no copy
  const Tensor y = mha.forward(x, many).out;
  for (int64_t b = 0; b < 3; ++b)  // row b: its queries over the one context
    check_close(y.narrow(0, b, 1), composed_cross(mha, x.narrow(0, b, 1), c), 1e-12, 1e-12);

  AG_CHECK_ERROR(mha.forward(leaf64({2, 2, 8}, 1), one), "MultiHeadAttention", "context keys and values", "[2, 2, Tk, 4]");
  AG_CHECK_ERROR(mha.forward(x, nn::ContextKV{}), "MultiHeadAttention", "context keys and values");
  AG_CHECK_ERROR(mha.context_kv(leaf64({1, 5, 6}, 2)), "MultiHeadAttention", "[B, Tk, 8]");
  nn::KVCache cache;
  nn::AttentionOptions o;
  o.cache = &cache;
  AG_CHECK_ERROR(mha.forward(x, many, o), "MultiHeadAttention", "not cross-attention");
  nn::TransformerBlock plain(8, 2, {.mlp_hidden = 16, .causal = true, .dtype = DType::f64, .generator = &g});
  AG_CHECK_ERROR(plain.context_kv(c), "TransformerBlock", "without cross-attention");
  AG_CHECK_ERROR(plain.forward(x, nn::AttentionOptions{}, many), "TransformerBlock", "without cross-attention");
}

TEST_CASE("ContextKV: a decoder projecting its context once and decoding through KV caches matches one causal forward") {
  Generator g(7);
  // two causal blocks with cross-attention over a context of 6 positions
  const nn::TransformerBlock::Options block{
      .mlp_hidden = 16, .causal = true, .cross = true, .dtype = DType::f64, .generator = &g};
  nn::TransformerBlock b0(8, 2, block), b1(8, 2, block);
  const Tensor x = leaf64({2, 5, 8}, 1).detach(), c = leaf64({2, 6, 8}, 2).detach();
  NoGradGuard no_grad;
  const Tensor full = b1.forward(b0.forward(x, c), c);  // (B, T, d): one causal forward
  const nn::ContextKV kv0 = b0.context_kv(c), kv1 = b1.context_kv(c);  // once for all steps
  nn::KVCache c0, c1;
  nn::AttentionOptions o0, o1;
  o0.cache = &c0, o1.cache = &c1;
  std::vector<Tensor> steps;
  for (int64_t t = 0; t < 5; ++t)
    steps.push_back(b1.forward(b0.forward(x.narrow(1, t, 1), o0, kv0), o1, kv1));  // one token at a time
  check_close(cat(steps, 1), full, 1e-12, 1e-12);
  CHECK(c0.length() == 5);
}
