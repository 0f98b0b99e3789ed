// The 16-bit storage dtypes bf16 and f16 (core/half.h, core/dtype.h): conversion both ways with the
// rounding of pw::round_bf16 / pw::round_fp16 (tested against their definitions and a hardware half
// in tests/ops/test_autocast.cpp), copies and views, printing, refusal by the ops that compute,
// and loading 16-bit weights into an f32 model.
#include <cmath>
#include <limits>

#include "nn/linear.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// f32 values that exercise the rounding: ties both ways, carries, the ends of both ranges,
// subnormals of both formats, signed zeros, inf and NaN, and random normals of every scale.
std::vector<float> probe_values() {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          1.f + 0x1p-8f,       // bf16 tie, kept part even: down
                          1.f + 3 * 0x1p-8f,   // bf16 tie, kept part odd: up
                          1.f + 0x1p-11f,      // f16 tie: down
                          1.f + 3 * 0x1p-11f,  // f16 tie: up
                          1.99999f,            // carry into the exponent
                          -0.1f,
                          65504.f,
                          65519.f,  // f16: rounds down to 65504
                          65520.f,  // f16: inf
                          3.0e38f,
                          std::numeric_limits<float>::max(),  // bf16: inf (past its largest finite)
                          0x1p-24f,                           // the smallest f16 subnormal
                          0x1p-25f,                           // f16 tie at zero: 0
                          1e-40f,                             // an f32 and bf16 subnormal
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  Generator gen(11);
  const std::vector<float> r = randn({400}, DType::f32, &gen).to_vector<float>();
  for (size_t i = 0; i < r.size(); ++i) v.push_back(r[i] * std::ldexp(1.f, int(i % 40) - 20));
  return v;
}

bool same_bits(float a, float b) { return std::isnan(a) ? std::isnan(b) : pw::float_bits(a) == pw::float_bits(b); }

}  // namespace

TEST_CASE("half: to(bf16) and to(f16) round f32 to nearest even, and back to f32 is exact") {
  const std::vector<float> v = probe_values();
  const Tensor x = from_vector<float>(v, {int64_t(v.size())});
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(name(t));
    const Tensor h = x.to(t);
    CHECK(h.dtype() == t);
    CHECK(h.nbytes() == 2 * v.size());
    CHECK(h.shape() == x.shape());
    const std::vector<float> back = h.to(DType::f32).to_vector<float>(), direct = h.to_vector<float>();
    int bad = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = t == DType::bf16 ? pw::round_bf16(v[i]) : pw::round_fp16(v[i]);
      bad += !same_bits(back[i], want) || !same_bits(direct[i], want);
    }
    CHECK(bad == 0);
    // the stored bits, by hand: 1 + 3 2^-8 -> bf16 0x3f82 (1 + 2^-6); 1.99999 -> 2: 0x4000 / 0x4000 in
    // f16 too; 65520 -> f16 inf 0x7c00; the smallest f16 subnormal 0x0001
    const uint16_t* b = static_cast<const uint16_t*>(h.raw_data());
    if (t == DType::bf16) {
      CHECK(b[4] == 0x3f82);
      CHECK(b[7] == 0x4000);
      CHECK(b[13] == 0x7f80);  // FLT_MAX rounds past bf16's largest finite value: inf
      CHECK(b[1] == 0x8000);   // -0 stays -0
    } else {
      CHECK(b[7] == 0x4000);
      CHECK(b[10] == 0x7bff);  // 65519 -> 65504
      CHECK(b[11] == 0x7c00);  // 65520 -> inf
      CHECK(b[14] == 0x0001);
      CHECK(b[15] == 0x0000);  // 2^-25, a tie between 0 and 2^-24: to even, 0
    }
  }
}

TEST_CASE("half: conversions between every pair of dtypes go through the f32 value") {
  // f64 -> bf16 rounds to f32 first (as torch does), i64 and b8 by value; bf16 <-> f16 through f32
  const Tensor d = from_vector<double>({1.0 / 3.0, -2.5, 1e5, 70000.0}, {4});
  CHECK(d.to(DType::bf16).to(DType::f64).to_vector<double>() ==
        std::vector<double>{pw::round_bf16(float(1.0 / 3.0)), -2.5, pw::round_bf16(1e5f), pw::round_bf16(70000.f)});
  const std::vector<double> via_f16 = d.to(DType::f16).to(DType::f64).to_vector<double>();
  CHECK(via_f16[0] == double(pw::round_fp16(float(1.0 / 3.0))));
  CHECK(std::isinf(via_f16[2]));  // 1e5 is past half's range
  const Tensor i = from_vector<int64_t>({-3, 0, 257, 2049, 1 << 20}, {5});
  // bf16 keeps 8 significant bits: 257 is a tie between 256 and 258 (even: 256), 2049 -> 2048
  CHECK(i.to(DType::bf16).to_vector<int64_t>() == std::vector<int64_t>{-3, 0, 256, 2048, 1 << 20});
  // f16 keeps 11: 257 exact, 2049 a tie between 2048 and 2050 (even: 2048), 2^20 past its range
  const std::vector<float> h = i.to(DType::f16).to_vector<float>();
  CHECK(std::vector<float>(h.begin(), h.end() - 1) == std::vector<float>{-3.f, 0.f, 257.f, 2048.f});
  CHECK(h.back() == std::numeric_limits<float>::infinity());
  CHECK(gt(from_vector<float>({1.f, -1.f}, {2}), 0.0).to(DType::bf16).to_vector<float>() == std::vector<float>{1.f, 0.f});
  CHECK(from_vector<float>({0.5f, 0.f, -2.f}, {3}).to(DType::f16).to(DType::b8).to_vector<int>() ==
        std::vector<int>{1, 0, 1});
  // bf16 -> f16 and back: through the f32 value; 1 + 2^-7 is exact in both, 70000 only in bf16's range
  const Tensor b = from_vector<float>({1.f + 0x1p-7f, 70000.f, -0x1p-20f}, {3}).to(DType::bf16);
  const std::vector<float> bh = b.to(DType::f16).to_vector<float>();
  CHECK(bh[0] == 1.f + 0x1p-7f);
  CHECK(std::isinf(bh[1]));
  CHECK(bh[2] == -0x1p-20f);  // an f16 subnormal, exact
  CHECK(b.to(DType::f16).to(DType::bf16).to_vector<float>()[0] == 1.f + 0x1p-7f);
}

TEST_CASE("half: creation, copies, views, concatenation, item and printing") {
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(name(t));
    CHECK(zeros({2, 3}, t).to_vector<float>() == std::vector<float>(6, 0.f));
    CHECK(full({2}, 0.1, t).to_vector<float>() ==
          std::vector<float>(2, t == DType::bf16 ? pw::round_bf16(0.1f) : pw::round_fp16(0.1f)));
    CHECK(scalar_tensor(-1.5, t).item<double>() == -1.5);
    CHECK(scalar_tensor(-1.5, t).item<int64_t>() == -1);
    const Tensor x = arange(0, 12, 1, DType::f32).reshape({3, 4}).to(t);  // small integers: exact
    // a transposed view copied: strided_copy of 16-bit elements
    const Tensor xt = x.transpose(0, 1).contiguous();
    CHECK(xt.dtype() == t);
    CHECK(xt.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
    CHECK(x.narrow(1, 1, 2).clone().to_vector<float>() == std::vector<float>{1, 2, 5, 6, 9, 10});
    CHECK(x.reshape({12}).to_vector<float>()[11] == 11.f);
    const Tensor c = cat({x, x.narrow(0, 0, 1)}, 0);
    CHECK(c.dtype() == t);
    CHECK(c.shape() == Shape{4, 4});
    CHECK(c.to_vector<float>()[13] == 1.f);
    Tensor y = zeros({3, 4}, t);
    y.copy_(arange(0, 12, 1, DType::f64).reshape({3, 4}));  // converts to y's dtype
    CHECK(y.to_vector<float>() == x.to_vector<float>());
    y.fill_(2.0);
    CHECK(y.to_vector<float>() == std::vector<float>(12, 2.f));
    const std::string s = fmt::format("{}", full({2}, 0.1, t));
    CHECK(s.find(fmt::format("dtype={}", name(t))) != std::string::npos);
    CHECK(s.find(t == DType::bf16 ? "0.1001" : "0.1000") != std::string::npos);  // bf16: 0.10009765625
    CHECK(itemsize(t) == 2);
  }
}

TEST_CASE("half: the ops that compute refuse 16-bit tensors by name, and to() refuses to drop a gradient") {
  const Tensor h = ones({2, 2}, DType::bf16);
  AG_CHECK_ERROR(add(h, h), "add", "bf16", ".to(DType::f32)");
  AG_CHECK_ERROR(exp(ones({2}, DType::f16)), "exp", "f16");
  AG_CHECK_ERROR(sum(h), "sum", "bf16");
  AG_CHECK_ERROR(where(gt(ones({2, 2}), 0.0), h, h), "where", "bf16");
  AG_CHECK_ERROR(eq(h, h), "eq", "bf16");
  AG_CHECK_ERROR(arange(0, 3, 1, DType::bf16), "arange", "bf16");
  AG_CHECK_ERROR(Tensor(ones({2}, DType::bf16)).set_requires_grad(true), "requires_grad", "bf16");
  Tensor w = ones({2}).set_requires_grad(true);
  AG_CHECK_ERROR(w.to(DType::bf16), "to", "bf16", "detach");
  CHECK(w.detach().to(DType::bf16).dtype() == DType::bf16);
  {
    NoGradGuard no_grad;
    CHECK(w.to(DType::f16).dtype() == DType::f16);
  }
}

TEST_CASE("half: a model saved in bf16 loads into f32 parameters exactly, and nothing narrows silently") {
  Generator gen(5);
  nn::Linear a(6, 4, true, DType::f32, &gen), b(6, 4, true, DType::f32, &gen);
  nn::NamedTensors half;
  for (auto& [n, t] : a.state_dict()) half.emplace_back(n, t.to(DType::bf16));
  const nn::LoadResult r = b.load_state_dict(half);
  CHECK(r.ok());
  CHECK(b.weight.dtype() == DType::f32);
  const std::vector<float> wa = a.weight.to_vector<float>(), wb = b.weight.to_vector<float>();
  int bad = 0;
  for (size_t i = 0; i < wa.size(); ++i) bad += !same_bits(wb[i], pw::round_bf16(wa[i]));
  CHECK(bad == 0);
  // f64 weights into an f32 model would narrow: refused, naming the tensor and both dtypes
  nn::NamedTensors wide;
  for (auto& [n, t] : a.state_dict()) wide.emplace_back(n, t.to(DType::f64));
  AG_CHECK_ERROR(b.load_state_dict(wide), "load_state_dict", "weight", "f32", "f64");
  CHECK(nn::loads_into(DType::f16, DType::f64));
  CHECK_FALSE(nn::loads_into(DType::f32, DType::bf16));
}
