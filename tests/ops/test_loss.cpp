// Reference values from tools/make_layers_reference.py (PyTorch 1.13, f64).
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("mse_loss: known values and PyTorch's gradients") {
  // l = (x - t)^2: diffs 0.5, -0.5, 1, -0.7, -0.5, -1 -> squares .25 .25 1 .49 .25 1, sum 3.24, mean 0.54
  // dx = 2 (x - t) / N for mean, 2 (x - t) for sum
  Tensor t = tensor<double>({0.0, -0.5, 1.0, 1.0, -0.2, 2.5});
  for (const char* red : {"mean", "sum"}) {
    Tensor x = tensor<double>({0.5, -1.0, 2.0, 0.3, -0.7, 1.5}).set_requires_grad(true);
    Tensor l = mse_loss(x, t, red);
    CHECK(l.ndim() == 0);
    l.backward();
    const bool mean_ = std::string(red) == "mean";
    check_close(l, {mean_ ? 0.54 : 3.24}, 1e-12, 1e-12);
    check_close(x.grad(), mean_ ? std::vector<double>{0.166666667, -0.166666667, 0.333333333, -0.233333333,
                                                      -0.166666667, -0.333333333}
                                : std::vector<double>{1, -1, 2, -1.4, -1, -2},
                1e-8, 1e-8);
  }
  Tensor x = tensor({0.5f, -1.0f, 2.0f, 0.3f, -0.7f, 1.5f});
  check_close(mse_loss(x, t.to(DType::f32), "none"), {0.25, 0.25, 1, 0.49, 0.25, 1}, 1e-6, 1e-6);
}

TEST_CASE("mse_loss: gradcheck, non-contiguous input, the same tensor twice") {
  expect_gradcheck([](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); },
                   {leaf64({2, 3}, 1), leaf64({2, 3}, 2)});
  expect_gradcheck([](const std::vector<Tensor>& in) { return mse_loss(in[0].mT(), in[1], "none"); },
                   {leaf64({3, 2}, 3), leaf64({2, 3}, 4)});
  expect_gradcheck([](const std::vector<Tensor>& in) { return mse_loss(in[0], mul(in[0], 0.5), "sum"); },
                   {leaf64({5}, 5)});
}

TEST_CASE("mse_loss: errors name both shapes and the bad reduction") {
  AG_CHECK_ERROR(mse_loss(zeros({4}), zeros({4, 1})), "mse_loss", "[4]", "[4,1]");
  AG_CHECK_ERROR(mse_loss(zeros({4}), zeros({4}), "avg"), "mse_loss", "'avg'");
  AG_CHECK_ERROR(mse_loss(zeros({4}), zeros({4}, DType::f64)), "mse_loss", "f32", "f64");
}

TEST_CASE("binary_cross_entropy_with_logits: matches PyTorch, stable at large |x|") {
  // x = 0, t = 1: l = log 2 = 0.693147181;  x = 25, t = 0.5: l = 25 - 12.5 + log(1 + e^-25) = 12.5
  // x = -30, t = 0: l = log(1 + e^-30) = 9.36e-14 (a naive log(sigmoid) would give log(0) = -inf for f32)
  Tensor x = tensor<double>({-30.0, -2.0, -0.5, 0.0, 0.7, 3.0, 25.0}).set_requires_grad(true);
  Tensor t = tensor<double>({0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.5}).set_requires_grad(true);
  check_close(binary_cross_entropy_with_logits(x, t, "none"),
              {9.34807787e-14, 2.12692801, 0.624076984, 0.693147181, 1.10318605, 0.0485873516, 12.5}, 1e-9, 1e-8);
  Tensor l = binary_cross_entropy_with_logits(x, t);
  l.backward();
  check_close(l, {2.44227508}, 1e-8, 1e-8);
  // dx = (sigmoid(x) - t) / N;  dt = -x / N
  check_close(x.grad(), {1.33680328e-14, -0.125828154, 0.0110772384, -0.0714285714, 0.095455396, -0.00677512474,
                         0.0714285714},
              1e-9, 1e-7);
  check_close(t.grad(), {4.28571429, 0.285714286, 0.0714285714, 0, -0.1, -0.428571429, -3.57142857}, 1e-8, 1e-8);
  x.set_grad(Tensor()), t.set_grad(Tensor());
  Tensor s = binary_cross_entropy_with_logits(x, t, "sum");
  s.backward();
  check_close(s, {17.0959256}, 1e-7, 1e-8);
  check_close(x.grad(), {9.35762297e-14, -0.880797078, 0.0775406688, -0.5, 0.668187772, -0.0474258732, 0.5}, 1e-9,
              1e-7);

  // f32 at large |x|: finite and equal to PyTorch to float tolerance
  Tensor xf = tensor({-100.f, 100.f, -30.f});
  Tensor tf = tensor({1.f, 0.f, 0.f});
  check_close(binary_cross_entropy_with_logits(xf, tf, "none"), {100, 100, 9.34807787e-14}, 1e-6, 1e-6);
}

TEST_CASE("binary_cross_entropy_with_logits: gradcheck w.r.t. logits and soft targets") {
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], sigmoid(in[1])); },
      {leaf64({2, 3}, 1, 2.0), leaf64({2, 3}, 2)});
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return binary_cross_entropy_with_logits(in[0].mT(), sigmoid(in[1]), "none");
      },
      {leaf64({3, 2}, 3, 2.0), leaf64({2, 3}, 4)});
  // the same tensor as logits and (through sigmoid) target
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], sigmoid(in[0]), "sum"); },
      {leaf64({5}, 5)});
  // a target that does not require grad gets no gradient computed
  Tensor x = leaf64({3}, 6);
  Tensor t = tensor<double>({0.0, 1.0, 0.5});
  binary_cross_entropy_with_logits(x, t).backward();
  CHECK(x.grad().defined());
  CHECK_FALSE(t.grad().defined());
}

TEST_CASE("binary_cross_entropy_with_logits: errors") {
  AG_CHECK_ERROR(binary_cross_entropy_with_logits(zeros({2, 3}), zeros({3, 2})), "binary_cross_entropy_with_logits",
                 "logits shape [2,3]", "target shape [3,2]");
  AG_CHECK_ERROR(binary_cross_entropy_with_logits(zeros({2}), zeros({2}), "batchmean"),
                 "binary_cross_entropy_with_logits", "'batchmean'");
  AG_CHECK_ERROR(binary_cross_entropy_with_logits(zeros({2}, DType::i64), zeros({2}, DType::i64)),
                 "binary_cross_entropy_with_logits", "i64");
}
