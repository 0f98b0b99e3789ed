// Reductions (autograd/ops/reduce.cpp, core/cpu/reduce.cpp): sum, mean, max, var, argmax.
#include <cmath>
#include <limits>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// x[i, j, k] = 12 i + 4 j + k, shape [2,3,4], f64 leaf
Tensor iota234() { return arange(0, 24, 1, DType::f64).reshape({2, 3, 4}).detach().set_requires_grad(true); }

struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

// Naive reduction of x over `dims` (keepdim = true) with `op` ("sum" or "max"), read element by
// element through the multi-index: the oracle for every dim subset.
std::vector<double> naive_reduce(const Tensor& x, const std::vector<int>& dims, const char* op) {
  std::vector<double> v = x.to_vector<double>();
  const Shape& s = x.shape();
  Shape out = s;
  for (int d : dims) out[d] = 1;
  std::vector<double> r(size_t(out.numel()), std::string(op) == "max" ? -INFINITY : 0.0);
  Shape idx = s;
  for (int64_t flat = 0; flat < x.numel(); ++flat) {
    int64_t rem = flat, o = 0, ostride = 1;
    for (int d = s.size() - 1; d >= 0; --d) idx[d] = rem % s[d], rem /= s[d];
    for (int d = s.size() - 1; d >= 0; --d) {
      o += (out[d] == 1 ? 0 : idx[d]) * ostride;
      ostride *= out[d];
    }
    if (std::string(op) == "max") r[size_t(o)] = std::max(r[size_t(o)], v[size_t(flat)]);
    else r[size_t(o)] += v[size_t(flat)];
  }
  return r;
}

}  // namespace

// ---- sum -----------------------------------------------------------------------------------
TEST_CASE("sum: known values") {
  Tensor x = iota234();
  // all dims: 0 + 1 + ... + 23 = 276
  CHECK(sum(x).shape() == Shape{});
  CHECK(sum(x).item<double>() == 276);
  // dim 1: sum_j (12i + 4j + k) = 36i + 12 + 3k
  Tensor s1 = sum(x, {1});
  CHECK(s1.shape() == Shape{2, 4});
  check_close(s1, {12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(sum(x, {1}, true).shape() == Shape{2, 1, 4});
  // dims {0, 2} (not adjacent): sum_i sum_k = 4*12 + 8*4j + 2*6 = 60 + 32j
  check_close(sum(x, {0, 2}), {60, 92, 124});
  CHECK(sum(x, {2, 0}, true).shape() == Shape{1, 3, 1});
  // negative dim -1 = 2: 4 (12i + 4j) + 6
  check_close(sum(x, {-1}), {6, 22, 38, 54, 70, 86});
  // transposed input [4,3,2]: y[k, j, i] = x[i, j, k]; summing dim 0 sums over k
  Tensor xt = x.transpose(0, 2);
  CHECK_FALSE(xt.is_contiguous());
  check_close(sum(xt, {0}), {6, 54, 22, 70, 38, 86});
  // dims {1, 2} of the transposed input sum over j and i: 3*12 + 2*(0+4+8) + 6k = 60 + 6k
  CHECK(sum(xt, {1, 2}).shape() == Shape{4});
  check_close(sum(xt, {1, 2}), {60, 66, 72, 78});
  // backward: dx = g expanded back
  Tensor g = sum(mul(sum(x, {1}), tensor<double>({1, 2, 3, 4})));
  g.backward();
  check_close(x.grad(), std::vector<double>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4});
  // i64 sums exactly; b8 sums count (as PyTorch, to i64)
  CHECK(sum(tensor<int64_t>({int64_t(1) << 60, 1, 2})).item<int64_t>() == (int64_t(1) << 60) + 3);
  Tensor cnt = sum(tensor<bool>({true, false, true, true}));
  CHECK(cnt.dtype() == DType::i64);
  CHECK(cnt.item<int64_t>() == 3);
  // a 0-dim tensor sums to itself; an empty one to 0
  CHECK(sum(scalar_tensor(2.5)).item<float>() == 2.5f);
  CHECK(sum(zeros({0, 3})).item<float>() == 0.f);
  check_close(sum(zeros({0, 3}), {0}), {0, 0, 0});
}

TEST_CASE("sum: every dim subset matches a naive loop") {
  Tensor base = randn({3, 4, 5, 6}, DType::f64);
  const std::vector<std::pair<const char*, Tensor>> inputs = {
      {"contiguous", base.narrow(0, 0, 2)},
      {"permuted", base.permute({2, 0, 3, 1}).narrow(1, 1, 2)},
      {"stepped", base.slice(3, 0, 6, 2)},
      {"expanded", base.select(1, 0).unsqueeze(1).expand({3, 4, 5, 6})}};
  for (auto& [name, x] : inputs) {
    for (int mask = 0; mask < 16; ++mask) {
      std::vector<int> dims;
      for (int d = 0; d < 4; ++d)
        if (mask >> d & 1) dims.push_back(d);
      if (dims.empty()) continue;  // empty means "all dims", covered by mask 15
      INFO(name << " dims mask " << mask);
      check_close(sum(x, dims, true), naive_reduce(x, dims, "sum"), 1e-12, 1e-12);
      check_close(max(x, dims, true), naive_reduce(x, dims, "max"), 0, 0);
    }
  }
}

TEST_CASE("sum: gradcheck") {
  expect_gradcheck([](auto& x) { return sum(x[0]); }, {leaf64({2, 3, 4}, 1)});
  expect_gradcheck([](auto& x) { return sum(x[0], {1}); }, {leaf64({2, 3, 4}, 2)});
  expect_gradcheck([](auto& x) { return sum(x[0], {0, 2}, true); }, {leaf64({2, 3, 4}, 3)});
  expect_gradcheck([](auto& x) { return sum(x[0], {-1, -3}); }, {leaf64({2, 3, 4}, 4)});
  expect_gradcheck([](auto& x) { return sum(x[0].transpose(0, 2), {1}); }, {leaf64({2, 3, 4}, 5)});
  expect_gradcheck([](auto& x) { return mul(sum(x[0], {1}, true), x[0]); }, {leaf64({2, 3}, 6)});  // x twice
}

TEST_CASE("sum: a large f32 sum is accurate and independent of the thread count") {
  ThreadCount restore;
  Generator g(77);
  const int64_t n = (int64_t(1) << 20) + 12345;
  Tensor x = rand({n}, DType::f32, &g);
  double ref = 0;
  for (float v : x.to_vector<float>()) ref += double(v);
  set_num_threads(1);
  const float s1 = sum(x).item<float>();
  Tensor rows1 = sum(x.narrow(0, 0, 1 << 20).reshape({1024, 1024}), {1});
  Tensor cols1 = sum(x.narrow(0, 0, 1 << 20).reshape({1024, 1024}), {0});
  set_num_threads(2);
  const float s2 = sum(x).item<float>();
  Tensor rows2 = sum(x.narrow(0, 0, 1 << 20).reshape({1024, 1024}), {1});
  Tensor cols2 = sum(x.narrow(0, 0, 1 << 20).reshape({1024, 1024}), {0});
  CHECK(std::abs(double(s1) - ref) <= 1e-6 * ref);  // a plain f32 running sum is off by 9e-6 here
  CHECK(s1 == s2);                                   // bitwise
  CHECK(rows1.to_vector<float>() == rows2.to_vector<float>());
  CHECK(cols1.to_vector<float>() == cols2.to_vector<float>());
  CHECK(mean(x).item<float>() == doctest::Approx(ref / double(n)).epsilon(1e-6));
  // rows and columns (the column path works in blocks of 256 columns) against double sums
  std::vector<float> v = x.to_vector<float>();
  std::vector<double> rref(1024, 0.0), cref(1024, 0.0);
  for (int i = 0; i < 1024; ++i)
    for (int j = 0; j < 1024; ++j) rref[size_t(i)] += v[size_t(i * 1024 + j)], cref[size_t(j)] += v[size_t(i * 1024 + j)];
  check_close(rows1, rref, 0, 1e-5);
  check_close(cols1, cref, 0, 1e-5);
}

// ---- mean ----------------------------------------------------------------------------------
TEST_CASE("mean: known values") {
  Tensor x = iota234();
  CHECK(mean(x).item<double>() == 11.5);  // 276 / 24
  // dim 1: (36i + 12 + 3k) / 3
  check_close(mean(x, {1}), {4, 5, 6, 7, 16, 17, 18, 19});
  check_close(mean(x, {0, 2}, true), {7.5, 11.5, 15.5});
  CHECK(mean(x, {0, 2}, true).shape() == Shape{1, 3, 1});
  check_close(mean(x.transpose(0, 2), {0}), {1.5, 13.5, 5.5, 17.5, 9.5, 21.5});
  // dx = g / N
  sum(mean(x, {-1})).backward();
  check_close(x.grad(), std::vector<double>(24, 0.25));
  CHECK(std::isnan(mean(zeros({0})).item<float>()));  // 0/0, as PyTorch
}
TEST_CASE("mean: gradcheck") {
  expect_gradcheck([](auto& x) { return mean(x[0]); }, {leaf64({2, 3, 4}, 1)});
  expect_gradcheck([](auto& x) { return mean(x[0], {0, 2}); }, {leaf64({2, 3, 4}, 2)});
  expect_gradcheck([](auto& x) { return mean(x[0].transpose(0, 1), {-1}, true); }, {leaf64({2, 3, 4}, 3)});
  expect_gradcheck([](auto& x) { return mul(mean(x[0], {1}, true), x[0]); }, {leaf64({2, 3}, 4)});
}

// ---- max -----------------------------------------------------------------------------------
TEST_CASE("max: known values") {
  Tensor x = iota234();
  CHECK(max(x).item<double>() == 23);
  check_close(max(x, {1}), {8, 9, 10, 11, 20, 21, 22, 23});   // x[i, 2, k] = 12i + 8 + k
  check_close(max(x, {0, 2}), {15, 19, 23});                 // x[1, j, 3] = 15 + 4j
  CHECK(max(x, {0, 2}, true).shape() == Shape{1, 3, 1});
  check_close(max(x, {-3}), {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23});
  check_close(max(x.transpose(0, 2), {0}), {3, 15, 7, 19, 11, 23});
  // dx = g at the (unique) max, 0 elsewhere
  sum(max(x, {1})).backward();
  std::vector<double> dx(24, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) dx[size_t(12 * i + 8 + k)] = 1;
  check_close(x.grad(), dx);
  CHECK(max(tensor<int64_t>({3, -7, 9, 2})).item<int64_t>() == 9);
  CHECK(std::isnan(max(tensor({1.f, NAN, 3.f})).item<float>()));  // NaN propagates
  CHECK(max(zeros({0, 3}), {1}).shape() == Shape{0});             // reduce a non-empty dim of nothing
}
TEST_CASE("max: ties share the gradient") {
  // row 0 has two 3s: each gets 1/2; row 1 is all 2s: each gets 1/3 (like torch.amax)
  Tensor x = tensor<double>({1, 3, 3, 2, 2, 2}, {2, 3}).set_requires_grad(true);
  Tensor y = max(x, {1});
  check_close(y, {3, 2});
  sum(mul(y, tensor<double>({6, 3}))).backward();
  check_close(x.grad(), {0, 3, 3, 1, 1, 1});
  // over all dims: the two 3s
  Tensor z = tensor<double>({1, 3, 3, 2, 2, 2}, {2, 3}).set_requires_grad(true);
  max(z).backward();
  check_close(z.grad(), {0, 0.5, 0.5, 0, 0, 0});
}
TEST_CASE("max: gradcheck") {
  // random normals: distinct values, so the max is away from ties
  expect_gradcheck([](auto& x) { return max(x[0]); }, {leaf64({2, 3, 4}, 1)});
  expect_gradcheck([](auto& x) { return max(x[0], {1}); }, {leaf64({2, 3, 4}, 2)});
  expect_gradcheck([](auto& x) { return max(x[0], {0, 2}, true); }, {leaf64({2, 3, 4}, 3)});
  expect_gradcheck([](auto& x) { return max(x[0].transpose(0, 2), {-1}); }, {leaf64({2, 3, 4}, 4)});
  expect_gradcheck([](auto& x) { return mul(max(x[0], {1}, true), x[0]); }, {leaf64({2, 3}, 5)});
}

// ---- var -----------------------------------------------------------------------------------
TEST_CASE("var: known values") {
  Tensor x = iota234();
  // along dim 2 the values are c + {0,1,2,3}: mean c + 1.5, squared deviations sum to 5
  check_close(var(x, {2}), std::vector<double>(6, 5.0 / 3));                 // correction 1: / 3
  check_close(var(x, {2}, 0), std::vector<double>(6, 1.25));                 // correction 0: / 4
  // along dim 0: {c, c + 12}: squared deviations 36 + 36 = 72
  check_close(var(x, {0}, 1, true), std::vector<double>(12, 72));
  CHECK(var(x, {0}, 1, true).shape() == Shape{1, 3, 4});
  check_close(var(x, {0}, 0), std::vector<double>(12, 36));
  // all of 0..23: sum of squared deviations = 24 (24^2 - 1) / 12 = 1150
  CHECK(var(x).item<double>() == doctest::Approx(1150.0 / 23));
  CHECK(var(x, {}, 0).item<double>() == doctest::Approx(1150.0 / 24));
  // dims {0, 2}, transposed input
  check_close(var(x.transpose(0, 2), {0, 2}), var(x, {0, 2}).to_vector<double>());
  // dx = g 2 (x - mean) / (N - c): for dim 2, (x - mean) = {-1.5, -.5, .5, 1.5}, / 3 * 2
  sum(var(x, {2})).backward();
  std::vector<double> dx;
  for (int r = 0; r < 6; ++r)
    for (double c : {-1.5, -0.5, 0.5, 1.5}) dx.push_back(2 * c / 3);
  check_close(x.grad(), dx, 1e-12);
  // one element with correction 1: 0/0 = nan, as PyTorch
  CHECK(std::isnan(var(tensor({3.f})).item<float>()));
}
TEST_CASE("var: gradcheck") {
  expect_gradcheck([](auto& x) { return var(x[0]); }, {leaf64({2, 3, 4}, 1)});
  expect_gradcheck([](auto& x) { return var(x[0], {1}, 0); }, {leaf64({2, 3, 4}, 2)});
  expect_gradcheck([](auto& x) { return var(x[0], {0, 2}, 1, true); }, {leaf64({2, 3, 4}, 3)});
  expect_gradcheck([](auto& x) { return var(x[0].transpose(0, 2), {-1}); }, {leaf64({2, 3, 4}, 4)});
  expect_gradcheck([](auto& x) { return mul(var(x[0], {1}, 1, true), x[0]); }, {leaf64({2, 3}, 5)});
}

// ---- argmax --------------------------------------------------------------------------------
TEST_CASE("argmax: known values") {
  Tensor x = iota234();
  Tensor a = argmax(x, 1);
  CHECK(a.dtype() == DType::i64);
  CHECK(a.shape() == Shape{2, 4});
  CHECK(a.to_vector<int64_t>() == std::vector<int64_t>(8, 2));
  CHECK(argmax(x, -1, true).shape() == Shape{2, 3, 1});
  CHECK(argmax(x, -1, true).to_vector<int64_t>() == std::vector<int64_t>(6, 3));
  CHECK(argmax(x.transpose(0, 2), 2).to_vector<int64_t>() == std::vector<int64_t>(12, 1));
  CHECK_FALSE(a.requires_grad());
  // ties: the first index; NaN: the first NaN (it counts as the maximum, as PyTorch)
  CHECK(argmax(tensor({3.f, 1.f, 3.f}), 0).item<int64_t>() == 0);
  CHECK(argmax(tensor({1.f, NAN, 3.f, NAN}), 0).item<int64_t>() == 1);
  CHECK(argmax(tensor({NAN, 5.f}), 0).item<int64_t>() == 0);
  CHECK(argmax(tensor({-INFINITY, -INFINITY}), 0).item<int64_t>() == 0);
  // column-wise with a tie in column 1
  CHECK(argmax(tensor({1.f, 5.f, 4.f, 5.f}, {2, 2}), 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(argmax(tensor<int64_t>({2, 9, 9}), 0).item<int64_t>() == 1);
}

// ---- errors --------------------------------------------------------------------------------
TEST_CASE("reductions: errors") {
  Tensor x = zeros({2, 3, 4});
  AG_CHECK_ERROR(sum(x, {1, 1}), "sum", "dim 1 appears twice");
  AG_CHECK_ERROR(mean(x, {1, -2}), "mean", "dim -2 appears twice");
  AG_CHECK_ERROR(max(x, {0, 3}), "max", "dim 3 is out of range", "3 dims");
  AG_CHECK_ERROR(var(x, {-4}), "var", "dim -4 is out of range");
  AG_CHECK_ERROR(argmax(x, 3), "argmax", "dim 3 is out of range");
  AG_CHECK_ERROR(max(zeros({2, 0}), {1}), "max", "empty dim", "[2,0]");
  AG_CHECK_ERROR(max(zeros({0})), "max", "empty dim", "[0]");
  AG_CHECK_ERROR(argmax(zeros({2, 0}), 1), "argmax", "empty dim", "[2,0]");
  AG_CHECK_ERROR(mean(tensor<int64_t>({1, 2})), "mean", "floating", "i64");
  AG_CHECK_ERROR(var(tensor<int64_t>({1, 2})), "var", "floating", "i64");
  AG_CHECK_ERROR(max(zeros({2}, DType::b8)), "max", "b8");
}
