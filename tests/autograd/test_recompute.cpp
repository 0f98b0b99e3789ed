// Activation checkpointing (autograd/recompute.h): recomputing f in backward gives exactly the gradients of the plain run
// (same kernels, same rewound random numbers), with less memory kept between forward and backward.
#include <map>

#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("checkpoint: same loss and bitwise-same gradients as the plain graph, dropout included") {
  Tensor w1 = leaf64({4, 6}, 1), w2 = leaf64({6, 3}, 2);
  auto f = [&](const Tensor& x) { return matmul(dropout(gelu(matmul(x, w1)), 0.3, true), w2); };
  auto run = [&](bool ckpt, Tensor& x) {
    manual_seed(7);
    w1.set_grad(Tensor()), w2.set_grad(Tensor());
    Tensor y = ckpt ? checkpoint(f, x, {w1, w2}) : f(x);
    Tensor loss = sum(mul(y, y));
    loss.backward();
    return loss.item<double>();
  };
  Tensor xa = leaf64({5, 4}, 3), xb = leaf64({5, 4}, 3);
  const double plain = run(false, xa);
  Tensor g1 = w1.grad(), g2 = w2.grad();
  const double ck = run(true, xb);
  CHECK(plain == ck);
  check_close(w1.grad(), g1, 0, 0);
  check_close(w2.grad(), g2, 0, 0);
  check_close(xb.grad(), xa.grad(), 0, 0);
}

TEST_CASE("checkpoint: parameters get gradients when the input needs none") {
  Tensor w = leaf64({3, 2}, 4);
  Tensor x = randn({4, 3}, DType::f64);  // data: requires no grad
  sum(checkpoint([&](const Tensor& t) { return tanh(matmul(t, w)); }, x, {w})).backward();
  Tensor gw = w.grad();
  w.set_grad(Tensor());
  sum(tanh(matmul(x, w))).backward();
  check_close(gw, w.grad(), 0, 0);
}

TEST_CASE("checkpoint: a TransformerBlock recomputed in backward, and the memory it saves") {
  nn::TransformerBlock block(32, 4, {.mlp_hidden = 128, .dropout = 0.1, .causal = true});
  block.train();
  auto params = block.parameters();
  Generator data(5);
  Tensor x0 = randn({4, 64, 32}, DType::f32, &data);
  auto run = [&](bool ckpt, uint64_t* held) {
    manual_seed(11);
    block.zero_grad();
    Tensor x = x0.detach().set_requires_grad(true);
    const uint64_t before = alloc_stats().bytes_in_use;
    Tensor h = x;
    for (int layer = 0; layer < 3; ++layer)  // the same block three times: three layers' activations
      h = ckpt ? checkpoint([&](const Tensor& t) { return block.forward(t); }, h, params) : block.forward(h);
    Tensor loss = mean(mul(h, h));
    *held = alloc_stats().bytes_in_use - before;  // kept for backward
    loss.backward();
    std::vector<Tensor> grads;
    for (const Tensor& p : params) grads.push_back(p.grad());
    grads.push_back(x.grad());
    return grads;
  };
  uint64_t held_plain = 0, held_ckpt = 0;
  std::vector<Tensor> plain = run(false, &held_plain), ck = run(true, &held_ckpt);
  REQUIRE(plain.size() == ck.size());
  for (size_t i = 0; i < plain.size(); ++i) check_close(ck[i], plain[i], 0, 0);
  MESSAGE("held for backward: plain ", held_plain, " bytes, checkpointed ", held_ckpt, " bytes");
  CHECK(held_ckpt * 4 < held_plain);
}

TEST_CASE("checkpoint: the gradient-ready hook fires once for each parameter, after the checkpoint's backward") {
  // data parallelism (dist::GradReducer) starts a bucket's all-reduce from this hook and refuses a
  // leaf reported twice in one backward
  Tensor w1 = leaf64({4, 4}, 1), w2 = leaf64({4, 4}, 2);
  std::map<const TensorImpl*, int> calls;
  const GradReadyHook previous = set_grad_ready_hook([&](const Tensor& leaf) { ++calls[&leaf.impl()]; });
  Tensor x = leaf64({3, 4}, 3);
  Tensor h = checkpoint([&](const Tensor& t) { return tanh(matmul(t, w1)); }, x, {w1});
  h = checkpoint([&](const Tensor& t) { return tanh(matmul(t, w2)); }, h, {w2});
  sum(h).backward();
  set_grad_ready_hook(previous);
  CHECK(calls[&w1.impl()] == 1);
  CHECK(calls[&w2.impl()] == 1);
  CHECK(calls[&x.impl()] == 1);
}

TEST_CASE("checkpoint: errors") {
  Tensor x = leaf64({2, 2}, 1);
  AG_CHECK_ERROR(checkpoint([](const Tensor& t) { return argmax(t, 0); }, x), "checkpoint", "floating");
  AG_CHECK_ERROR(checkpoint([](const Tensor& t) { return t; }, x, {}, {nullptr}), "checkpoint", "null generator");
}
