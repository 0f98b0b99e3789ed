// The tape (autograd/tape.h): recording, replay, accumulation, release and the errors it raises.
#include <algorithm>
#include <functional>
#include <memory>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
Tensor s64(double v) { return scalar_tensor(v, DType::f64).set_requires_grad(true); }
double grad_of(const Tensor& t) { return t.grad().item<double>(); }
}  // namespace

TEST_CASE("tape: backward on a three-node graph") {
  // a = x y, b = a + x, L = b * b with x = 2, y = 3:
  //   a = 6, b = 8, L = 64;  dL/db = 2b = 16
  //   dL/dx = dL/db (y + 1) = 64,  dL/dy = dL/db x = 32
  Tensor x = s64(2), y = s64(3);
  Tensor a = mul(x, y);
  Tensor b = add(a, x);
  Tensor L = mul(b, b);
  CHECK(L.item<double>() == 64);
  CHECK(L.requires_grad());
  CHECK_FALSE(L.is_leaf());
  CHECK(x.is_leaf());
  L.backward();
  CHECK(grad_of(x) == 64);
  CHECK(grad_of(y) == 32);
  CHECK_FALSE(a.grad().defined());  // only leaves keep gradients
}

TEST_CASE("tape: a leaf can be the root") {
  Tensor x = s64(5);
  x.backward();
  CHECK(grad_of(x) == 1);
}

TEST_CASE("tape: non-scalar backward needs a gradient") {
  Tensor x = leaf64({2, 3});
  Tensor y = mul(x, 3.0);
  AG_CHECK_ERROR(y.backward(), "backward", "shape [2,3]", "needs an explicit gradient");
  AG_CHECK_ERROR(y.backward(ones({3, 2}, DType::f64)), "backward", "gradient shape [3,2]", "[2,3]");
  AG_CHECK_ERROR(y.backward(ones({2, 3}, DType::f32)), "backward", "dtype f32", "f64");
  // dL/dx = 3 g for y = 3x
  Tensor g = tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  y.backward(g);
  check_close(x.grad(), {3, 6, 9, 12, 15, 18});
  CHECK(g.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});  // the caller's g is untouched
  // a one-element output of any rank needs none
  Tensor z = sum(mul(x, x), {0, 1}, true);
  CHECK(z.shape() == Shape{1, 1});
  z.backward();
  AG_CHECK_ERROR(zeros({2}).backward(), "backward", "does not require grad");
}

TEST_CASE("tape: NoGradGuard records nothing") {
  Tensor x = leaf64({3});
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    Tensor y = exp(mul(x, x));
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
    CHECK(graph_to_string(y).empty());
    {
      NoGradGuard nested;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // the inner guard restores the outer state
  }
  CHECK(grad_enabled());
  CHECK(exp(x).requires_grad());
  // ops on tensors that do not require grad record nothing either
  Tensor c = exp(randn({3}, DType::f64));
  CHECK_FALSE(c.requires_grad());
  CHECK(c.grad_fn() == nullptr);
}

TEST_CASE("tape: detach") {
  Tensor x = leaf64({3});
  Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.impl().storage == y.impl().storage);  // same memory, no history
  // gradient flows through y but not through its detached copy:  L = y0 * d0 = 2 x0 * (2 x0)_const
  Tensor L = sum(mul(y, d));
  L.backward();
  std::vector<double> xv = x.detach().to_vector<double>(), gx = x.grad().to_vector<double>();
  for (size_t i = 0; i < 3; ++i) CHECK(gx[i] == doctest::Approx(2 * (2 * xv[i])));
  // writes through the detached tensor are seen by the original
  d.fill_(7);
  CHECK(y.detach().to_vector<double>() == std::vector<double>{7, 7, 7});
}

TEST_CASE("tape: gradients accumulate until set_grad(Tensor())") {
  Tensor x = s64(3);
  mul(x, x).backward();  // d(x^2)/dx = 2x = 6
  CHECK(grad_of(x) == 6);
  Tensor held = x.grad();
  mul(x, 5.0).backward();  // + 5
  CHECK(grad_of(x) == 11);
  CHECK(held.item<double>() == 11);  // accumulated in place, as PyTorch
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
  mul(x, 5.0).backward();
  CHECK(grad_of(x) == 5);
  x.set_grad(scalar_tensor(100, DType::f64));
  mul(x, 5.0).backward();
  CHECK(grad_of(x) == 105);
  AG_CHECK_ERROR(x.set_grad(zeros({2}, DType::f64)), "set_grad", "shape [2]", "shape []");
  AG_CHECK_ERROR(x.set_grad(scalar_tensor(1, DType::f32)), "set_grad", "dtype f32", "f64");
  // a non-contiguous gradient set by hand still accumulates
  Tensor m = leaf64({2, 3});
  m.set_grad(ones({3, 2}, DType::f64).transpose(0, 1));
  sum(m).backward();
  check_close(m.grad(), {2, 2, 2, 2, 2, 2});
}

TEST_CASE("tape: a freed graph cannot be replayed without retain_graph") {
  Tensor x = s64(2);
  Tensor L = mul(exp(x), x);  // dL/dx = e^x x + e^x = 3 e^2
  const double expected = 3 * std::exp(2.0);
  L.backward(Tensor(), /*retain_graph=*/true);
  CHECK(grad_of(x) == doctest::Approx(expected));
  L.backward(Tensor(), true);  // same gradients again, accumulated
  CHECK(grad_of(x) == doctest::Approx(2 * expected));
  L.backward();  // the last one frees the graph
  CHECK(grad_of(x) == doctest::Approx(3 * expected));
  CHECK(graph_to_string(L).find("(released)") != std::string::npos);
  AG_CHECK_ERROR(L.backward(), "backward", "freed by an earlier backward", "retain_graph=true", "'mul'");
  // a new graph over the same leaf is fine
  x.set_grad(Tensor());
  mul(exp(x), x).backward();
  CHECK(grad_of(x) == doctest::Approx(expected));
}

TEST_CASE("tape: a tensor used twice gets the sum of its gradients") {
  Tensor x = s64(3);
  mul(x, x).backward();  // 2x
  CHECK(grad_of(x) == 6);
  // shared weight: L = sum(w * a) + sum(w * b) -> dL/dw = a + b
  Tensor w = leaf64({3}, 5);
  Tensor a = tensor<double>({1, 2, 3}), b = tensor<double>({10, 20, 30});
  add(sum(mul(w, a)), sum(mul(w, b))).backward();
  check_close(w.grad(), {11, 22, 33});
  // diamond: h = exp(x); L = h * h + h  ->  dL/dx = (2h + 1) h
  Tensor z = s64(0.5);
  Tensor h = exp(z);
  add(mul(h, h), h).backward();
  const double hv = std::exp(0.5);
  CHECK(grad_of(z) == doctest::Approx((2 * hv + 1) * hv));
}

TEST_CASE("tape: a leaf used through two views") {
  // x [2,3]; L = sum(2 * x[:, 0:2]) + sum(3 * x.t()[1])
  //   dL/dx = 2 on columns 0,1 of both rows; + 3 on row 1 (x.t()[1] = x[1, :])
  Tensor x = leaf64({2, 3});
  Tensor L = add(sum(mul(x.slice(1, 0, 2), 2.0)), sum(mul(x.transpose(0, 1).select(1, 1), 3.0)));
  L.backward();
  check_close(x.grad(), {2, 2, 0, 5, 5, 3});
}

namespace {
// Integer weights 1..9 (the sums below are then exact in any order) of the given shape.
Tensor int_weights(const Shape& shape, uint64_t seed) {
  std::vector<double> v(size_t(shape.numel()));
  for (size_t k = 0; k < v.size(); ++k) v[k] = double(1 + (k * 7 + seed * 5 + k * k * seed) % 9);
  return from_vector(v, shape);
}
}  // namespace

TEST_CASE("tape: the slices of one tensor write their gradients into its gradient, summed where they overlap") {
  // p = 2 x; L = sum_i sum(part_i(p) * c_i). Each slice's gradient goes into its part of p's
  // gradient (Node::slice_of_input); the reference places each c_i by the flat indices its part
  // takes of an index tensor, so dL/dx[e] = 2 sum of the c_i over the parts that hold e.
  using Part = std::function<Tensor(const Tensor&)>;
  const Shape shape{2, 3, 8};
  const std::vector<std::pair<const char*, std::vector<Part>>> cases = {
      {"q, k, v: disjoint along the last dim, one range left out",
       {[](const Tensor& t) { return t.narrow(2, 0, 2); }, [](const Tensor& t) { return t.narrow(2, 2, 2); },
        [](const Tensor& t) { return t.narrow(2, 5, 3); }}},
      {"overlapping ranges",
       {[](const Tensor& t) { return t.narrow(2, 0, 5); }, [](const Tensor& t) { return t.narrow(2, 3, 5); },
        [](const Tensor& t) { return t.narrow(2, 4, 1); }}},
      {"two dims, a step and a select",
       {[](const Tensor& t) { return t.narrow(2, 0, 4); }, [](const Tensor& t) { return t.select(0, 1); },
        [](const Tensor& t) { return t.slice(1, 0, 3, 2); }, [](const Tensor& t) { return t.narrow(2, 2, 4); }}},
      {"a select then a slice of the same dim",
       {[](const Tensor& t) { return t.select(2, 3); }, [](const Tensor& t) { return t.slice(2, 1, 8, 3); }}},
      {"a strided slice alone, leaving gaps inside its range",
       {[](const Tensor& t) { return t.slice(2, 1, 8, 2); }}},
      {"q, k, v covering the whole",
       {[](const Tensor& t) { return t.narrow(2, 0, 3); }, [](const Tensor& t) { return t.narrow(2, 3, 3); },
        [](const Tensor& t) { return t.narrow(2, 6, 2); }}},
  };
  std::vector<double> index(size_t(shape.numel()));
  for (size_t e = 0; e < index.size(); ++e) index[e] = double(e);
  const Tensor where = from_vector(index, shape);
  for (const auto& [name, parts] : cases) {
    for (const bool anomaly : {false, true}) {  // anomaly mode runs every node's own backward
      const std::string what = name;  // a const char* would be logged as its address
      CAPTURE(what);
      CAPTURE(anomaly);
      DetectAnomalyGuard guard(anomaly);
      Tensor x = leaf64(shape);
      Tensor p = mul(x, 2.0);
      Tensor L = scalar_tensor(0.0, DType::f64);
      std::vector<double> want(index.size(), 0.0);
      for (size_t i = 0; i < parts.size(); ++i) {
        const Tensor part = parts[i](p), c = int_weights(part.shape(), i + 1);
        L = add(L, sum(mul(part, c)));
        const auto at = parts[i](where).contiguous().to_vector<double>(), cv = c.to_vector<double>();
        for (size_t k = 0; k < at.size(); ++k) want[size_t(at[k])] += 2 * cv[k];
      }
      {  // NaN-filled blocks of p's size in the allocator's cache: the tape makes p's gradient
         // without zeros where slices cover it, and must fill the rest itself
        std::vector<Tensor> junk;
        for (int i = 0; i < 16; ++i) junk.push_back(full(shape, std::nan(""), DType::f64));
      }
      L.backward();
      check_close(x.grad(), want, 0, 0);
    }
  }
}

TEST_CASE("tape: a slice's gradient does not write into a gradient that another node holds") {
  // add's backward hands the same tensor to p and to r. q, a slice of p recorded before the add,
  // runs after it: its gradient must go into a copy of p's, not into the tensor r's node got.
  Tensor x = leaf64({2, 6}), y = leaf64({2, 6}, 2);
  Tensor p = mul(x, 2.0), r = mul(y, 3.0);
  Tensor q = p.narrow(1, 1, 3);
  const Tensor w = int_weights({2, 6}, 1), c = int_weights({2, 3}, 2);
  Tensor L = add(sum(mul(add(p, r), w)), sum(mul(q, c)));
  L.backward();
  const auto wv = w.to_vector<double>(), cv = c.to_vector<double>();
  std::vector<double> dx(12), dy(12);
  for (size_t e = 0; e < 12; ++e) dx[e] = 2 * wv[e], dy[e] = 3 * wv[e];
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < 3; ++j) dx[i * 6 + 1 + j] += 2 * cv[i * 3 + j];
  check_close(y.grad(), dy, 0, 0);
  check_close(x.grad(), dx, 0, 0);
}

TEST_CASE("tape: graph_to_string and graph_to_dot list the ops in tape order") {
  Tensor x = leaf64({2, 2});
  Tensor L = sum(tanh(mul(x, x)));
  std::string s = graph_to_string(L);
  size_t pm = s.find("mul"), pt = s.find("tanh"), ps = s.find("sum");
  REQUIRE(pm != std::string::npos);
  REQUIRE(pt != std::string::npos);
  REQUIRE(ps != std::string::npos);
  CHECK(pm < pt);
  CHECK(pt < ps);
  CHECK(std::count(s.begin(), s.end(), '\n') == 3);  // one line per node
  CHECK(s.find("leaf[2,2]") != std::string::npos);
  std::string d = graph_to_dot(L);
  CHECK(d.rfind("digraph tape {", 0) == 0);
  CHECK(d.find("label=\"sum") != std::string::npos);
  CHECK(d.find("label=\"tanh") != std::string::npos);
  CHECK(d.find("label=\"mul") != std::string::npos);
  CHECK(d.find("shape=ellipse") != std::string::npos);  // the leaf
  CHECK(d.back() == '\n');
  CHECK(graph_to_string(x).empty());  // a leaf has no graph
}

TEST_CASE("tape: in-place writes to tensors that require grad are refused") {
  Tensor w = leaf64({3});
  AG_CHECK_ERROR(w.add_(ones({3}, DType::f64)), "add_", "requires grad", "NoGradGuard");
  AG_CHECK_ERROR(w.mul_(2), "mul_", "requires grad");
  AG_CHECK_ERROR(w.fill_(0), "fill_", "requires grad");
  AG_CHECK_ERROR(w.zero_(), "requires grad");
  AG_CHECK_ERROR(mul(w, 2.0).copy_(w), "copy_", "requires grad");
  AG_CHECK_ERROR(w.select(0, 1).fill_(1), "fill_", "requires grad");  // through a view too
  std::vector<double> before = w.detach().to_vector<double>();
  {
    NoGradGuard guard;  // an optimizer step
    w.add_(ones({3}, DType::f64), -0.5);
    w.mul_(2);
  }
  std::vector<double> after = w.detach().to_vector<double>();
  for (size_t i = 0; i < 3; ++i) CHECK(after[i] == doctest::Approx(2 * (before[i] - 0.5)));
  CHECK(w.requires_grad());
}

TEST_CASE("tape: requires_grad only on floating leaves") {
  AG_CHECK_ERROR(zeros({2}, DType::i64).set_requires_grad(), "requires_grad", "floating", "i64");
  AG_CHECK_ERROR(zeros({2}, DType::b8).set_requires_grad(), "requires_grad", "b8");
  Tensor x = leaf64({2});
  Tensor y = exp(x);
  AG_CHECK_ERROR(y.set_requires_grad(false), "requires_grad", "only leaves", "detach()");
  CHECK(zeros({2}, DType::i64).set_requires_grad(false).requires_grad() == false);
  CHECK(zeros({2}, DType::f32).set_requires_grad().requires_grad());
}

TEST_CASE("tape: a backward returning a wrong gradient is caught") {
  Tensor x = leaf64({2, 3});
  {
    Tensor y = x.detach().clone();
    record("buggy", {x}, y, [](const Tensor& g) { return std::vector{sum(g)}; });
    CHECK(y.requires_grad());
    AG_CHECK_ERROR(y.backward(ones({2, 3}, DType::f64)), "backward", "'buggy' returned a gradient of shape []",
                   "input 0 of shape [2,3]");
  }
  {
    Tensor y = x.detach().clone();
    record("wrong_dtype", {x}, y, [](const Tensor& g) { return std::vector{g.to(DType::f32)}; });
    AG_CHECK_ERROR(y.backward(ones({2, 3}, DType::f64)), "'wrong_dtype' returned a gradient of dtype f32",
                   "input 0 of dtype f64");
  }
  {
    Tensor y = x.detach().clone();
    record("two", {x}, y, [](const Tensor& g) { return std::vector{g, g}; });
    AG_CHECK_ERROR(y.backward(ones({2, 3}, DType::f64)), "'two' returned 2 gradients for 1 inputs");
  }
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("tape: a failed backward leaves no stale gradient behind") {
  // L = sum(a + flaky(a)), a = 2x. The add node hands g to both the flaky node and the mul node;
  // then the flaky node fails once. The retried backward must not see the first attempt's g.
  Tensor x = leaf64({3});
  Tensor a = mul(x, 2.0);
  Tensor b = a.detach().clone();
  auto calls = std::make_shared<int>(0);
  record("flaky", {a}, b, [calls](const Tensor& g) {
    return std::vector{++*calls == 1 ? sum(g) : g};  // wrong shape the first time
  });
  Tensor L = sum(add(a, b));
  AG_CHECK_ERROR(L.backward(Tensor(), true), "'flaky' returned a gradient of shape []");
  L.backward(Tensor(), true);
  check_close(x.grad(), {4, 4, 4});  // dL/da = 1 + 1, da/dx = 2
}

TEST_CASE("tape: a very long graph is freed without deep recursion") {
  // 300000 chained adds, then dropped: freeing the chain recursively would overflow the stack.
  const uint64_t base = alloc_stats().bytes_in_use;
  {
    Tensor x = s64(0);
    Tensor y = x;
    for (int i = 0; i < 300000; ++i) y = add(y, 1.0);
    CHECK(y.item<double>() == 300000);
  }
  CHECK(alloc_stats().bytes_in_use == base);
}

TEST_CASE("tape: a tensor written in place after an op saved it is refused at backward") {
  // mul saves its inputs: changing a (which needs no grad) before backward would give w the
  // gradient of the new a.
  Tensor w = leaf64({3}, 1);
  Tensor a = tensor<double>({1, 2, 3});
  Tensor L = sum(mul(w, a));
  a.fill_(0);
  AG_CHECK_ERROR(L.backward(), "backward", "input 1 of 'mul'", "modified by an in-place op", "clone() it");
  CHECK_FALSE(w.grad().defined());
  // exp saves its output: the same for a write to y (under NoGradGuard, since y requires grad)
  Tensor s = s64(1);
  Tensor y = exp(s);
  {
    NoGradGuard guard;
    y.mul_(2);
  }
  AG_CHECK_ERROR(y.backward(), "backward", "the output of 'exp'", "modified by an in-place op");
  // every op of the graph checks its tensors (here sum's input, which is exp's output)
  Tensor y2 = exp(w);
  Tensor M = sum(y2);
  {
    NoGradGuard guard;
    y2.mul_(2);
  }
  AG_CHECK_ERROR(M.backward(), "input 0 of 'sum'", "must not change until backward has run");
  // writes before the op ran, and to clones, are fine; so is a tensor that nobody holds any more
  Tensor b = tensor<double>({1, 2, 3});
  b.fill_(2);
  Tensor c = b.clone();
  Tensor N = sum(mul(w, b));
  c.fill_(5);
  N.backward();
  check_close(w.grad(), {2, 2, 2});
  // after the step of an optimizer, a retained graph over the old weights is stale too
  Tensor v = leaf64({2}, 2);
  Tensor P = sum(mul(v, v));
  P.backward(Tensor(), true);
  {
    NoGradGuard guard;
    v.add_(v.grad(), -0.1);
  }
  AG_CHECK_ERROR(P.backward(), "input 0 of 'mul'");
}
