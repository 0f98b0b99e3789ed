#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("cat: known values") {
  Tensor a = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2}).set_requires_grad(true);
  Tensor b = tensor({5.f, 6.f}, {1, 2}).set_requires_grad(true);
  Tensor c = tensor({7.f, 8.f}, {2, 1});
  // along dim 0 the rows follow each other: [[1,2],[3,4],[5,6]]
  Tensor y = cat({a, b}, 0);
  CHECK(y.shape() == Shape{3, 2});
  check_close(y, {1, 2, 3, 4, 5, 6});
  // along dim 1 (also as -1) the columns do: [[1,2,7],[3,4,8]]
  check_close(cat({a, c}, 1), {1, 2, 7, 3, 4, 8});
  check_close(cat({a, c}, -1), {1, 2, 7, 3, 4, 8});
  // L = sum(y * w), w = [[0,1],[2,3],[4,5]]: da = w[0:2], db = w[2:3] (narrows of the gradient)
  sum(mul(y, arange(0, 6, 1, DType::f32).reshape({3, 2}))).backward();
  check_close(a.grad(), {0, 1, 2, 3});
  check_close(b.grad(), {4, 5});
  // a transposed input is copied element by element: a^T = [[1,3],[2,4]]
  check_close(cat({a.detach().mT(), b.detach()}, 0), {1, 3, 2, 4, 5, 6});
  // a single input is a copy; empty inputs add nothing
  check_close(cat({b}, 0), {5, 6});
  check_close(cat({zeros({0, 2}), b, zeros({0, 2})}, 0), {5, 6});
}

TEST_CASE("cat: gradcheck") {
  expect_gradcheck([](const std::vector<Tensor>& x) { return cat({x[0], x[1]}, 0); },
                   {leaf64({2, 3}, 1), leaf64({4, 3}, 2)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return cat({x[0], x[1], x[0]}, 1); },
                   {leaf64({2, 3}, 3), leaf64({2, 1}, 4)});
  // non-contiguous inputs, a middle dim
  expect_gradcheck([](const std::vector<Tensor>& x) { return cat({x[0].transpose(0, 2), x[1].slice(1, 0, 4, 2)}, 1); },
                   {leaf64({4, 3, 2}, 5), leaf64({2, 4, 4}, 6)});
  // the same tensor twice: its gradient is the sum of both slices
  expect_gradcheck([](const std::vector<Tensor>& x) { return cat({x[0], x[0]}, -1); }, {leaf64({3, 2}, 7)});
}

TEST_CASE("stack: known values and gradcheck") {
  Tensor a = tensor({1.f, 2.f}), b = tensor({3.f, 4.f});
  Tensor s0 = stack({a, b});  // [[1,2],[3,4]]
  CHECK(s0.shape() == Shape{2, 2});
  check_close(s0, {1, 2, 3, 4});
  Tensor s1 = stack({a, b}, 1);  // [[1,3],[2,4]]
  check_close(s1, {1, 3, 2, 4});
  CHECK(stack({a, b, a}, -1).shape() == Shape{2, 3});
  expect_gradcheck([](const std::vector<Tensor>& x) { return stack({x[0], x[1], x[0]}, 1); },
                   {leaf64({2, 3}, 1), leaf64({2, 3}, 2)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return stack({x[0].mT(), x[1]}, -1); },
                   {leaf64({3, 2}, 3), leaf64({2, 3}, 4)});
}

TEST_CASE("split: views of split_size, the last one smaller") {
  Tensor x = arange(0, 5, 1, DType::f32);
  std::vector<Tensor> p = split(x, 2);
  REQUIRE(p.size() == 3);
  check_close(p[0], {0, 1});
  check_close(p[1], {2, 3});
  check_close(p[2], {4});
  CHECK(p[1].impl().storage == x.impl().storage);  // a view: no copy
  // along dim 1 of a [2,3]: [[0,1],[3,4]] and [[2],[5]]
  std::vector<Tensor> q = split(arange(0, 6, 1, DType::f32).reshape({2, 3}), 2, 1);
  REQUIRE(q.size() == 2);
  check_close(q[0], {0, 1, 3, 4});
  check_close(q[1], {2, 5});
  // gradients: pieces reordered and one scaled, so a swapped or missing narrow shows
  expect_gradcheck(
      [](const std::vector<Tensor>& x) {
        std::vector<Tensor> s = split(x[0], 2, 1);
        return cat({s[2], mul(s[0], 3.0), s[1]}, 1);
      },
      {leaf64({2, 5}, 1)});
  // the same tensor through two splits
  expect_gradcheck(
      [](const std::vector<Tensor>& x) {
        std::vector<Tensor> s = split(x[0], 1, 0), t = split(x[0], 2, 0);
        return mul(s[0], t[0].narrow(0, 1, 1));
      },
      {leaf64({3, 2}, 2)});
}

TEST_CASE("chunk: torch.chunk semantics") {
  auto sizes = [](const std::vector<Tensor>& parts) {
    std::vector<int64_t> s;
    for (const Tensor& t : parts) s.push_back(t.shape()[0]);
    return s;
  };
  CHECK(sizes(chunk(arange(5.0, DType::f32), 3)) == std::vector<int64_t>{2, 2, 1});
  CHECK(sizes(chunk(arange(6.0, DType::f32), 3)) == std::vector<int64_t>{2, 2, 2});
  // ceil(6 / 4) = 2 per chunk: only 3 chunks, as torch.chunk
  CHECK(sizes(chunk(arange(6.0, DType::f32), 4)) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes(chunk(arange(2.0, DType::f32), 5)) == std::vector<int64_t>{1, 1});
  CHECK(sizes(chunk(zeros({0, 2}), 3)) == std::vector<int64_t>{0, 0, 0});
  std::vector<Tensor> c = chunk(arange(0, 6, 1, DType::f32).reshape({2, 3}), 3, -1);  // the columns
  REQUIRE(c.size() == 3);
  check_close(c[1], {1, 4});
  // q, k, v = chunk(qkv, 3, -1), the attention pattern
  expect_gradcheck(
      [](const std::vector<Tensor>& x) {
        std::vector<Tensor> qkv = chunk(x[0], 3, -1);
        return add(mul(qkv[0], qkv[1]), mul(qkv[2], 2.0));
      },
      {leaf64({2, 6}, 1)});
}

TEST_CASE("cat/stack/split/chunk: errors") {
  AG_CHECK_ERROR(cat({}, 0), "cat: expected a non-empty list");
  AG_CHECK_ERROR(cat({zeros({2, 3}), zeros({2, 3}), zeros({2, 4})}, 0), "cat: input 2 has shape [2,4]",
                 "input 0 has shape [2,3]", "except in dim 0");
  AG_CHECK_ERROR(cat({zeros({2, 3}), zeros({6})}, 0), "cat: input 1 has shape [6]", "[2,3]");
  AG_CHECK_ERROR(cat({zeros({2}), zeros({2}, DType::f64)}, 0), "cat: input 1 has dtype f64", "input 0 has f32");
  AG_CHECK_ERROR(cat({zeros({2})}, 1), "cat: dim 1 is out of range", "1 dims");
  AG_CHECK_ERROR(cat({scalar_tensor(1.0)}, 0), "cat: input 0 is 0-dim");
  AG_CHECK_ERROR(stack({}, 0), "stack: expected a non-empty list");
  AG_CHECK_ERROR(stack({zeros({2, 3}), zeros({3, 2})}, 0), "stack: input 1 has shape [3,2]", "input 0 has shape [2,3]");
  AG_CHECK_ERROR(stack({zeros({2}), zeros({2})}, 2), "stack: dim 2 is out of range");
  AG_CHECK_ERROR(split(zeros({4}), 0), "split: split_size must be >= 1", "got 0");
  AG_CHECK_ERROR(split(zeros({4}), 2, 1), "split: dim 1 is out of range");
  AG_CHECK_ERROR(chunk(zeros({4}), 0), "chunk: chunks must be >= 1, got 0");
  AG_CHECK_ERROR(chunk(scalar_tensor(1.0), 2), "chunk: cannot chunk a 0-dim tensor");
}
