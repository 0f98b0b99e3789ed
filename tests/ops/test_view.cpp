// Views, copies and in-place writes (autograd/ops/view.cpp).
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
// x[i, j] = 10 i + j as f32
Tensor grid(int64_t rows, int64_t cols) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(float(10 * i + j));
  return from_vector(v, Shape{rows, cols});
}
bool same_storage(const Tensor& a, const Tensor& b) { return a.impl().storage == b.impl().storage; }
}  // namespace

// ---- reshape / view ----------------------------------------------------------------------------
TEST_CASE("reshape: known values") {
  Tensor x = arange(0, 6, 1, DType::f32);
  Tensor r = x.reshape({2, 3});
  CHECK(r.shape() == Shape{2, 3});
  CHECK(same_storage(r, x));
  check_close(r, {0, 1, 2, 3, 4, 5});
  CHECK(x.reshape({3, -1}).shape() == Shape{3, 2});
  CHECK(x.reshape({-1}).shape() == Shape{6});
  CHECK(reshape(x, {1, 2, 1, 3}).shape() == Shape{1, 2, 1, 3});
  // of a transposed tensor: a copy in the transposed order
  Tensor t = r.transpose(0, 1);
  Tensor c = t.reshape({6});
  check_close(c, {0, 3, 1, 4, 2, 5});
  CHECK_FALSE(same_storage(c, x));
  // of a 0-dim tensor, and back
  Tensor s = scalar_tensor(7);
  CHECK(s.reshape({1, 1}).shape() == Shape{1, 1});
  CHECK(s.view({1}).item<float>() == 7);
  CHECK(s.reshape({1, 1}).reshape({}).ndim() == 0);
  CHECK(zeros({0, 3}).reshape({3, -1}).shape() == Shape{3, 0});
  AG_CHECK_ERROR(x.reshape({4, -1}), "reshape", "[4,-1]", "[6]");
  AG_CHECK_ERROR(x.reshape({5}), "reshape", "[5] is invalid for input of shape [6]");
  AG_CHECK_ERROR(x.reshape({-1, -1}), "reshape", "only one dim can be -1");
  AG_CHECK_ERROR(x.reshape({-2, 3}), "reshape", "invalid size -2");
}

TEST_CASE("view: strides decide, and the error names reshape") {
  Tensor x = arange(0, 24, 1, DType::f32).reshape({4, 6});
  Tensor t = x.transpose(0, 1);  // [6,4] strides (1,6)
  // splitting the last dim keeps its stride 6 per step: [6,2,2] strides (1,12,6)
  Tensor v = t.view({6, 2, 2});
  CHECK(v.strides() == Shape{1, 12, 6});
  CHECK(same_storage(v, x));
  check_close(v, t.reshape({6, 2, 2}).contiguous().to_vector<double>());
  // splitting the first dim (size 6, stride 1) into [3,2]: strides (2,1,6)
  CHECK(t.view({3, 2, 4}).strides() == Shape{2, 1, 6});
  AG_CHECK_ERROR(t.view({24}), "view", "[6,4]", "strides [1,6]", "[24]", "reshape()");
  AG_CHECK_ERROR(t.view({4, 6}), "view", "use reshape()");
  // a slice along the last dim: [2,3,2] strides (12,4,1); dims 0 and 1 still merge
  Tensor s = arange(0, 24, 1, DType::f32).reshape({2, 3, 4}).slice(2, 0, 2);
  CHECK(s.view({6, 2}).strides() == Shape{4, 1});
  check_close(s.view({6, 2}), {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21});
  AG_CHECK_ERROR(s.view({12}), "view", "without a copy");
  // size-1 dims may sit anywhere
  CHECK(t.view({6, 1, 4}).strides()[2] == 6);
  check_close(t.view({1, 6, 1, 4}), t.contiguous().to_vector<double>());
}

TEST_CASE("reshape: gradcheck") {
  expect_gradcheck([](auto& x) { return x[0].reshape({3, 4}); }, {leaf64({2, 6}, 1)});
  expect_gradcheck([](auto& x) { return x[0].transpose(0, 1).reshape({-1}); }, {leaf64({2, 6}, 2)});  // a copy
  expect_gradcheck([](auto& x) { return x[0].transpose(0, 1).view({3, 2, 2}); }, {leaf64({2, 6}, 3)});
  expect_gradcheck([](auto& x) { return mul(x[0].reshape({6}), x[0].reshape({6})); }, {leaf64({2, 3}, 4)});
}

TEST_CASE("flatten: known values") {
  Tensor x = zeros({2, 3, 4, 5});
  CHECK(x.flatten().shape() == Shape{120});
  CHECK(x.flatten(1).shape() == Shape{2, 60});
  CHECK(x.flatten(1, 2).shape() == Shape{2, 12, 5});
  CHECK(x.flatten(-2, -1).shape() == Shape{2, 3, 20});
  CHECK(x.flatten(2, 2).shape() == Shape{2, 3, 4, 5});
  CHECK(scalar_tensor(3).flatten().shape() == Shape{1});
  check_close(grid(2, 3).transpose(0, 1).flatten(), {0, 10, 1, 11, 2, 12});
  AG_CHECK_ERROR(x.flatten(2, 1), "flatten", "start_dim 2 is after end_dim 1");
  AG_CHECK_ERROR(x.flatten(0, 4), "flatten", "dim 4 is out of range");
  expect_gradcheck([](auto& x) { return x[0].transpose(0, 2).flatten(1); }, {leaf64({2, 3, 2}, 1)});
}

// ---- permute / transpose ---------------------------------------------------------------------
TEST_CASE("permute: known values") {
  Tensor x = arange(0, 24, 1, DType::f32).reshape({2, 3, 4});  // x[i,j,k] = 12i + 4j + k
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(same_storage(p, x));
  // p[k, i, j] = x[i, j, k]: p[1, 1, 2] = 12 + 8 + 1
  CHECK(p.select(0, 1).select(0, 1).select(0, 2).item<float>() == 21);
  CHECK(permute(x, {-1, 0, 1}).strides() == Shape{1, 12, 4});
  AG_CHECK_ERROR(x.permute({0, 1, 1}), "permute", "dim 1 repeated", "[0,1,1]");
  AG_CHECK_ERROR(x.permute({0, 1}), "permute", "2 dims given", "[2,3,4]");
  AG_CHECK_ERROR(x.permute({0, 1, 3}), "permute", "dim 3 is out of range");
  expect_gradcheck([](auto& x) { return x[0].permute({2, 0, 1}); }, {leaf64({2, 3, 4}, 1)});
  expect_gradcheck([](auto& x) { return x[0].permute({1, 2, 0}).permute({1, 0, 2}); }, {leaf64({2, 3, 2}, 2)});
}

TEST_CASE("transpose: known values") {
  Tensor x = grid(2, 3);
  Tensor t = x.transpose(0, 1);
  CHECK(t.shape() == Shape{3, 2});
  CHECK(t.strides() == Shape{1, 3});
  check_close(t, {0, 10, 1, 11, 2, 12});
  check_close(transpose(x, -1, -2), {0, 10, 1, 11, 2, 12});
  check_close(x.mT(), {0, 10, 1, 11, 2, 12});
  CHECK(x.transpose(1, 1).strides() == x.strides());
  AG_CHECK_ERROR(x.transpose(0, 2), "transpose", "dim 2 is out of range");
  expect_gradcheck([](auto& x) { return x[0].transpose(0, 2); }, {leaf64({2, 3, 4}, 1)});
}

// ---- slicing -----------------------------------------------------------------------------------
TEST_CASE("slice: known values") {
  Tensor x = arange(0, 10, 1, DType::f32);
  check_close(x.slice(0, 2, 5), {2, 3, 4});
  check_close(x.slice(0, 1, 8, 3), {1, 4, 7});
  check_close(x.slice(0, 1, 9, 3), {1, 4, 7});
  check_close(x.slice(0, -3, 10), {7, 8, 9});    // negative start counts from the end
  check_close(x.slice(0, 0, -8), {0, 1});        // negative end
  check_close(x.slice(0, -100, 2), {0, 1});      // clamped, as Python
  check_close(x.slice(0, 8, 100), {8, 9});
  CHECK(x.slice(0, 5, 2).numel() == 0);          // empty, not an error
  CHECK(x.slice(0, 20, 30).numel() == 0);
  CHECK(same_storage(x.slice(0, 1, 8, 3), x));
  CHECK(x.slice(0, 1, 8, 3).strides() == Shape{3});
  CHECK(x.slice(0, 1, 8, 3).offset() == 1);
  Tensor g = grid(3, 4);
  check_close(g.slice(1, 1, 4, 2), {1, 3, 11, 13, 21, 23});
  check_close(slice(g, -2, 1, 3), {10, 11, 12, 13, 20, 21, 22, 23});
  AG_CHECK_ERROR(x.slice(0, 0, 5, 0), "slice", "step must be >= 1, got 0");
  AG_CHECK_ERROR(x.slice(0, 0, 5, -1), "slice", "got -1");
  AG_CHECK_ERROR(x.slice(1, 0, 5), "slice", "dim 1 is out of range");
}
TEST_CASE("slice: gradcheck") {
  expect_gradcheck([](auto& x) { return x[0].slice(1, 1, 6, 2); }, {leaf64({3, 6}, 1)});
  expect_gradcheck([](auto& x) { return x[0].slice(0, -2, 100); }, {leaf64({4, 2}, 2)});
  // overlapping slices of one tensor: gradients add up
  expect_gradcheck([](auto& x) { return mul(x[0].slice(0, 0, 4), x[0].slice(0, 1, 5)); }, {leaf64({5}, 3)});
  // slice of a transposed view
  expect_gradcheck([](auto& x) { return x[0].transpose(0, 1).slice(0, 0, 3, 2); }, {leaf64({2, 4}, 4)});
}

TEST_CASE("narrow: known values and errors") {
  Tensor g = grid(3, 4);
  check_close(g.narrow(1, 1, 2), {1, 2, 11, 12, 21, 22});
  check_close(narrow(g, -2, 2, 1), {20, 21, 22, 23});
  CHECK(g.narrow(0, 3, 0).numel() == 0);
  AG_CHECK_ERROR(g.narrow(1, 3, 2), "narrow", "[3, 5) is out of range", "size 4", "[3,4]");
  AG_CHECK_ERROR(g.narrow(0, -1, 1), "narrow", "out of range");
  AG_CHECK_ERROR(g.narrow(0, 0, -1), "narrow", "out of range");
  AG_CHECK_ERROR(g.narrow(2, 0, 1), "narrow", "dim 2 is out of range");
  expect_gradcheck([](auto& x) { return x[0].narrow(1, 1, 2); }, {leaf64({3, 4}, 1)});
}

TEST_CASE("select: known values and errors") {
  Tensor g = grid(3, 4);
  Tensor r = g.select(0, 1);
  CHECK(r.shape() == Shape{4});
  check_close(r, {10, 11, 12, 13});
  check_close(g.select(1, -1), {3, 13, 23});  // negative index counts from the end
  check_close(select(g, -1, -4), {0, 10, 20});
  CHECK(g.select(0, 2).select(0, 3).ndim() == 0);
  CHECK(same_storage(r, g));
  AG_CHECK_ERROR(g.select(0, 3), "select", "index 3 is out of range", "size 3", "[3,4]");
  AG_CHECK_ERROR(g.select(1, -5), "select", "index -5 is out of range");
  AG_CHECK_ERROR(scalar_tensor(1).select(0, 0), "select", "out of range");
  expect_gradcheck([](auto& x) { return x[0].select(1, -1); }, {leaf64({3, 4}, 1)});
  expect_gradcheck([](auto& x) { return add(x[0].select(0, 0), x[0].select(0, 2)); }, {leaf64({3, 2}, 2)});
}

// ---- unsqueeze / squeeze -------------------------------------------------------------------------
TEST_CASE("unsqueeze and squeeze: known values") {
  Tensor x = grid(2, 3);
  CHECK(x.unsqueeze(0).shape() == Shape{1, 2, 3});
  CHECK(x.unsqueeze(1).shape() == Shape{2, 1, 3});
  CHECK(x.unsqueeze(-1).shape() == Shape{2, 3, 1});
  CHECK(unsqueeze(x, 2).strides() == Shape{3, 1, 1});
  CHECK(x.unsqueeze(0).strides() == Shape{6, 3, 1});  // as PyTorch: the new dim steps over the next one
  CHECK(x.unsqueeze(1).strides() == Shape{3, 3, 1});
  CHECK(scalar_tensor(1).unsqueeze(0).shape() == Shape{1});
  check_close(x.unsqueeze(1), {0, 1, 2, 10, 11, 12});
  Tensor y = zeros({1, 3, 1, 2});
  CHECK(y.squeeze(0).shape() == Shape{3, 1, 2});
  CHECK(squeeze(y, -2).shape() == Shape{1, 3, 2});
  CHECK(y.squeeze().shape() == Shape{3, 2});
  CHECK(zeros({1, 1}).squeeze().ndim() == 0);
  AG_CHECK_ERROR(y.squeeze(1), "squeeze", "dim 1 has size 3, not 1", "[1,3,1,2]");
  AG_CHECK_ERROR(x.unsqueeze(3), "unsqueeze", "dim 3 is out of range");
  expect_gradcheck([](auto& x) { return x[0].unsqueeze(1).transpose(0, 1); }, {leaf64({2, 3}, 1)});
  expect_gradcheck([](auto& x) { return x[0].squeeze(0).squeeze(); }, {leaf64({1, 3, 1}, 2)});
}

// ---- expand --------------------------------------------------------------------------------------
TEST_CASE("expand: known values") {
  Tensor c = tensor({1.f, 2.f, 3.f}, {3, 1});
  Tensor e = c.expand({3, 4});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(same_storage(e, c));
  check_close(e, {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK(c.expand({2, -1, 2}).shape() == Shape{2, 3, 2});  // new leading dim, -1 keeps a dim
  CHECK(c.expand({2, -1, 2}).strides() == Shape{0, 1, 0});
  CHECK(broadcast_to(c, {3, 1}).impl_ptr() == c.impl_ptr());  // same shape: the tensor itself
  CHECK(c.expand({3, 0}).numel() == 0);
  // dx = sum of g over the broadcast dims: each of the 3 rows was copied 4 times (times 2 planes)
  Tensor w = tensor<double>({1, 2, 3}, {3, 1}).set_requires_grad(true);
  sum(w.expand({2, 3, 4})).backward();
  check_close(w.grad(), {8, 8, 8});
  AG_CHECK_ERROR(c.expand({3, 4}).expand({4}), "expand", "fewer dims");
  AG_CHECK_ERROR(c.expand({4, 4}), "expand", "[3,1] to [4,4]", "size 3 is not 1");
  AG_CHECK_ERROR(c.expand({-1, 3, 4}), "expand", "-1 is not allowed for a new leading dim");
  AG_CHECK_ERROR(c.expand({3, -2}), "expand", "invalid size -2");
}
TEST_CASE("expand: gradcheck") {
  expect_gradcheck([](auto& x) { return x[0].expand({2, 3, 4}); }, {leaf64({3, 1}, 1)});
  expect_gradcheck([](auto& x) { return x[0].unsqueeze(1).expand({3, 2}).transpose(0, 1); }, {leaf64({3}, 2)});
  expect_gradcheck([](auto& x) { return broadcast_to(x[0], {2, 2}); }, {leaf64({}, 3)});
  expect_gradcheck([](auto& x) { return mul(x[0].expand({2, 3}), x[0].reshape({1, 3})); }, {leaf64({3}, 4)});
}

TEST_CASE("sum_to: known values and gradcheck") {
  Tensor g = arange(0, 24, 1, DType::f64).reshape({2, 3, 4});
  // g[i, j, k] = 12 i + 4 j + k; to [3,1]: over i and k, 60 + 32 j
  check_close(sum_to(g, {3, 1}), {60, 92, 124});
  check_close(sum_to(g, {4}), {60, 66, 72, 78});
  check_close(sum_to(g, {2, 1, 4}), {12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(sum_to(g, {2, 3, 4}).impl_ptr() == g.impl_ptr());
  AG_CHECK_ERROR(sum_to(g, {3}), "sum_to", "[2,3,4] to [3]");
  AG_CHECK_ERROR(sum_to(g, {1, 2, 3, 4}), "sum_to", "cannot reduce");
  expect_gradcheck([](auto& x) { return sum_to(x[0], {3, 1}); }, {leaf64({2, 3, 2}, 1)});
}

// ---- copies --------------------------------------------------------------------------------------
TEST_CASE("contiguous and clone: known values") {
  Tensor x = grid(2, 3);
  CHECK(x.contiguous().impl_ptr() == x.impl_ptr());  // already dense: the tensor itself
  Tensor t = x.transpose(0, 1).contiguous();
  CHECK(t.is_contiguous());
  CHECK(t.strides() == Shape{2, 1});
  check_close(t, {0, 10, 1, 11, 2, 12});
  Tensor c = x.clone();
  CHECK_FALSE(same_storage(c, x));
  c.fill_(5);
  check_close(x, {0, 1, 2, 10, 11, 12});  // the original is untouched
  // both are differentiable: dx = g
  expect_gradcheck([](auto& x) { return x[0].transpose(0, 1).contiguous(); }, {leaf64({2, 3}, 1)});
  expect_gradcheck([](auto& x) { return mul(x[0].clone(), x[0]); }, {leaf64({2, 3}, 2)});
}

TEST_CASE("to(dtype): conversions, differentiable between floating dtypes") {
  Tensor f = tensor({1.5f, -2.5f, 0.f});
  CHECK(f.to(DType::f32).impl_ptr() == f.impl_ptr());
  Tensor d = f.to(DType::f64);
  CHECK(d.dtype() == DType::f64);
  CHECK(d.to_vector<double>() == std::vector<double>{1.5, -2.5, 0});
  CHECK(f.to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{1, -2, 0});
  CHECK(f.to(DType::b8).to_vector<int>() == std::vector<int>{1, 1, 0});
  CHECK(tensor<bool>({true, false}).to(DType::f32).to_vector<float>() == std::vector<float>{1, 0});
  check_close(grid(2, 2).transpose(0, 1).to(DType::f64), {0, 10, 1, 11});
  // f64 leaf -> f32 -> f64: the gradient comes back as f64 (L = sum(3 y))
  Tensor x = leaf64({3});
  Tensor y = x.to(DType::f32);
  CHECK(y.requires_grad());
  sum(mul(y.to(DType::f64), 3.0)).backward();
  CHECK(x.grad().dtype() == DType::f64);
  check_close(x.grad(), {3, 3, 3});
  CHECK_FALSE(x.to(DType::i64).requires_grad());  // integers carry no gradient
  expect_gradcheck([](auto& x) { return x[0].to(DType::f32).to(DType::f64); }, {leaf64({2, 3}, 1)},
                   GradcheckOptions{1e-3, 1e-3, 1e-3});  // f32 round trip: coarser eps and tolerances
  CHECK(f.to(Device::cpu()).impl_ptr() == f.impl_ptr());
}

TEST_CASE("copy_: broadcast, strided destination, conversion") {
  Tensor d = zeros({2, 3});
  d.copy_(tensor({1.f, 2.f, 3.f}));  // broadcast over rows
  check_close(d, {1, 2, 3, 1, 2, 3});
  d.copy_(scalar_tensor(7, DType::f64));  // f64 source converted
  check_close(d, {7, 7, 7, 7, 7, 7});
  Tensor e = zeros({3, 2});
  e.transpose(0, 1).copy_(grid(2, 3));  // strided destination
  check_close(e, {0, 10, 1, 11, 2, 12});
  Tensor f = zeros({6});
  f.slice(0, 0, 6, 2).copy_(tensor({1.f, 2.f, 3.f}));
  check_close(f, {1, 0, 2, 0, 3, 0});
  AG_CHECK_ERROR(d.copy_(zeros({3, 2})), "copy_", "[3,2]", "[2,3]");
  AG_CHECK_ERROR(zeros({3, 1}).expand({3, 4}).copy_(zeros({3, 4})), "copy_", "expanded tensor");
  AG_CHECK_ERROR(zeros({3}).expand({2, 3}).fill_(1), "fill_", "expanded tensor");
}

TEST_CASE("views share storage") {
  Tensor x = zeros({3, 4});
  Tensor row = x.select(0, 1), col = x.transpose(0, 1).select(0, 2), flat = x.view({12});
  row.fill_(1);                   // x[1, :] = 1
  col.copy_(tensor({5.f, 6.f, 7.f}));  // x[:, 2] = 5, 6, 7
  check_close(x, {0, 0, 5, 0, 1, 1, 6, 1, 0, 0, 7, 0});
  check_close(flat.slice(0, 4, 8), {1, 1, 6, 1});  // seen through another view
  x.narrow(0, 2, 1).zero_();
  check_close(flat.slice(0, 8, 12), {0, 0, 0, 0});
  check_close(col, {5, 6, 0});
}

TEST_CASE("views: gradcheck through chains of views") {
  expect_gradcheck(
      [](auto& x) {
        return x[0].transpose(0, 2).reshape({4, 6}).slice(1, 1, 6, 2).unsqueeze(0).expand({2, 4, 3}).select(2, -1);
      },
      {leaf64({2, 3, 4}, 1)});
  expect_gradcheck([](auto& x) { return x[0].permute({1, 0, 2}).narrow(2, 1, 2).flatten(0, 1).mT(); },
                   {leaf64({2, 3, 3}, 2)});
  // a view used twice with an elementwise op on top: both paths reach the one leaf
  expect_gradcheck([](auto& x) { return mul(x[0].select(0, 0), x[0].transpose(0, 1).select(1, 1)); },
                   {leaf64({2, 2}, 3)});
}
