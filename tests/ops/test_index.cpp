#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("index_select: known values") {
  Tensor x = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {3, 2}).set_requires_grad(true);
  // rows 2, 0, 2: [[5,6],[1,2],[5,6]]
  Tensor y = index_select(x, 0, tensor<int64_t>({2, 0, 2}));
  CHECK(y.shape() == Shape{3, 2});
  check_close(y, {5, 6, 1, 2, 5, 6});
  // L = sum(y * w), w = [[0,1],[2,3],[4,5]]: dx[2] = w[0] + w[2] (row 2 picked twice), dx[0] = w[1],
  // dx[1] = 0 (never picked)
  sum(mul(y, arange(0, 6, 1, DType::f32).reshape({3, 2}))).backward();
  check_close(x.grad(), {2, 3, 0, 0, 4, 6});
  // columns 1, 1, 0 (dim -1): [[2,2,1],[4,4,3],[6,6,5]]
  check_close(index_select(x.detach(), -1, tensor<int64_t>({1, 1, 0})), {2, 2, 1, 4, 4, 3, 6, 6, 5});
  // a transposed input: x^T = [[1,3,5],[2,4,6]], rows 1 -> [[2,4,6]]
  check_close(index_select(x.detach().mT(), 0, tensor<int64_t>({1})), {2, 4, 6});
  // i64 input (not differentiable) and an empty index
  check_close(index_select(tensor<int64_t>({10, 20, 30}), 0, tensor<int64_t>({2, 2})), {30, 30});
  CHECK(index_select(x.detach(), 0, zeros({0}, DType::i64)).shape() == Shape{0, 2});
}

TEST_CASE("index_select: gradcheck") {
  const Tensor rep = tensor<int64_t>({3, 0, 3, 1, 3});  // 2 never picked, 3 three times
  expect_gradcheck([&](const std::vector<Tensor>& x) { return index_select(x[0], 0, rep); }, {leaf64({4, 3}, 1)});
  expect_gradcheck([&](const std::vector<Tensor>& x) { return index_select(x[0], 1, rep); }, {leaf64({2, 4, 3}, 2)});
  expect_gradcheck([&](const std::vector<Tensor>& x) { return index_select(x[0].transpose(0, 2), -1, rep); },
                   {leaf64({4, 3, 2}, 3)});
  // the same tensor twice in one graph
  expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return mul(index_select(x[0], 0, tensor<int64_t>({1, 1, 0})), x[0]);
      },
      {leaf64({3, 2}, 4)});
}

TEST_CASE("index_select: backward with repeated indices is deterministic across thread counts") {
  const int prev = num_threads();
  Generator gen(7);
  Tensor idx = randint(0, 5, {4000}, &gen);  // many repeats of 5 rows
  Tensor x = randn({3, 5, 300}, DType::f32, &gen);
  Tensor g = randn({3, 4000, 300}, DType::f32, &gen);
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor xl = x.detach().set_requires_grad(true);
    index_select(xl, 1, idx).backward(g);
    grads.push_back(xl.grad().to_vector<float>());
  }
  set_num_threads(prev);
  CHECK(grads[0] == grads[1]);
  CHECK(grads[0] == grads[2]);
  // and the sums are right: compare one row with a plain loop in f64
  std::vector<int64_t> iv = idx.to_vector<int64_t>();
  std::vector<float> gv = g.to_vector<float>();
  double want = 0;
  for (size_t l = 0; l < iv.size(); ++l)
    if (iv[l] == 2) want += gv[(1 * 4000 + l) * 300 + 7];
  CHECK(grads[0][(1 * 5 + 2) * 300 + 7] == doctest::Approx(want).epsilon(1e-4));
}

TEST_CASE("index_select: errors") {
  Tensor x = zeros({3, 2});
  AG_CHECK_ERROR(index_select(x, 0, tensor<int64_t>({0, 5})), "index_select: index 5", "position 1",
                 "out of range for dim 0 of size 3");
  AG_CHECK_ERROR(index_select(x, 1, tensor<int64_t>({-1})), "index_select: index -1", "dim 1 of size 2");
  AG_CHECK_ERROR(index_select(x, 0, tensor({0.f})), "index_select: index must have dtype i64, got f32");
  AG_CHECK_ERROR(index_select(x, 0, zeros({1, 1}, DType::i64)), "index_select: index must be 1-D", "[1,1]");
  AG_CHECK_ERROR(index_select(x, 2, tensor<int64_t>({0})), "index_select: dim 2 is out of range");
  AG_CHECK_ERROR(index_select(scalar_tensor(1.0), 0, tensor<int64_t>({0})), "index_select: cannot index a 0-dim");
}
