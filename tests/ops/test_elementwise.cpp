// Elementwise ops (autograd/ops/elementwise.cpp): known values with hand derivations, gradchecks
// over broadcast, non-contiguous and repeated inputs, tie semantics at kinks, and errors.
#include <cmath>
#include <functional>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;

Tensor v64(std::initializer_list<double> v) { return tensor<double>(v).set_requires_grad(true); }

// f64 leaf with values in about [0.4, 2.5]: inside the domain of log, sqrt, rsqrt, pow, 1/x.
Tensor pos64(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return exp(mul(randn(shape, DType::f64, &g), 0.3)).detach().set_requires_grad(true);
}

// y = f(x) and, for L = sum(y), dL/dx at the given points.
void check_unary(const Fn1& f, std::vector<double> x, std::vector<double> y, std::vector<double> dx) {
  Tensor xt = from_vector(x).set_requires_grad(true);
  Tensor yt = f(xt);
  check_close(yt, y, 1e-12, 1e-12);
  sum(yt).backward();
  check_close(xt.grad(), dx, 1e-12, 1e-12);
}

// y = f(a, b) and the gradients of L = sum(y).
void check_binary(const Fn2& f, const Tensor& a, const Tensor& b, std::vector<double> y, std::vector<double> da,
                  std::vector<double> db) {
  Tensor yt = f(a, b);
  check_close(yt, y, 1e-12, 1e-12);
  sum(yt).backward();
  check_close(a.grad(), da, 1e-12, 1e-12);
  check_close(b.grad(), db, 1e-12, 1e-12);
}

// Gradchecks of a unary op: dense, transposed, sliced with a step, and x used twice.
void gradcheck_unary(const Fn1& f, bool positive = false) {
  auto leaf = [&](const Shape& s, uint64_t seed) { return positive ? pos64(s, seed) : leaf64(s, seed); };
  {
    INFO("dense");
    expect_gradcheck([&](auto& x) { return f(x[0]); }, {leaf({3, 4}, 1)});
  }
  {
    INFO("transposed");
    expect_gradcheck([&](auto& x) { return f(x[0].transpose(0, 1)); }, {leaf({3, 4}, 2)});
  }
  {
    INFO("sliced with a step");
    expect_gradcheck([&](auto& x) { return f(x[0].slice(1, 1, 6, 2)); }, {leaf({2, 6}, 3)});
  }
  {
    INFO("used twice");
    expect_gradcheck([&](auto& x) { return mul(f(x[0]), x[0]); }, {leaf({5}, 4)});
  }
}

// Gradchecks of a binary op: same shape, [3,1] op [1,4], [4] op [2,3,4], a 0-dim operand,
// non-contiguous operands, and one tensor as both operands.
void gradcheck_binary(const Fn2& f, bool positive_b = false, bool positive_a = false) {
  auto la = [&](const Shape& s, uint64_t seed) { return positive_a ? pos64(s, seed) : leaf64(s, seed); };
  auto lb = [&](const Shape& s, uint64_t seed) { return positive_b ? pos64(s, seed) : leaf64(s, seed); };
  auto plain = [&](auto& x) { return f(x[0], x[1]); };
  {
    INFO("same shape");
    expect_gradcheck(plain, {la({2, 3}, 1), lb({2, 3}, 2)});
  }
  {
    INFO("[3,1] op [1,4]");
    expect_gradcheck(plain, {la({3, 1}, 3), lb({1, 4}, 4)});
  }
  {
    INFO("[4] op [2,3,4] and back");
    expect_gradcheck(plain, {la({4}, 5), lb({2, 3, 4}, 6)});
    expect_gradcheck(plain, {la({2, 3, 4}, 7), lb({4}, 8)});
  }
  {
    INFO("0-dim operand");
    expect_gradcheck(plain, {la({2, 3}, 9), lb({}, 10)});
  }
  {
    INFO("non-contiguous");
    // a: transposed [4,3] -> [3,4];  b: every other column of [3,8] -> [3,4]
    expect_gradcheck([&](auto& x) { return f(x[0].transpose(0, 1), x[1].slice(1, 0, 8, 2)); },
                     {la({4, 3}, 11), lb({3, 8}, 12)});
  }
  {
    INFO("same tensor twice");
    Tensor x = positive_a || positive_b ? pos64({2, 3}, 13) : leaf64({2, 3}, 13);
    expect_gradcheck([&](auto& v) { return f(v[0], v[0]); }, {x});
  }
}

}  // namespace

// ---- arithmetic ----------------------------------------------------------------------------
TEST_CASE("add: known values") {
  // y = a + b, dy/da = dy/db = 1; b broadcast over 2 rows gets the sum of 2 ones
  check_binary([](auto& a, auto& b) { return add(a, b); }, tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true),
               v64({10, 20, 30}), {11, 22, 33, 14, 25, 36}, {1, 1, 1, 1, 1, 1}, {2, 2, 2});
  CHECK(add(tensor<int64_t>({1, 2}), tensor<int64_t>({10, -20})).to_vector<int64_t>() ==
        std::vector<int64_t>{11, -18});
  check_close(add(tensor({1.f, 2.f}), 0.5), {1.5, 2.5});
  check_close(tensor({1.f, 2.f}) + 0.5, {1.5, 2.5});
  check_close(0.5 + tensor({1.f, 2.f}), {1.5, 2.5});
  check_close(tensor({1.f, 2.f}) + tensor({3.f, 4.f}), {4, 6});
}
TEST_CASE("add: gradcheck") { gradcheck_binary([](auto& a, auto& b) { return add(a, b); }); }

TEST_CASE("sub: known values") {
  // y = a - b: da = 1, db = -1
  check_binary([](auto& a, auto& b) { return sub(a, b); }, v64({5, 7}), v64({1, 10}), {4, -3}, {1, 1}, {-1, -1});
  CHECK(sub(tensor<int64_t>({1, 2}), tensor<int64_t>({10, -20})).to_vector<int64_t>() == std::vector<int64_t>{-9, 22});
  check_close(sub(tensor({1.f, 2.f}), 0.5), {0.5, 1.5});
  check_close(sub(3.0, tensor({1.f, 2.f})), {2, 1});
  check_close(3.0 - tensor({1.f, 2.f}), {2, 1});
  check_close(tensor({1.f, 2.f}) - tensor({3.f, 5.f}), {-2, -3});
  Tensor x = v64({1, 2});
  sum(sub(10.0, x)).backward();  // d(10 - x)/dx = -1
  check_close(x.grad(), {-1, -1});
}
TEST_CASE("sub: gradcheck") { gradcheck_binary([](auto& a, auto& b) { return sub(a, b); }); }

TEST_CASE("mul: known values") {
  // y = a b: da = b, db = a
  check_binary([](auto& a, auto& b) { return mul(a, b); }, v64({2, -3}), v64({5, 4}), {10, -12}, {5, 4}, {2, -3});
  CHECK(mul(tensor<int64_t>({3, -2}), tensor<int64_t>({4, 5})).to_vector<int64_t>() == std::vector<int64_t>{12, -10});
  check_close(mul(tensor({1.f, 2.f}), 3.0), {3, 6});
  check_close(3.0 * tensor({1.f, 2.f}), {3, 6});
  // x * x: dy/dx = 2x
  Tensor x = v64({3, -1});
  sum(mul(x, x)).backward();
  check_close(x.grad(), {6, -2});
}
TEST_CASE("mul: gradcheck") { gradcheck_binary([](auto& a, auto& b) { return mul(a, b); }); }

TEST_CASE("div: known values") {
  // y = a / b: da = 1/b, db = -a/b^2
  check_binary([](auto& a, auto& b) { return div(a, b); }, v64({1, -6}), v64({4, 2}), {0.25, -3}, {0.25, 0.5},
               {-1.0 / 16, 1.5});
  check_close(div(tensor({1.f, 3.f}), 2.0), {0.5, 1.5});
  check_close(tensor({1.f, 3.f}) / 2.0, {0.5, 1.5});
  check_close(div(3.0, tensor({1.f, 4.f})), {3, 0.75});
  check_close(3.0 / tensor({1.f, 4.f}), {3, 0.75});
  // IEEE semantics, as PyTorch: 1/0 = inf, 0/0 = nan
  std::vector<double> r = div(tensor({1.f, 0.f}), tensor({0.f, 0.f})).to_vector<double>();
  CHECK(std::isinf(r[0]));
  CHECK(std::isnan(r[1]));
  // x / x = 1 with gradient 1/x - x/x^2 = 0
  Tensor x = v64({3, -2});
  check_close(div(x, x), {1, 1});
  sum(div(x, x)).backward();
  check_close(x.grad(), {0, 0}, 1e-15);
  // 2 / x: d/dx = -2 / x^2
  Tensor z = v64({2, -4});
  sum(div(2.0, z)).backward();
  check_close(z.grad(), {-0.5, -0.125});
}
TEST_CASE("div: gradcheck") {
  gradcheck_binary([](auto& a, auto& b) { return div(a, b); }, /*positive_b=*/true);
  expect_gradcheck([](auto& x) { return div(2.0, x[0]); }, {pos64({3}, 1)});
}

TEST_CASE("neg: known values") {
  check_unary([](auto& x) { return neg(x); }, {1, -2}, {-1, 2}, {-1, -1});
  check_close(-tensor({1.f, -2.f}), {-1, 2});
  CHECK(neg(tensor<int64_t>({3, -4})).to_vector<int64_t>() == std::vector<int64_t>{-3, 4});
}
TEST_CASE("neg: gradcheck") { gradcheck_unary([](auto& x) { return neg(x); }); }

TEST_CASE("pow: known values, scalar exponent") {
  // y = x^3, dx = 3 x^2
  check_unary([](auto& x) { return pow(x, 3.0); }, {2, -1}, {8, -1}, {12, 3});
  // y = x^0 = 1 with dx = 0, also at x = 0 (as PyTorch)
  check_unary([](auto& x) { return pow(x, 0.0); }, {0, 5}, {1, 1}, {0, 0});
  // y = x^(1/2), dx = 1/(2 sqrt x);  y = x^-1, dx = -x^-2
  check_unary([](auto& x) { return pow(x, 0.5); }, {4}, {2}, {0.25});
  check_unary([](auto& x) { return pow(x, -1.0); }, {2}, {0.5}, {-0.25});
  CHECK(std::isnan(pow(tensor({-8.f}), 1.0 / 3).item<float>()));  // as std::pow and PyTorch
}
TEST_CASE("pow: gradcheck, scalar exponent") {
  gradcheck_unary([](auto& x) { return pow(x, 3.0); });
  gradcheck_unary([](auto& x) { return pow(x, 2.5); }, /*positive=*/true);
  gradcheck_unary([](auto& x) { return pow(x, -1.5); }, true);
}

TEST_CASE("pow: known values, tensor exponent") {
  // y = x^t: dx = t x^(t-1), dt = x^t ln x
  //   x = 2, t = 3: y = 8, dx = 12, dt = 8 ln 2
  //   x = 4, t = 0.5: y = 2, dx = 0.25, dt = 2 ln 4
  check_binary([](auto& x, auto& t) { return pow(x, t); }, v64({2, 4}), v64({3, 0.5}), {8, 2}, {12, 0.25},
               {8 * std::log(2.0), 2 * std::log(4.0)});
  // at x = 0: dt is 0 (not 0 * -inf = nan) when t >= 0; t = 0 gives y = 1 and dx = 0
  check_binary([](auto& x, auto& t) { return pow(x, t); }, v64({0, 0}), v64({2, 0}), {0, 1}, {0, 0}, {0, 0});
}
TEST_CASE("pow: gradcheck, tensor exponent") {
  gradcheck_binary([](auto& x, auto& t) { return pow(x, t); }, /*positive_b=*/false, /*positive_a=*/true);
}

// ---- unary ---------------------------------------------------------------------------------
TEST_CASE("exp: known values") {
  // y = e^x, dx = e^x
  const double e = std::exp(1.0), e2 = std::exp(-2.0);
  check_unary([](auto& x) { return exp(x); }, {0, 1, -2}, {1, e, e2}, {1, e, e2});
}
TEST_CASE("exp: gradcheck") { gradcheck_unary([](auto& x) { return exp(x); }); }

TEST_CASE("log: known values") {
  // y = ln x, dx = 1/x
  const double e = std::exp(1.0);
  check_unary([](auto& x) { return log(x); }, {1, e, 0.5}, {0, 1, -std::log(2.0)}, {1, 1 / e, 2});
}
TEST_CASE("log: gradcheck") { gradcheck_unary([](auto& x) { return log(x); }, true); }

TEST_CASE("sqrt: known values") {
  // y = x^(1/2), dx = 1/(2y)
  check_unary([](auto& x) { return sqrt(x); }, {4, 0.25, 9}, {2, 0.5, 3}, {0.25, 1, 1.0 / 6});
}
TEST_CASE("sqrt: gradcheck") { gradcheck_unary([](auto& x) { return sqrt(x); }, true); }

TEST_CASE("rsqrt: known values") {
  // y = x^(-1/2), dx = -y^3/2 = -x^(-3/2)/2
  check_unary([](auto& x) { return rsqrt(x); }, {4, 0.25, 16}, {0.5, 2, 0.25}, {-1.0 / 16, -4, -1.0 / 128});
}
TEST_CASE("rsqrt: gradcheck") { gradcheck_unary([](auto& x) { return rsqrt(x); }, true); }

TEST_CASE("tanh: known values") {
  // tanh x = (e^2x - 1)/(e^2x + 1): at x = ln(3)/2, e^2x = 3 so y = 1/2; dx = 1 - y^2 = 3/4
  const double h = std::log(3.0) / 2;
  check_unary([](auto& x) { return tanh(x); }, {0, h, -h}, {0, 0.5, -0.5}, {1, 0.75, 0.75});
}
TEST_CASE("tanh: gradcheck") { gradcheck_unary([](auto& x) { return tanh(x); }); }

TEST_CASE("sigmoid: known values") {
  // s(x) = 1/(1 + e^-x): s(ln 3) = 1/(1 + 1/3) = 3/4; ds = s (1 - s) = 3/16
  const double l = std::log(3.0);
  check_unary([](auto& x) { return sigmoid(x); }, {0, l, -l}, {0.5, 0.75, 0.25}, {0.25, 0.1875, 0.1875});
}
TEST_CASE("sigmoid: gradcheck") { gradcheck_unary([](auto& x) { return sigmoid(x); }); }

TEST_CASE("relu: known values") {
  // y = max(x, 0); dx = [x > 0], so 0 at the kink x = 0 (as PyTorch)
  check_unary([](auto& x) { return relu(x); }, {-2, 0, 3}, {0, 0, 3}, {0, 0, 1});
  CHECK(std::isnan(relu(tensor({NAN})).item<float>()));  // NaN propagates, as PyTorch
}
TEST_CASE("relu: gradcheck") { gradcheck_unary([](auto& x) { return relu(x); }); }

TEST_CASE("abs: known values") {
  // y = |x|, dx = sign(x), 0 at x = 0 (as PyTorch)
  check_unary([](auto& x) { return abs(x); }, {-2, 0, 3}, {2, 0, 3}, {-1, 0, 1});
}
TEST_CASE("abs: gradcheck") { gradcheck_unary([](auto& x) { return abs(x); }); }

TEST_CASE("gelu: known values") {
  // exact: y = x Phi(x), dx = Phi(x) + x phi(x);  Phi(1) = 0.841344746..., phi(1) = 0.241970724...
  check_unary([](auto& x) { return gelu(x); }, {0, 1, -1}, {0, 0.8413447460685429, -0.15865525393145707},
              {0.5, 1.0833154705876864, -0.08331547058768629});
  // tanh form: u = sqrt(2/pi)(x + 0.044715 x^3), y = x/2 (1 + tanh u), values from its formula in
  // ops.h evaluated in double (PyTorch's gelu(1, approximate='tanh') = 0.8411920)
  check_unary([](auto& x) { return gelu(x, "tanh"); }, {0, 1, -1, 2},
              {0, 0.8411919906082768, -0.15880800939172324, 1.954597694087775},
              {0.5, 1.0829640838457826, -0.08296408384578252, 1.0860992566236183});
}
TEST_CASE("gelu: gradcheck") {
  gradcheck_unary([](auto& x) { return gelu(x); });
  gradcheck_unary([](auto& x) { return gelu(x, "tanh"); });
}

TEST_CASE("silu: known values") {
  // y = x s(x), dx = s (1 + x (1 - s));  s(1) = 0.731058578...
  check_unary([](auto& x) { return silu(x); }, {0, 1, -1}, {0, 0.7310585786300049, -0.2689414213699951},
              {0.5, 0.9276705118714869, 0.07232948812851325});
}
TEST_CASE("silu: gradcheck") { gradcheck_unary([](auto& x) { return silu(x); }); }

TEST_CASE("clamp: known values") {
  // y = min(max(x, -1), 2); dx = [-1 <= x <= 2]: the bounds themselves pass the gradient (as PyTorch)
  check_unary([](auto& x) { return clamp(x, -1, 2); }, {-3, -1, 0.5, 2, 5}, {-1, -1, 0.5, 2, 2}, {0, 1, 1, 1, 0});
  CHECK(std::isnan(clamp(tensor({NAN}), 0, 1).item<float>()));
}
TEST_CASE("clamp: gradcheck") { gradcheck_unary([](auto& x) { return clamp(x, -0.5, 0.7); }); }

TEST_CASE("maximum: known values and ties") {
  // y = max(a, b): the larger one gets g; a tie gives g/2 to each (as PyTorch)
  check_binary([](auto& a, auto& b) { return maximum(a, b); }, v64({1, 5, 3}), v64({2, 4, 3}), {2, 5, 3},
               {0, 1, 0.5}, {1, 0, 0.5});
  // maximum(x, x) = x: the two halves add up to dx = 1
  Tensor x = v64({1, -2});
  sum(maximum(x, x)).backward();
  check_close(x.grad(), {1, 1});
  std::vector<double> n = maximum(tensor({NAN, 1.f}), tensor({0.f, NAN})).to_vector<double>();
  CHECK(std::isnan(n[0]));  // NaN wins on either side
  CHECK(std::isnan(n[1]));
}
TEST_CASE("maximum: gradcheck") { gradcheck_binary([](auto& a, auto& b) { return maximum(a, b); }); }

TEST_CASE("minimum: known values and ties") {
  check_binary([](auto& a, auto& b) { return minimum(a, b); }, v64({1, 5, 3}), v64({2, 4, 3}), {1, 4, 3},
               {1, 0, 0.5}, {0, 1, 0.5});
  std::vector<double> n = minimum(tensor({NAN, 1.f}), tensor({0.f, NAN})).to_vector<double>();
  CHECK(std::isnan(n[0]));
  CHECK(std::isnan(n[1]));
}
TEST_CASE("minimum: gradcheck") { gradcheck_binary([](auto& a, auto& b) { return minimum(a, b); }); }

// ---- f32 kernels (vectorised: fast_exp/Phi of vecmath.h, libmvec tanh/log) agree with f64 ----
TEST_CASE("elementwise: f32 agrees with f64 on a long contiguous input") {
  // 4099 elements: the vector body and a remainder; values over [-9, 9] (and (0, 9] where needed)
  Tensor x64 = mul(sub(rand({4099}, DType::f64), 0.5), 18.0);
  Tensor p64 = add(mul(rand({4099}, DType::f64), 9.0), 1e-3);
  const std::vector<std::pair<const char*, Fn1>> ops = {
      {"exp", [](auto& x) { return exp(x); }},         {"tanh", [](auto& x) { return tanh(x); }},
      {"sigmoid", [](auto& x) { return sigmoid(x); }}, {"relu", [](auto& x) { return relu(x); }},
      {"abs", [](auto& x) { return abs(x); }},         {"gelu", [](auto& x) { return gelu(x); }},
      {"gelu tanh", [](auto& x) { return gelu(x, "tanh"); }},
      {"silu", [](auto& x) { return silu(x); }},       {"neg", [](auto& x) { return neg(x); }},
      {"clamp", [](auto& x) { return clamp(x, -1, 1); }}};
  for (auto& [name, f] : ops) {
    INFO(name);
    check_close(f(x64.to(DType::f32)), f(x64), 1e-6, 4e-6);
  }
  const std::vector<std::pair<const char*, Fn1>> pos_ops = {{"log", [](auto& x) { return log(x); }},
                                                             {"sqrt", [](auto& x) { return sqrt(x); }},
                                                             {"rsqrt", [](auto& x) { return rsqrt(x); }},
                                                             {"pow", [](auto& x) { return pow(x, 1.7); }}};
  for (auto& [name, f] : pos_ops) {
    INFO(name);
    check_close(f(p64.to(DType::f32)), f(p64), 1e-6, 4e-6);
  }
  // IEEE specials pass through as in PyTorch
  Tensor s = tensor({-INFINITY, INFINITY, 0.f, -1.f});
  std::vector<float> e = exp(s).to_vector<float>(), l = log(s).to_vector<float>(), t = tanh(s).to_vector<float>();
  CHECK(e[0] == 0.f);
  CHECK(std::isinf(e[1]));
  CHECK(l[2] == -INFINITY);
  CHECK(std::isnan(l[3]));
  CHECK(t[0] == -1.f);
  CHECK(t[1] == 1.f);
  CHECK(sigmoid(s).to_vector<float>()[0] == 0.f);
  CHECK(sigmoid(s).to_vector<float>()[1] == 1.f);
}

// ---- the loop engine on arbitrary layouts ----------------------------------------------------------
namespace {
// The values of a strided f64 tensor read straight from its storage by the multi-index (an oracle
// independent of the loop engine, which to_vector itself uses).
std::vector<double> read_strided(const Tensor& t) {
  const double* base = static_cast<const double*>(t.impl().storage->ptr) + t.offset();
  std::vector<double> out;
  Shape idx = t.shape();
  for (int64_t flat = 0; flat < t.numel(); ++flat) {
    int64_t rem = flat, off = 0;
    for (int d = t.ndim() - 1; d >= 0; --d) idx[d] = rem % t.shape()[d], rem /= t.shape()[d];
    for (int d = 0; d < t.ndim(); ++d) off += idx[d] * t.strides()[d];
    out.push_back(base[off]);
  }
  return out;
}
}  // namespace

TEST_CASE("elementwise: any layout matches a direct strided read") {
  Tensor base = randn({4, 5, 6}, DType::f64);
  Tensor other = randn({6, 5, 4}, DType::f64);
  // same-shape [4,5,3] views with different memory orders, broadcasts and overlaps
  const std::vector<std::pair<const char*, Tensor>> views = {
      {"contiguous", base.narrow(2, 0, 3)},
      {"stepped", base.slice(2, 0, 6, 2)},
      {"permuted", other.permute({2, 1, 0}).narrow(2, 1, 3)},
      {"broadcast rows", base.select(1, 2).unsqueeze(1).expand({4, 5, 6}).narrow(2, 2, 3)},
      {"broadcast all", base.select(0, 1).select(0, 1).select(0, 1).expand({4, 5, 3})},
      // sliding windows: w[i, j, k] = flat[i + j + k], equal nonzero strides in every dim
      {"overlapping windows", as_strided(base, {4, 5, 3}, {1, 1, 1}, 7)}};
  for (auto& [na, a] : views) {
    std::vector<double> va = read_strided(a);
    std::vector<double> ex;
    for (double v : va) ex.push_back(std::exp(v));
    INFO(na);
    check_close(read_strided(exp(a)), ex, 1e-15, 1e-14);
    for (auto& [nb, b] : views) {
      INFO(nb);
      std::vector<double> vb = read_strided(b), sum_ab, sel;
      for (size_t i = 0; i < va.size(); ++i) sum_ab.push_back(va[i] + vb[i]);
      check_close(read_strided(add(a, b)), sum_ab, 0, 0);
      Tensor c = gt(a, b);
      for (size_t i = 0; i < va.size(); ++i) sel.push_back(va[i] > vb[i] ? va[i] : -vb[i]);
      check_close(read_strided(where(c, a, neg(b))), sel, 0, 0);
    }
  }
  // a sliding window of a row vector: w = [[0,1,2],[1,2,3],[2,3,4]]
  Tensor r = arange(0, 5, 1, DType::f64);
  check_close(add(as_strided(r, {3, 3}, {1, 1}, 0), 0.5), {0.5, 1.5, 2.5, 1.5, 2.5, 3.5, 2.5, 3.5, 4.5});
}

// ---- comparisons and selection ---------------------------------------------------------------
TEST_CASE("comparisons: known values, b8, broadcasting") {
  Tensor a = tensor({1.f, 2.f, 3.f}), b = tensor({3.f, 2.f, 1.f});
  auto bits = [](const Tensor& t) {
    CHECK(t.dtype() == DType::b8);
    return t.to_vector<int>();
  };
  CHECK(bits(eq(a, b)) == std::vector<int>{0, 1, 0});
  CHECK(bits(ne(a, b)) == std::vector<int>{1, 0, 1});
  CHECK(bits(lt(a, b)) == std::vector<int>{1, 0, 0});
  CHECK(bits(le(a, b)) == std::vector<int>{1, 1, 0});
  CHECK(bits(gt(a, b)) == std::vector<int>{0, 0, 1});
  CHECK(bits(ge(a, b)) == std::vector<int>{0, 1, 1});
  CHECK(bits(eq(a, 2.0)) == std::vector<int>{0, 1, 0});
  CHECK(bits(lt(a, 2.0)) == std::vector<int>{1, 0, 0});
  CHECK(bits(gt(a, 2.0)) == std::vector<int>{0, 0, 1});
  // [3,1] vs [1,2] -> [3,2]; i64 works too
  Tensor c = lt(tensor<int64_t>({1, 2, 3}, {3, 1}), tensor<int64_t>({2, 3}, {1, 2}));
  CHECK(c.shape() == Shape{3, 2});
  CHECK(bits(c) == std::vector<int>{1, 1, 0, 1, 0, 0});
  // NaN compares unequal to everything, itself included
  CHECK(bits(eq(tensor({NAN}), tensor({NAN}))) == std::vector<int>{0});
  CHECK(bits(ne(tensor({NAN}), tensor({NAN}))) == std::vector<int>{1});
  // on non-contiguous inputs
  Tensor m = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2});
  CHECK(bits(gt(m.transpose(0, 1), m)) == std::vector<int>{0, 1, 0, 0});  // [[1,3],[2,4]] > [[1,2],[3,4]]
  // not differentiable: no graph
  Tensor x = leaf64({3});
  CHECK_FALSE(gt(x, 0.0).requires_grad());
}

TEST_CASE("where: known values") {
  // y = c ? a : b;  da = [c], db = [!c];  c [3,1], a [1,2], b 0-dim -> y [3,2]
  Tensor c = tensor<bool>({true, false, true}, {3, 1});
  Tensor a = tensor<double>({1, 2}, {1, 2}).set_requires_grad(true);
  Tensor b = scalar_tensor(-1, DType::f64).set_requires_grad(true);
  Tensor y = where(c, a, b);
  CHECK(y.shape() == Shape{3, 2});
  check_close(y, {1, 2, -1, -1, 1, 2});
  sum(y).backward();
  check_close(a.grad(), {2, 2});  // chosen in rows 0 and 2
  check_close(b.grad(), {2});     // chosen twice (row 1)
  CHECK(where(tensor<bool>({true, false}), tensor<int64_t>({1, 2}), tensor<int64_t>({3, 4})).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 4});
}
TEST_CASE("where: gradcheck") {
  Tensor c = tensor<bool>({true, false, false, true}, {4, 1});
  expect_gradcheck([&](auto& x) { return where(c, x[0], x[1]); }, {leaf64({1, 3}, 1), leaf64({4, 3}, 2)});
  expect_gradcheck([&](auto& x) { return where(c.transpose(0, 1), x[0].transpose(0, 1), x[0]); },
                   {leaf64({4, 4}, 3)});  // non-contiguous, and x twice
}

TEST_CASE("masked_fill: known values") {
  // y = m ? v : x;  dx = [!m]
  Tensor x = tensor<double>({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  Tensor m = tensor<bool>({false, true});  // broadcast over rows: column 1 is filled
  Tensor y = masked_fill(x, m, -9);
  check_close(y, {1, -9, 3, -9});
  sum(y).backward();
  check_close(x.grad(), {1, 0, 1, 0});
  check_close(masked_fill(tensor({1.f, 2.f}), tensor<bool>({true, false}), -INFINITY), {-INFINITY, 2});
}
TEST_CASE("masked_fill: gradcheck") {
  Tensor m = tensor<bool>({true, false, true});
  expect_gradcheck([&](auto& x) { return masked_fill(x[0], m, 0.5); }, {leaf64({2, 3}, 1)});
  expect_gradcheck([&](auto& x) { return masked_fill(x[0].transpose(0, 1), m, 0.5); }, {leaf64({3, 3}, 2)});
}

// ---- in-place ------------------------------------------------------------------------------
TEST_CASE("add_: known values") {
  Tensor d = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2});
  d.add_(tensor({10.f, 20.f}), 0.5);  // broadcast over rows: d += 0.5 [10, 20]
  check_close(d, {6, 12, 8, 14});
  d.mul_(2);
  check_close(d, {12, 24, 16, 28});
  Tensor i = tensor<int64_t>({1, 2});
  i.add_(tensor<int64_t>({5, 5}));
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{6, 7});
  AG_CHECK_ERROR(d.transpose(0, 1).add_(d), "add_", "must be contiguous");
  AG_CHECK_ERROR(d.add_(tensor({1.f, 2.f, 3.f})), "add_", "[3]", "[2,2]");
  AG_CHECK_ERROR(d.add_(zeros({2, 2, 2})), "add_", "[2,2,2]", "does not broadcast to destination shape [2,2]");
  AG_CHECK_ERROR(d.add_(tensor<double>({1, 2})), "add_", "f32 and f64");
}

// ---- errors --------------------------------------------------------------------------------
TEST_CASE("elementwise: errors") {
  Tensor f = zeros({2, 3}), d = zeros({2, 3}, DType::f64);
  AG_CHECK_ERROR(add(f, d), "add", "different dtypes", "f32 and f64");
  AG_CHECK_ERROR(mul(d, f), "mul", "f64 and f32");
  AG_CHECK_ERROR(maximum(f, d), "maximum", "different dtypes");
  AG_CHECK_ERROR(eq(f, d), "eq", "different dtypes");
  AG_CHECK_ERROR(add(f, zeros({4, 3})), "add", "[2,3]", "[4,3]", "cannot be broadcast");
  AG_CHECK_ERROR(pow(f, zeros({3, 2})), "pow", "[2,3]", "[3,2]");
  AG_CHECK_ERROR(lt(f, zeros({2})), "lt", "[2,3]", "[2]");
  AG_CHECK_ERROR(where(zeros({2}, DType::b8), zeros({2}), zeros({3})), "where", "[2]", "[3]");
  AG_CHECK_ERROR(div(tensor<int64_t>({1}), tensor<int64_t>({2})), "div", "floating", "i64");
  AG_CHECK_ERROR(exp(tensor<int64_t>({1})), "exp", "floating", "i64");
  AG_CHECK_ERROR(add(zeros({2}, DType::b8), zeros({2}, DType::b8)), "add", "numeric", "b8");
  AG_CHECK_ERROR(neg(zeros({2}, DType::b8)), "neg", "b8");
  AG_CHECK_ERROR(where(zeros({2}), zeros({2}), zeros({2})), "where", "condition must be b8", "f32");
  AG_CHECK_ERROR(masked_fill(zeros({2}), zeros({2}), 1), "masked_fill", "mask must be b8", "f32");
  AG_CHECK_ERROR(masked_fill(zeros({3}), zeros({2, 3}, DType::b8), 1), "masked_fill", "[2,3]", "[3]");
  AG_CHECK_ERROR(gelu(f, "erf"), "gelu", "\"erf\"");
  AG_CHECK_ERROR(clamp(f, 2, 1), "clamp", "lo=2 hi=1");
  AG_CHECK_ERROR(add(Tensor(), f), "undefined tensor");

  // device mismatch: a CPU buffer relabelled as cuda:0 is enough to reach the check, which runs
  // before any kernel (restored before the storage is freed).
  Tensor g = zeros({2, 3});
  g.impl().storage->device = Device::cuda(0);
  AG_CHECK_ERROR(add(f, g), "add", "different devices", "cpu and cuda:0");
  AG_CHECK_ERROR(where(zeros({2, 3}, DType::b8), g, g), "where", "condition on cpu", "cuda:0");
  g.impl().storage->device = Device::cpu();
}
