// Tests of core/cpu/vecmath.h: fast_exp, fast_normal_cdf and fast_normal_pdf against the libm
// functions evaluated in double, over their whole range and at the special values; the float
// functors of core/kernels/pointwise.h built on them (exp, sigmoid, silu, gelu and their
// backwards); and softmax's exact zeros at -inf (masked attention relies on them).
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "core/cpu/vecmath.h"
#include "core/kernels/pointwise.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The spacing of floats around |v| (v in double): 2^(e - 23) for |v| in [2^e, 2^(e+1)), and the
// denormal spacing 2^-149 below 2^-126.
double float_ulp(double v) {
  v = std::abs(v);
  if (v < 0x1p-126) return 0x1p-149;
  int e;
  std::frexp(v, &e);  // v = f 2^e with f in [1/2, 1)
  return std::ldexp(1.0, e - 24);
}

// Every 2^-10 step of [lo, hi], then n_random uniform draws from it (fixed seed).
std::vector<float> sweep(float lo, float hi, int n_random, uint32_t seed) {
  std::vector<float> xs;
  for (double x = lo; x <= hi; x += 0x1p-10) xs.push_back(float(x));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int i = 0; i < n_random; ++i) xs.push_back(u(gen));
  return xs;
}

// The worst of err(x) over xs, and where.
template <class Err>
std::pair<double, float> worst(const std::vector<float>& xs, Err err) {
  std::pair<double, float> w{0.0, 0.0f};
  for (float x : xs)
    if (double e = err(x); !(e <= w.first)) w = {e, x};  // a NaN error counts as the worst
  return w;
}

// Phi(x) and phi(x) in double, the references.
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

}  // namespace

TEST_CASE("vecmath: fast_exp is within 1 ulp of exp over [-104, 89], denormal results included") {
  // Measured over every float of the range: 0.91 ulp with a fused multiply-add, 1.18 without
  // (here, on the sweep: 0.88).
#if defined(FP_FAST_FMAF)
  const double max_ulp = 1.0;
#else
  const double max_ulp = 1.25;
#endif
  // below: up to the largest x whose e^x is finite; the denormal results start at x = -87.34
  std::vector<float> xs = sweep(-104.0f, 88.7228317f, 1000000, 1);
  for (float x = -103.98f; x < -103.9f; x = std::nextafter(x, 0.0f)) xs.push_back(x);  // 2^-150 boundary
  auto [err, at] = worst(xs, [](float x) {
    const double ref = std::exp(double(x));
    return std::abs(double(fast_exp(x)) - ref) / float_ulp(ref);
  });
  INFO("max error " << err << " ulp at x = " << at);
  CHECK(err <= max_ulp);
}

TEST_CASE("vecmath: fast_exp special values and range ends") {
  // exactly 1 at 0; exactly 0 at -inf (softmax's masked entries); +inf at +inf; NaN propagates
  CHECK(fast_exp(0.0f) == 1.0f);
  CHECK(fast_exp(-0.0f) == 1.0f);
  CHECK(fast_exp(-kInf) == 0.0f);
  CHECK_FALSE(std::signbit(fast_exp(-kInf)));
  CHECK(fast_exp(kInf) == kInf);
  CHECK(std::isnan(fast_exp(kNaN)));
  CHECK(std::isnan(fast_exp(-kNaN)));
  // overflow: 88.7228317 is the largest float with e^x < FLT_MAX; the next one overflows, like
  // every larger x
  const float x_max = 88.7228317f;
  CHECK(std::isfinite(fast_exp(x_max)));
  CHECK(fast_exp(x_max) == float(std::exp(double(x_max))));
  for (float x : {std::nextafter(x_max, kInf), 88.8f, 89.0f, 100.0f, 1e30f, std::numeric_limits<float>::max()})
    CHECK(fast_exp(x) == kInf);
  // underflow: the least normal 2^-126 at x = -87.3365, the least denormal 2^-149 near
  // x = -103.28, and 0 below -103.97 (e^x under half the least denormal), down to -FLT_MAX
  CHECK(fast_exp(-87.3365479f) == float(std::exp(-87.3365479)));
  CHECK(fast_exp(-103.278931f) == 0x1p-149f);
  for (float x : {-103.98f, -104.0f, -110.0f, -200.0f, -1.2e7f, -1e30f, -std::numeric_limits<float>::max()})
    CHECK(fast_exp(x) == 0.0f);
  // the scale 2^n at whole multiples of ln 2: e^(k ln2) = 2^k to the ulp
  for (int k = -149; k <= 127; k += 7) {
    const float x = float(k * M_LN2);
    CHECK(std::abs(double(fast_exp(x)) - std::exp(double(x))) <= float_ulp(std::exp(double(x))));
  }
}

TEST_CASE("vecmath: fast_normal_cdf (Phi) within 1.2e-7 of erfc in double over [-10, 10]") {
  // Measured over all floats of [-16, 16] in steps of 2^-16: 1.05e-7 (2 ulp of 1/2, near x = 0.1).
  std::vector<float> xs = sweep(-10.0f, 10.0f, 100000, 2);
  auto [err, at] = worst(xs, [](float x) { return std::abs(double(fast_normal_cdf(x)) - normal_cdf(x)); });
  INFO("max abs error " << err << " at x = " << at);
  CHECK(err <= 1.2e-7);
  // in the left tail, where Phi is small, it stays relatively accurate to 5e-4 (PyTorch's float
  // 1 + erf(x / sqrt 2) has no correct digit there)
  std::vector<float> tail = sweep(-13.0f, -3.0f, 0, 3);
  auto [rel, rel_at] = worst(tail, [](float x) {
    return std::abs(double(fast_normal_cdf(x)) - normal_cdf(x)) / normal_cdf(x);
  });
  INFO("max relative error in the left tail " << rel << " at x = " << rel_at);
  CHECK(rel <= 5e-4);
  // special values: Phi(0) = 1/2 exactly, 0 and 1 at the infinities, 0 / 1 beyond |x| = 16
  CHECK(fast_normal_cdf(0.0f) == 0.5f);
  CHECK(fast_normal_cdf(-kInf) == 0.0f);
  CHECK(fast_normal_cdf(kInf) == 1.0f);
  CHECK(fast_normal_cdf(-20.0f) == 0.0f);
  CHECK(fast_normal_cdf(-1e30f) == 0.0f);
  CHECK(fast_normal_cdf(1e30f) == 1.0f);
  CHECK(std::isnan(fast_normal_cdf(kNaN)));
}

TEST_CASE("vecmath: fast_normal_pdf within 2e-7 + x^2 3e-8 relative of the density") {
  std::vector<float> xs = sweep(-13.0f, 13.0f, 100000, 4);
  auto [err, at] = worst(xs, [](float x) {
    const double ref = normal_pdf(x);
    return std::abs(double(fast_normal_pdf(x)) - ref) / ref / (2e-7 + double(x) * x * 3e-8);
  });
  INFO("worst error / bound " << err << " at x = " << at);
  CHECK(err <= 1.0);
  CHECK(fast_normal_pdf(0.0f) == doctest::Approx(0.3989422804014327).epsilon(1e-7));
  CHECK(fast_normal_pdf(kInf) == 0.0f);
  CHECK(fast_normal_pdf(-kInf) == 0.0f);
  CHECK(std::isnan(fast_normal_pdf(kNaN)));
}

TEST_CASE("vecmath: the float functors (exp, sigmoid, silu, gelu and backwards) match double") {
  // The float path of each functor uses vecmath.h; its double path is the std:: formula, the
  // reference here. Bounds: a few ulp of the result for the exp-based ones, and for gelu the
  // absolute error of Phi (1.2e-7) times |x| plus the final rounding.
  std::vector<float> xs = sweep(-12.0f, 12.0f, 50000, 5);
  auto rel_err = [](float got, double ref) { return std::abs(double(got) - ref) / std::max(std::abs(ref), 1e-30); };
  auto check_worst = [&](const std::string& name, double bound, auto err) {
    auto [e, at] = worst(xs, err);
    INFO(name << ": worst " << e << " at x = " << at << ", bound " << bound);
    CHECK(e <= bound);
  };
  check_worst("exp", 1.2e-7, [&](float x) { return rel_err(pw::Exp{}(x), pw::Exp{}(double(x))); });
  check_worst("sigmoid", 2.5e-7, [&](float x) { return rel_err(pw::Sigmoid{}(x), pw::Sigmoid{}(double(x))); });
  check_worst("silu", 2.5e-7, [&](float x) { return rel_err(pw::Silu{}(x), pw::Silu{}(double(x))); });
  check_worst("silu backward", 1e-6, [&](float x) {
    // s (1 + x (1 - s)) crosses 0 near x = -1.28: measure against the scale of its terms
    const double ref = pw::SiluBackward{}(double(x), 1.0);
    return std::abs(double(pw::SiluBackward{}(x, 1.0f)) - ref) / std::max(std::abs(ref), 0.1);
  });
  check_worst("gelu", 1.0, [&](float x) {
    const double ref = pw::Gelu{}(double(x));
    return std::abs(double(pw::Gelu{}(x)) - ref) / (1.2e-7 * std::abs(x) + float_ulp(ref));
  });
  check_worst("gelu backward", 2e-7, [&](float x) {
    return std::abs(double(pw::GeluBackward{}(x, 1.0f)) - pw::GeluBackward{}(double(x), 1.0));
  });
  // special values: gelu(-inf) = -inf * 0 = NaN in both paths (and PyTorch), gelu(inf) = inf
  CHECK(pw::Gelu{}(kInf) == kInf);
  CHECK(std::isnan(pw::Gelu{}(-kInf)));
  CHECK(std::isnan(pw::Gelu{}(double(-kInf))));
  CHECK(pw::Sigmoid{}(-kInf) == 0.0f);
  CHECK(pw::Sigmoid{}(kInf) == 1.0f);
  CHECK(pw::Exp{}(-kInf) == 0.0f);
}

TEST_CASE("softmax: -inf entries (a mask) give exact zeros, along the last and a middle dim") {
  // Rows of 1000 (the vectorised row kernel) with every 7th entry masked to -inf: y is exactly +0
  // there, log_softmax exactly -inf, and the other entries are the softmax of the finite ones.
  const int64_t R = 4, C = 1000;
  std::vector<float> v(size_t(R * C));
  std::mt19937 gen(6);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 7 == 3) ? -kInf : nd(gen);
  std::vector<double> ref(v.size());
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, double(v[r * C + c]));
    for (int64_t c = 0; c < C; ++c) s += std::exp(double(v[r * C + c]) - m);
    for (int64_t c = 0; c < C; ++c) ref[r * C + c] = std::exp(double(v[r * C + c]) - m) / s;
  }
  Tensor x = from_vector(v, {R, C});
  auto check_masked = [&](const std::vector<float>& y, const std::vector<float>& ly, auto index) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = size_t(r * C + c), j = size_t(index(r, c));
        if (std::isinf(v[i])) {
          REQUIRE(y[j] == 0.0f);
          REQUIRE_FALSE(std::signbit(y[j]));
          REQUIRE(ly[j] == -kInf);
        } else {
          REQUIRE(std::abs(y[j] - ref[i]) <= 1e-6 * ref[i] + 1e-12);
        }
      }
  };
  // along the last dim: y[r, c]
  check_masked(softmax(x, -1).to_vector<float>(), log_softmax(x, -1).to_vector<float>(),
               [&](int64_t r, int64_t c) { return r * C + c; });
  // along dim 0 of the transposed copy (C, R): the [outer, C, inner] kernel; y[c, r]
  Tensor xt = x.transpose(0, 1).contiguous();
  check_masked(softmax(xt, 0).to_vector<float>(), log_softmax(xt, 0).to_vector<float>(),
               [&](int64_t r, int64_t c) { return c * R + r; });
}
