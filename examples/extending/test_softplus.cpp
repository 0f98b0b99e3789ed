// softplus: known values (computed in f64 by hand: y = log1p(e^(beta x)) / beta, dy/dx =
// sigmoid(beta x), PyTorch's definition), the threshold branch, stability far out, gradcheck,
// argument errors, one node on the tape, and cpu == cuda where there is a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attograd.h"
#include "autograd/testing.h"
#include "softplus.h"

using namespace ag;
using ext::softplus;

namespace {

// Every |got_i - want_i| <= atol + rtol |want_i|, naming the first element that is not.
void check_close(const Tensor& got, const std::vector<double>& want, double atol, double rtol) {
  const std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want[i]);
    CHECK(std::abs(g[i] - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

// The message of the ag::Error that `f` raises, or "" when it raises none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// y and dy/dx (the gradient of sum(y)) of softplus at `xs`, in `dtype`.
std::pair<Tensor, Tensor> value_and_grad(const std::vector<double>& xs, double beta, double threshold,
                                         DType dtype = DType::f64) {
  Tensor x = from_vector(xs).to(dtype).detach().set_requires_grad(true);
  Tensor y = softplus(x, beta, threshold);
  sum(y).backward();
  return {y, x.grad()};
}

}  // namespace

TEST_CASE("softplus: known values and gradient, beta 1") {
  // y = log(1 + e^x), dy/dx = sigmoid(x); at 0: log 2 and 1/2. 25 > threshold 20: y = x, dy/dx = 1.
  auto [y, dx] = value_and_grad({-3, -1, 0, 0.5, 2, 25}, 1.0, 20.0);
  check_close(y, {0.048587351573742062, 0.31326168751822286, 0.69314718055994529, 0.97407698418010669,
                  2.1269280110429727, 25},
              1e-15, 1e-14);
  check_close(dx, {0.047425873177566781, 0.2689414213699951, 0.5, 0.62245933120185459, 0.88079707797788231, 1},
              1e-15, 1e-14);
}

TEST_CASE("softplus: known values and gradient, beta 2, and f32") {
  // z = 2x: y = log(1 + e^z) / 2, dy/dx = sigmoid(z) (beta cancels). 10.5: z = 21 > 20, so y = x.
  const std::vector<double> xs = {-1, 0, 1, 9, 10.5};
  const std::vector<double> y_want = {0.063464005521486247, 0.34657359027997264, 1.0634640055214863,
                                      9.0000000076149895, 10.5};
  const std::vector<double> dx_want = {0.11920292202211755, 0.5, 0.88079707797788231, 0.9999999847700205, 1};
  auto [y, dx] = value_and_grad(xs, 2.0, 20.0);
  check_close(y, y_want, 1e-15, 1e-14);
  check_close(dx, dx_want, 1e-15, 1e-14);
  auto [y32, dx32] = value_and_grad(xs, 2.0, 20.0, DType::f32);
  CHECK(y32.dtype() == DType::f32);
  check_close(y32, y_want, 1e-7, 1e-6);
  check_close(dx32, dx_want, 1e-7, 1e-6);
}

TEST_CASE("softplus: past the threshold y = x and dy/dx = 1, exactly") {
  // threshold 1: beta x = 1.5 > 1 takes the linear branch (log1p(e^1.5) = 1.7014 would not);
  // beta x = 0.5 does not. beta x == threshold is not "past" it (PyTorch's strict >).
  auto [y, dx] = value_and_grad({0.5, 1.0, 1.5}, 1.0, 1.0);
  const std::vector<double> v = y.to_vector<double>(), d = dx.to_vector<double>();
  CHECK(v[0] == doctest::Approx(0.97407698418010669).epsilon(1e-14));
  CHECK(v[1] == doctest::Approx(std::log1p(std::exp(1.0))).epsilon(1e-14));
  CHECK(v[2] == 1.5);
  CHECK(d[0] == doctest::Approx(0.62245933120185459).epsilon(1e-14));
  CHECK(d[2] == 1.0);
  // beta scales the test: beta 4, threshold 20 switches at x = 5
  auto [y4, dx4] = value_and_grad({4.9, 5.1}, 4.0, 20.0);
  CHECK(y4.to_vector<double>()[0] == doctest::Approx(std::log1p(std::exp(19.6)) / 4).epsilon(1e-14));
  CHECK(y4.to_vector<double>()[1] == 5.1);
  CHECK(dx4.to_vector<double>()[1] == 1.0);
}

TEST_CASE("softplus: the stable form does not overflow where log(1 + exp(x)) does") {
  // With the threshold out of the way, e^800 overflows f64 (and e^100 f32): the naive formula
  // gives inf, the stable one max(z, 0) + log1p(e^-|z|) = 800 + 1e-348 = 800.
  // Far left, log1p keeps e^-100 = 3.72e-44 where log(1 + 3.72e-44) would round to 0.
  auto [y, dx] = value_and_grad({800, -100, -800}, 1.0, 1e9);
  const std::vector<double> v = y.to_vector<double>(), d = dx.to_vector<double>();
  CHECK(v[0] == 800.0);
  CHECK(v[1] == doctest::Approx(3.7200759760208361e-44).epsilon(1e-12));
  CHECK(v[2] == 0.0);
  CHECK(d[0] == 1.0);
  CHECK(d[1] == doctest::Approx(3.7200759760208361e-44).epsilon(1e-12));  // sigmoid(-100) = e^-100 (1 - ...)
  CHECK(d[2] == 0.0);  // e^800 overflows to inf, 1 / (1 + inf) = 0: the right limit, not NaN
  Tensor naive = log(add(exp(from_vector<double>({800.0})), 1.0));
  CHECK(std::isinf(naive.item<double>()));

  Tensor x32 = from_vector<float>({100.0f, -100.0f});
  const std::vector<double> v32 = softplus(x32, 1.0, 1e9).to_vector<double>();
  CHECK(v32[0] == 100.0);
  CHECK(v32[1] >= 0.0);  // e^-100 = 3.7e-44 is an f32 subnormal (or 0 where those are flushed)
  CHECK(v32[1] < 1e-43);
}

// snippet-begin: gradcheck
TEST_CASE("softplus: gradcheck against finite differences") {
  Generator gen(11);
  // Points away from the threshold, where y jumps (beta x = 20 is far from randn's range; in the
  // second case beta x = 3 lies between two inputs).
  Tensor x = randn({3, 4}, DType::f64, &gen).set_requires_grad(true);
  auto fn = [](const std::vector<Tensor>& in) { return softplus(in[0]); };
  testing::GradcheckResult r = testing::gradcheck(fn, {x});
  INFO(r.message);
  CHECK(r);
  CHECK(r.checked == 12);

  // beta 2.5, threshold 3: both branches, inputs at x = +-0.6 k + 0.05 (beta x = 3 at x = 1.2 is avoided)
  std::vector<double> xs;
  for (int k = -4; k <= 4; ++k) xs.push_back(0.6 * k + 0.05);
  Tensor x2 = from_vector(xs).set_requires_grad(true);
  auto fn2 = [](const std::vector<Tensor>& in) { return softplus(in[0], 2.5, 3.0); };
  testing::GradcheckResult r2 = testing::gradcheck(fn2, {x2});
  INFO(r2.message);
  CHECK(r2);
}
// snippet-end: gradcheck

TEST_CASE("softplus: a strided input, and an input used twice, get their gradients through the tape") {
  // x.mT() is not contiguous: the front copies it (a recorded op), the gradient comes back transposed.
  Tensor x = from_vector<double>({-1, 0, 1, 2, 3, 4}, {2, 3}).set_requires_grad(true);
  auto fn = [](const std::vector<Tensor>& in) { return add(softplus(in[0].mT()), softplus(in[0].mT(), 3.0)); };
  testing::GradcheckResult r = testing::gradcheck(fn, {x});
  INFO(r.message);
  CHECK(r);
  // one softplus node per call, recorded under its name
  Tensor y = softplus(x);
  CHECK(graph_to_string(y).find("softplus") != std::string::npos);
}

TEST_CASE("softplus: bad arguments raise errors that name the op and the value") {
  Tensor xi = from_vector<int64_t>({1, 2, 3});
  CHECK(error_of([&] { softplus(xi); }) ==
        "[softplus] expected a floating tensor (f32 or f64), got i64 of shape [3]");
  Tensor x = from_vector<double>({1, 2, 3});
  CHECK(error_of([&] { softplus(x, 0.0); }) == "[softplus] expected a finite beta > 0, got beta = 0");
  CHECK(error_of([&] { softplus(x, -1.5); }) == "[softplus] expected a finite beta > 0, got beta = -1.5");
  CHECK(error_of([&] { softplus(x, 1.0, std::nan("")); }) ==
        "[softplus] expected a threshold that is a number, got nan");
  CHECK(error_of([&] { softplus(Tensor()); }) == "[softplus] expected a tensor, got an undefined one");
}

// snippet-begin: compare
TEST_CASE("softplus: cpu == cuda") {
  Generator gen(5);
  Tensor x = mul(randn({4, 33}, DType::f32, &gen), 8.0).detach().set_requires_grad(true);  // both branches
  auto fn = [](const std::vector<Tensor>& in) { return softplus(in[0], 1.5, 10.0); };
  testing::CompareResult r = testing::compare_devices(fn, {x});
  if (r.skipped) {
    MESSAGE("[skipped: no CUDA device] " << r.message);
    return;
  }
  INFO(r.message);
  CHECK(r.passed);
}
// snippet-end: compare
