// bf16 autocast (autograd/autocast.h): round_bf16's bits, and matmul, linear and attention under
// the guard against references computed in f64 from the rounded operands. Each reference is what
// the op promises: the products of bf16-rounded operands summed in f32 (in backward with the
// gradient rounded too for matmul and linear). Every case also checks that the result is NOT the
// f32 one, so a guard that did nothing would fail.
#include <cmath>
#include <cstring>
#include <limits>

#include "autograd/autocast.h"
#include "core/kernels.h"
#include "core/kernels/matmul.h"
#include "nn/sparse_patterns.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f32, &g);
}

// x rounded to bf16, as f64 (the references multiply in f64: exact products, a tiny sum error)
Tensor bf16_f64(const Tensor& x) { return round_bf16(x.detach()).to(DType::f64); }

// The largest |a - b| over the elements.
double max_diff(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a.detach().to(DType::f64), b.detach().to(DType::f64)))).item<double>();
}

}  // namespace

TEST_CASE("round_bf16: ties to even, range, NaN and inf, straight-through gradient") {
  const float inf = std::numeric_limits<float>::infinity();
  // bf16 keeps 7 mantissa bits: near 1 its spacing is 2^-7.
  //   1 + 2^-8       halfway between 1 and 1 + 2^-7: to the even one, 1
  //   1 + 3 2^-8     halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): 1 + 2^-6
  //   1 + 2^-8 + 2^-20  just above halfway: up, 1 + 2^-7
  //   pi = 0x40490fdb -> 0x4049 = 3.140625;  -2.5 and 2^-130 (a subnormal) are exact
  //   f32's largest 0x7f7fffff rounds past bf16's largest 0x7f7f0000: inf
  Tensor x = tensor({1.f, 1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 1.f + 0x1p-8f + 0x1p-20f, 3.14159265f, -2.5f, 0x1p-130f,
                     from_bits(0x7f7fffffu), from_bits(0x7f7f0000u), inf, -inf},
                    {11});
  std::vector<float> y = round_bf16(x).to_vector<float>();
  std::vector<float> want = {1.f,       1.f,   1.f + 0x1p-6f, 1.f + 0x1p-7f, 3.140625f, -2.5f,
                             0x1p-130f, inf,   from_bits(0x7f7f0000u), inf, -inf};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element ", i, ": ", x.to_vector<float>()[i]);
    CHECK(y[i] == want[i]);
  }
  CHECK(std::isnan(round_bf16(tensor({std::nanf("")})).item<float>()));
  // |round(x) - x| <= 2^-8 |x| on random values, and most of them change
  Tensor r = rnd({4096}, 3);
  Tensor rr = round_bf16(r);
  CHECK(max(div(abs(sub(rr, r)), abs(r))).item<double>() <= 0x1p-8);
  CHECK(sum(ne(rr, r).to(DType::f32)).item<double>() > 4000);
  // vjp: dx = g
  Tensor xl = rnd({5}, 4).set_requires_grad(true);
  Tensor g = tensor({1.f, -2.f, 3.f, 0.5f, 7.f});
  sum(mul(round_bf16(xl), g)).backward();
  check_close(xl.grad(), g, 0, 0);
  AG_CHECK_ERROR(round_bf16(ones({2}, DType::f64)), "round_bf16", "f32", "f64");
}

TEST_CASE("round_operand: each precision's rounding of a tensor, as the kernels' pw::round_operand, straight through") {
  // values that round differently in bf16 and fp16: ties of each format, beyond half's range,
  // below its normal range, and both signs
  const std::vector<float> v = {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 70000.f,
                                -0x1p-20f,     3.14159265f,       -2.71828183f,   0x1p-130f,         1e30f};
  const Tensor x = from_vector<float>(v, {2, 5});
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    CAPTURE(name(p));
    const std::vector<float> got = round_operand(x, p).to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      INFO("element ", i, ": ", v[i]);
      CHECK(pw::float_bits(got[i]) == pw::float_bits(pw::round_operand(v[i], p)));
    }
    CHECK(round_operand(x, p).shape() == x.shape());
    CHECK(std::isnan(round_operand(tensor({std::nanf("")}), p).item<float>()));
    // vjp: dx = g, whatever the rounding did to the value
    Tensor xl = x.detach().clone().set_requires_grad(true);
    const Tensor g = from_vector<float>({1, -2, 3, -4, 5, -6, 7, -8, 9, -10}, {2, 5});
    sum(mul(round_operand(xl, p), g)).backward();
    CHECK(max_diff(xl.grad(), g) == 0);
    AG_CHECK_ERROR(round_operand(ones({2}, DType::f64), p), "round_", "f32", "f64");
  }
  // the three precisions differ on these values: the rounding is not the identity but for fp32
  CHECK(round_operand(x, Precision::fp32).to_vector<float>() == v);
  CHECK(round_operand(x, Precision::bf16).to_vector<float>() != round_operand(x, Precision::fp16).to_vector<float>());
  CHECK(round_operand(x, Precision::bf16).to_vector<float>()[0] == 1.f);  // a bf16 tie to even
  CHECK(round_operand(x, Precision::fp16).to_vector<float>()[4] == std::numeric_limits<float>::infinity());
}

TEST_CASE("round_fp16: ties to even, overflow to inf, subnormals, NaN, the bits of a hardware half") {
  const float inf = std::numeric_limits<float>::infinity();
  // half keeps 10 mantissa bits: near 1 its spacing is 2^-10.
  //   1 + 2^-11 (halfway, 1 is even) -> 1;  1 + 3 2^-11 (halfway, 1 + 2^-10 is odd) -> 1 + 2^-9
  //   65504 is the largest half; 65519 rounds down to it, 65520 (halfway to 65536) up: inf
  //   2^-14 is the smallest normal; 2^-24 the smallest subnormal; 2^-25 is halfway to 0 (even): 0;
  //   3 2^-25 is halfway between 2^-24 (odd) and 2^-23: 2^-23;  pi -> 3.140625 (0x4248)
  Tensor x = tensor({1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 65504.f, 65519.f, 65520.f, -70000.f, 0x1p-14f, 0x1p-24f,
                     0x1p-25f, 3 * 0x1p-25f, 3.14159265f, inf, -inf},
                    {13});
  std::vector<float> y = round_fp16(x).to_vector<float>();
  std::vector<float> want = {1.f,       1.f + 0x1p-9f, 65504.f, 65504.f,    inf, -inf, 0x1p-14f, 0x1p-24f,
                             0.f,       0x1p-23f,      3.140625f, inf,      -inf};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element ", i, ": ", x.to_vector<float>()[i]);
    CHECK(y[i] == want[i]);
  }
  CHECK(std::isnan(round_fp16(tensor({std::nanf("")})).item<float>()));
#if defined(__FLT16_MAX__)
  // against the compiler's IEEE half (_Float16: F16C or exact software conversion), over values of
  // every magnitude from 2^-30 to 2^17 (subnormal halves, normal ones, overflow), both signs
  std::vector<float> vals;
  for (uint32_t i = 0; i < 200000; ++i) {
    const uint32_t h = i * 2654435761u;
    const uint32_t exp = 97 + (h >> 27) % 48;  // 2^-30 .. 2^17
    vals.push_back(from_bits((h & 0x80000000u) | (exp << 23) | (h * 40503u & 0x7fffffu)));
  }
  const std::vector<float> got = round_fp16(from_vector<float>(vals, {int64_t(vals.size())})).to_vector<float>();
  int64_t differ = 0;
  for (size_t i = 0; i < vals.size(); ++i) differ += got[i] != float(static_cast<_Float16>(vals[i]));
  CHECK(differ == 0);
#endif
  // |round(x) - x| <= 2^-11 |x| in half's normal range; vjp: dx = g
  Tensor r = rnd({4096}, 5);
  CHECK(max(div(abs(sub(round_fp16(r), r)), abs(r))).item<double>() <= 0x1p-11);
  Tensor xl = rnd({3}, 6).set_requires_grad(true);
  Tensor g = tensor({1.f, -2.f, 3.f});
  sum(mul(round_fp16(xl), g)).backward();
  check_close(xl.grad(), g, 0, 0);
  AG_CHECK_ERROR(round_fp16(ones({2}, DType::f64)), "round_fp16", "f32", "f64");
}

TEST_CASE("autocast: the guard sets and restores the thread's precision, and f64 is never cast") {
  CHECK(autocast_precision() == Precision::fp32);
  {
    AutocastGuard bf16(Precision::bf16);
    CHECK(autocast_operands(DType::f32) == Precision::bf16);
    CHECK(autocast_operands(DType::f64) == Precision::fp32);
    {
      AutocastGuard off(Precision::fp32);
      CHECK(autocast_operands(DType::f32) == Precision::fp32);
    }
    CHECK(autocast_precision() == Precision::bf16);
  }
  CHECK(autocast_precision() == Precision::fp32);
  CHECK(std::string(name(Precision::bf16)) == "bf16");
  CHECK(std::string(name(Precision::fp16)) == "fp16");
  // f64 matmul under the guard: the same bits as without
  Tensor a = rnd({6, 9}, 1).to(DType::f64), b = rnd({9, 5}, 2).to(DType::f64);
  Tensor plain = matmul(a, b);
  AutocastGuard bf16(Precision::bf16);
  CHECK(max_diff(matmul(a, b), plain) == 0);
}

TEST_CASE("autocast: --precision names parse back to their precision, and each stores as its 16-bit dtype") {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) CHECK(parse_precision(name(p)) == p);
  CHECK(parse_precision("bf16") == Precision::bf16);
  CHECK(parse_precision("fp16") == Precision::fp16);
  CHECK(parse_precision("fp32") == Precision::fp32);
  for (const char* bad : {"", "BF16", "f16", "bfloat16", "fp32 ", "fp8"}) CHECK_FALSE(parse_precision(bad).has_value());
  CHECK(stored_dtype(Precision::bf16) == DType::bf16);
  CHECK(stored_dtype(Precision::fp16) == DType::f16);
  CHECK(stored_dtype(Precision::fp32) == DType::f32);
  CHECK(stored_dtype(Precision::fp32, DType::f64) == DType::f64);  // nothing rounded: kept as it came
  CHECK(stored_dtype(Precision::bf16, DType::f64) == DType::bf16);
}

TEST_CASE("autocast: matmul reads bf16 operands, sums in f32, and its backward rounds the gradient") {
  struct Case {
    Shape a, b;
    bool transpose_b;  // b given as a transposed view (a cuBLAS/BLAS flag, not a copy)
  };
  // a 2-D product, a batch folded into one GEMM (b shared), a broadcast batch, a transposed view
  for (const Case& c : {Case{{7, 33}, {33, 5}, false}, Case{{2, 3, 7, 33}, {33, 5}, false},
                        Case{{2, 1, 7, 33}, {3, 33, 5}, false}, Case{{4, 7, 33}, {4, 5, 33}, true}}) {
    INFO("a ", c.a, " b ", c.b, c.transpose_b ? " (b transposed)" : "");
    Tensor a = rnd(c.a, 11).set_requires_grad(true);
    Tensor bt = rnd(c.b, 12).set_requires_grad(true);
    Tensor b = c.transpose_b ? bt.transpose(-1, -2) : bt;
    Tensor y;
    {
      AutocastGuard bf16(Precision::bf16);
      y = matmul(a, b);
    }
    CHECK(y.dtype() == DType::f32);
    Tensor ref = matmul(bf16_f64(a), bf16_f64(b));
    CHECK(max_diff(y, ref) < 1e-5);
    CHECK(max_diff(y, matmul(a.detach(), b.detach())) > 1e-3);  // not the f32 product
    // backward, outside the guard: the op kept the precision it ran forward with
    Tensor g = rnd(y.shape(), 13);
    sum(mul(y, g)).backward();
    // dA = round(g) round(B)^T, dB = round(A)^T round(g), each summed to its input's shape
    Tensor gr = bf16_f64(g);
    Tensor da = sum_to(matmul(gr, bf16_f64(b).transpose(-1, -2)), a.shape());
    Tensor db = sum_to(matmul(bf16_f64(a).transpose(-1, -2), gr), b.shape());
    CHECK(max_diff(a.grad(), da) < 1e-5);
    Tensor dbt = c.transpose_b ? db.transpose(-1, -2) : db;
    CHECK(max_diff(bt.grad(), dbt) < 1e-5);
    CHECK(max_diff(a.grad(), sum_to(matmul(g, b.detach().transpose(-1, -2)), a.shape())) > 1e-3);  // not f32's
  }
}

TEST_CASE("autocast: linear rounds x, W and the gradient, keeps the bias f32") {
  Tensor x = rnd({3, 4, 40}, 21).set_requires_grad(true);
  Tensor w = rnd({24, 40}, 22).set_requires_grad(true);
  Tensor b = mul(rnd({24}, 23), 1.0 + 0x1p-12).detach().set_requires_grad(true);  // not bf16 values
  Tensor y;
  {
    AutocastGuard bf16(Precision::bf16);
    y = linear(x, w, b);
  }
  Tensor ref = add(matmul(bf16_f64(x), bf16_f64(w).transpose(0, 1)), b.detach().to(DType::f64));
  CHECK(max_diff(y, ref) < 1e-5);
  CHECK(max_diff(y, linear(x.detach(), w.detach(), b.detach())) > 1e-3);
  Tensor g = rnd(y.shape(), 24);
  sum(mul(y, g)).backward();
  Tensor gr = bf16_f64(g).reshape({12, 24});
  CHECK(max_diff(x.grad(), matmul(gr, bf16_f64(w)).reshape(x.shape())) < 1e-5);
  CHECK(max_diff(w.grad(), matmul(gr.transpose(0, 1), bf16_f64(x).reshape({12, 40}))) < 1e-5);
  CHECK(max_diff(b.grad(), sum(g.reshape({12, 24}), {0})) < 1e-5);
  // without a bias too
  Tensor y2;
  {
    AutocastGuard bf16(Precision::bf16);
    y2 = linear(x.detach(), w.detach());
  }
  CHECK(max_diff(y2, matmul(bf16_f64(x), bf16_f64(w).transpose(0, 1))) < 1e-5);
}

TEST_CASE("autocast: linear keeps its input for backward in 16 bits, with the same gradients") {
  // fc2(gelu(fc1(x))): under autocast fc1 keeps a 16-bit copy of x (held outside, so that copy is
  // extra), and fc2 keeps gelu's output in 16 bits instead of f32 (the f32 one is freed). gelu
  // keeps its input u in f32 either way.
  const int64_t rows = 128, d = 64, hidden = 256;
  Tensor x = rnd({rows, d}, 41);
  Tensor w1 = mul(rnd({hidden, d}, 42), 0.2).detach().set_requires_grad(true);
  Tensor w2 = mul(rnd({d, hidden}, 43), 0.1).detach().set_requires_grad(true);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    CAPTURE(name(p));
    auto run = [&](Precision prec, uint64_t* held) {
      w1.set_grad(Tensor());
      w2.set_grad(Tensor());
      const uint64_t before = alloc_stats().bytes_in_use;
      Tensor y;
      {
        AutocastGuard guard(prec);
        y = linear(gelu(linear(x, w1)), w2);
      }
      *held = alloc_stats().bytes_in_use - before;
      sum(mul(y, y)).backward();
      return std::vector{w1.grad().clone(), w2.grad().clone()};
    };
    // the reference: the f32 activations kept, every product reading them rounded (the emulation
    // of autocast: round_bf16 / round_fp16 of both operands, f32 products)
    auto r = [p](const Tensor& t) { return round_operand(t, p); };
    uint64_t held16 = 0;
    const std::vector<Tensor> got = run(p, &held16);
    {
      Tensor w1r = r(w1.detach()), w2r = r(w2.detach());
      Tensor u1 = matmul(r(x), w1r.transpose(0, 1));
      Tensor a = gelu(u1);
      Tensor y = matmul(r(a), w2r.transpose(0, 1));
      Tensor dy = r(mul(y, 2.0));
      Tensor dw2 = matmul(dy.transpose(0, 1), r(a));
      Tensor da = matmul(dy, w2r);
      Tensor ul = u1.detach().set_requires_grad(true);
      sum(gelu(ul)).backward();  // ul.grad() = gelu'(u1)
      Tensor du = r(mul(da, ul.grad()));
      Tensor dw1 = matmul(du.transpose(0, 1), r(x));
      // the same products summed in another order (sbgemm or the f32 GEMM), and a rounding of the
      // gradient that may flip by one bf16 ulp where the f32 sums differ in their last bit
      CHECK(max_diff(got[1], dw2) < 1e-3 * max_diff(dw2, zeros_like(dw2)));
      CHECK(max_diff(got[0], dw1) < 1e-3 * max_diff(dw1, zeros_like(dw1)));
    }
    uint64_t held32 = 0;
    run(Precision::fp32, &held32);
    const uint64_t f32_hidden = alloc_size_class(rows * hidden * 4), half_hidden = alloc_size_class(rows * hidden * 2);
    const uint64_t half_x = alloc_size_class(rows * d * 2);
    MESSAGE(std::string(name(p)), ": held for backward ", held16, " bytes, f32 ", held32);
    CHECK(held16 == held32 - f32_hidden + half_hidden + half_x);
  }
}

namespace {

// Under bf16 autocast with grad mode off, linear reads its weight's bf16 copy (rounded once,
// autocast_bf16_weight) instead of rounding the f32 weight at every product. The products must
// be the same bits as the same linear on a weight that is not cached (one that requires no
// grad), for a generated token's rows (sgemm_small_m_b16) and for a batch (sbgemm_b16 or the
// emulation), with native bf16 products and without.
void check_inference_weight_copy(bool native) {
  const bool native_before = cpu::sbgemm_native();
  cpu::set_sbgemm_native(native);  // false is accepted everywhere; true only with AVX512-BF16
  REQUIRE(cpu::sbgemm_native() == native);
  Tensor w = rnd({70, 37}, 61).set_requires_grad(true), b = rnd({70}, 62).set_requires_grad(true);
  AutocastGuard bf16(Precision::bf16);
  NoGradGuard no_grad;
  CHECK(autocast_bf16_weights_kept() == 0);
  for (int64_t rows : {1, 3, 9, 40}) {
    CAPTURE(rows);
    const Tensor x = rnd({rows, 37}, 63 + uint64_t(rows));
    const Tensor y = linear(x, w, b), y_nobias = linear(x, w);
    CHECK(autocast_bf16_weights_kept() == 1);  // the same copy for every call
    CHECK(y.to_vector<float>() == linear(x, w.detach(), b.detach()).to_vector<float>());
    CHECK(y_nobias.to_vector<float>() == linear(x, w.detach()).to_vector<float>());
    // and they are bf16 products: an f64 reference of the rounded operands, not the f32 result
    Tensor ref = matmul(round_bf16(x).to(DType::f64), round_bf16(w.detach()).to(DType::f64).mT()) +
                 b.detach().to(DType::f64);
    check_close(y, ref.to_vector<double>(), 1e-5, 1e-5);
    AutocastGuard off(Precision::fp32);
    CHECK(y.to_vector<float>() != linear(x, w.detach(), b.detach()).to_vector<float>());
  }
  CHECK(autocast_bf16_weights_kept() == 0);  // the fp32 guard above dropped the copies
  {  // a weight whose values are not contiguous (a transposed view made a leaf): its copy is of them
    Tensor wt = rnd({37, 70}, 74).mT().set_requires_grad(true);
    REQUIRE(!wt.is_contiguous());
    for (int64_t rows : {1, 9}) {
      CAPTURE(rows);
      const Tensor xt = rnd({rows, 37}, 75);
      CHECK(linear(xt, wt, b).to_vector<float>() ==
            linear(xt, wt.detach().contiguous(), b.detach()).to_vector<float>());
    }
    CHECK(autocast_bf16_weights_kept() == 1);
  }
  const Tensor x = rnd({1, 37}, 70);
  const std::vector<float> before = linear(x, w, b).to_vector<float>();
  CHECK(autocast_bf16_weights_kept() == 1);  // wt's went with wt
  // an in-place write (an optimizer step, load_state_dict) makes the copy stale: the next product
  // reads the new values
  w.detach().mul_(-0.5);
  const std::vector<float> after = linear(x, w, b).to_vector<float>();
  CHECK(after != before);
  CHECK(after == linear(x, w.detach(), b.detach()).to_vector<float>());
  CHECK(autocast_bf16_weights_kept() == 1);
  // a weight that is gone leaves no copy behind once another is cached
  {
    Tensor w2 = rnd({5, 37}, 71).set_requires_grad(true);
    linear(x, w2);
    CHECK(autocast_bf16_weights_kept() == 2);
  }
  Tensor w3 = rnd({6, 37}, 72).set_requires_grad(true);
  linear(x, w3);
  CHECK(autocast_bf16_weights_kept() == 2);  // w's and w3's
  // a product recorded for backward (training) drops every copy
  set_grad_enabled(true);
  linear(x.detach().set_requires_grad(true), w);
  set_grad_enabled(false);
  CHECK(autocast_bf16_weights_kept() == 0);
  // a checkpointed forward (training) keeps none either, and gives the same bits
  set_grad_enabled(true);
  const Tensor xc = rnd({2, 37}, 73).set_requires_grad(true);
  const Tensor yc = checkpoint([&](const Tensor& in) { return linear(in, w, b); }, xc, {w, b});
  CHECK(autocast_bf16_weights_kept() == 0);
  CHECK(yc.to_vector<float>() == linear(xc, w, b).to_vector<float>());
  set_grad_enabled(false);
  cpu::set_sbgemm_native(native_before);
}

}  // namespace

TEST_CASE("autocast: inference keeps each weight's bf16 copy, with the bits of rounding it as it is read, until "
          "the weight changes (emulated bf16 products)") {
  check_inference_weight_copy(false);
}

TEST_CASE("autocast: inference keeps each weight's bf16 copy, with the bits of rounding it as it is read, until "
          "the weight changes (bf16 products on AVX512-BF16)") {
  if (!cpu::sbgemm_supported()) {
    MESSAGE("[skipped: no avx512_bf16] native bf16 products need AVX512-BF16; the emulated case above runs everywhere");
    return;
  }
  check_inference_weight_copy(true);
}

TEST_CASE("autocast: the naive matmul kernel rounds as the GEMM path does") {
  Tensor a = rnd({5, 17}, 31), b = rnd({17, 9}, 32);
  Tensor c1 = empty({5, 9}), c2 = empty({5, 9});
  const cpu::Gemm g{5, 9, 17, false, false, 17, 9, nullptr, nullptr, Precision::bf16};
  cpu::matmul_forward(c1.data<float>(), a.data<float>(), b.data<float>(), g);
  cpu::matmul_forward_naive(c2.data<float>(), a.data<float>(), b.data<float>(), g);
  CHECK(max_diff(c1, c2) < 1e-5);
  CHECK(max_diff(c1, matmul(bf16_f64(a), bf16_f64(b))) < 1e-5);
  // operand_span: a (5, 17) read as is covers 5 rows of ld 17; transposed (stored 17 x 5, ld 8) 16*8+5
  CHECK(cpu::operand_span(false, 5, 17, 17, nullptr) == 85);
  CHECK(cpu::operand_span(true, 5, 17, 8, nullptr) == 16 * 8 + 5);
  Layout batch;
  batch.ndim = 2, batch.shape[0] = 3, batch.shape[1] = 2, batch.strides[0] = 0, batch.strides[1] = 100;
  CHECK(cpu::operand_span(false, 5, 17, 17, &batch) == 185);  // broadcast dim adds nothing
  CHECK(cpu::operand_span(false, 0, 17, 17, &batch) == 0);
}

namespace {

// The nearest bf16 value of x (8 significant bits, ties to even), in f64: the rule rounds the exact
// dS, where pw::round_bf16 would round an f32 one.
double bf16_of(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m 2^e, 1/2 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

// Attention under bf16 autocast by hand, in f64 (the rule), and for each element a bound on how far
// an f32 path that follows the rule (the fused kernel, on VDPBF16PS or not, or the composed ops) may
// lie from it:
//   forward:  S = scale Q K^T,  P = softmax(S) over the visible keys,  O = (P M) V
//   backward: G = bf16(dO),  dP = M (G V^T),  D_i = G_i . O_i,  dS = P (dP - D),  dS_r = bf16(dS),
//             dQ = scale dS_r K,  dK = scale dS_r^T Q,  dV = (P M)^T G  (dK, dV summed over a group)
// with Q, K, V the bf16 values of q, k, v and M dropout's keep factors. `weights` is P in f64 (the
// composed path's, zero where a key is hidden), `keep` is M (undefined: none); without round_grads
// G = dO and dS_r = dS (the gradients of the f32 attention of the rounded q, k, v).
//
// The bounds, to first order in u = 2^-24 (f32's unit roundoff). A sum of n terms in f32, in any
// order or blocking, is off by at most (n + c) u sum |terms|, c counting the few other roundings on
// a term's way (a scale, an add into the output, a group's sum); c = 8 covers each sum here.
//   S: D products of bf16 values, exact in f32 (8 x 8 significant bits), summed, times scale:
//      |err| <= (D + 2) u a_ij,  a_ij = scale sum_c |Q_ic K_jc|;  s_i = its largest in row i.
//   P = e^(S - lse), relative error e_i = 2 s_i + u (Tk + 2 R_i + L_i + 2 ln Tk + 40): the errors of S
//      and of lse (which carries those of the S it sums, and of a sum of Tk exps); the argument's
//      rounding, u |S - lse| <= u R_i with R_i = max_j -ln P_ij; each exp within 4 ulp (fast_exp
//      0.91, libmvec 4: core/cpu/vecmath.h), the log, m + log l (L_i = |lse_i|), the rescalings
//      between key tiles and the keep factor: 40 u in all.
//   O_ic: (e_i + (Tk + 8) u) o_ic,  o_ic = sum_j P_ij M_ij |V_jc|;  dV likewise over the Tq G queries.
//   dP_ij: (Dv + 2) u b_ij,  b_ij = M_ij sum_c |G_ic V_jc|.
//   D_i: the fused kernel sums G_i . O_i (its f32 O), the composed softmax sum_j P_ij dP_ij. In
//      either, P's errors move D_i by at most e_i sum_j P_ij |dP_ij| (G . sum_j P_j V_j is
//      sum_j P_j dP_j); then the larger of the two forms' sums: (Tk + Dv + 10) u sum_c |G_ic| o_ic,
//      or (Tk + 2) u sum_j P_ij |dP_ij| + (Dv + 2) u sum_j P_ij b_ij.
//   dS_ij = P (dP - D): d_ij = e_i P |dP - D| + P (err dP + err D) + 3 u P (|dP| + |D|).
// Then dS is rounded to bf16 (unit roundoff 2^-8, one step up to 2^-7 |dS|). Where [dS - d, dS + d]
// holds no midpoint between bf16 neighbours, every path rounds to the rule's dS_r; where it does, a
// path may round to the other neighbour: slack_ij = bf16(dS + d) - bf16(dS - d), one step. dQ then
// sums exact products (bf16 times bf16):
//   |dQ_ic - rule| <= scale sum_j slack_ij |K_jc| + (Tk + 8) u scale sum_j (|dS_r_ij| + slack_ij) |K_jc|
// and dK likewise over the Tq G queries of its group. Every element must be within its bound: a key
// dropped or misread in one tile moves dQ_i by a whole term scale dS_ij K_j, about 1/sqrt(Tk) of
// |dQ_i| and far above its bound, whose slack part is one bf16 step (2^-7 of a term) for each dS
// near a midpoint only; and it moves the whole row dK_j.
struct Rule {
  std::vector<Tensor> value, bound;  // out, dq, dk, dv
};

Rule attention_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& weights,
                    const Tensor& keep, double scale, bool round_grads = true) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Hkv = k.size(1), Tk = k.size(2),
                Dv = v.size(3), Gq = H / Hkv;
  const std::vector<double> Q = bf16_f64(q).to_vector<double>(), K = bf16_f64(k).to_vector<double>(),
                            V = bf16_f64(v).to_vector<double>(),
                            G = (round_grads ? bf16_f64(dout) : dout.detach().to(DType::f64)).to_vector<double>(),
                            W = weights.detach().to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> Mk =
      keep.defined() ? keep.detach().to(DType::f64).contiguous().to_vector<double>() : std::vector<double>(W.size(), 1.0);
  const double u = 0x1p-24;
  std::vector<double> out(size_t(B * H * Tq * Dv)), bout(out.size()), dq(Q.size()), dq_slack(Q.size()), dq_sum(Q.size()),
      dk(K.size()), dk_slack(K.size()), dk_sum(K.size()), dv(V.size()), bdv(V.size());
  const size_t nk = static_cast<size_t>(Tk), nv = static_cast<size_t>(Dv);
  std::vector<double> S(nk), a(nk), dP(nk), bP(nk), O(nv), o(nv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h, kv = b * Hkv + h / Gq;
      const double *Kh = K.data() + kv * Tk * D, *Vh = V.data() + kv * Tk * Dv;
      for (int64_t i = 0; i < Tq; ++i) {
        const double *Qi = Q.data() + (bh * Tq + i) * D, *Gi = G.data() + (bh * Tq + i) * Dv;
        const double *P = W.data() + (bh * Tq + i) * Tk, *M = Mk.data() + (bh * Tq + i) * Tk;
        double s = 0, R = 0, L = 0, pmax = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          double sj = 0, aj = 0;
          for (int64_t c = 0; c < D; ++c) sj += Qi[c] * Kh[j * D + c], aj += std::abs(Qi[c] * Kh[j * D + c]);
          S[size_t(j)] = scale * sj, a[size_t(j)] = scale * aj;
          if (P[j] > 0) {
            s = std::max(s, double(D + 2) * u * a[size_t(j)]);
            R = std::max(R, -std::log(P[j]));
            if (P[j] > pmax) pmax = P[j], L = std::abs(S[size_t(j)] - std::log(P[j]));  // |lse_i|
          }
        }
        const double e = 2 * s + u * (double(Tk) + 2 * R + L + 2 * std::log(double(Tk)) + 40);
        std::fill(O.begin(), O.end(), 0.0), std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < Tk; ++j)
          for (int64_t c = 0; c < Dv; ++c) O[size_t(c)] += P[j] * M[j] * Vh[j * Dv + c], o[size_t(c)] += P[j] * M[j] * std::abs(Vh[j * Dv + c]);
        double Di = 0, go = 0;  // go = sum_c |G_ic| o_ic
        for (int64_t c = 0; c < Dv; ++c) {
          const size_t at = size_t((bh * Tq + i) * Dv + c);
          out[at] = O[size_t(c)];
          bout[at] = (e + double(Tk + 8) * u) * o[size_t(c)];
          Di += Gi[c] * O[size_t(c)];
          go += std::abs(Gi[c]) * o[size_t(c)];
        }
        double pdp = 0, pbp = 0;  // sum_j P_ij |dP_ij|, sum_j P_ij b_ij
        for (int64_t j = 0; j < Tk; ++j) {
          double dp = 0, bp = 0;
          for (int64_t c = 0; c < Dv; ++c) dp += Gi[c] * Vh[j * Dv + c], bp += std::abs(Gi[c] * Vh[j * Dv + c]);
          dP[size_t(j)] = M[j] * dp, bP[size_t(j)] = M[j] * bp;
          pdp += P[j] * std::abs(dP[size_t(j)]), pbp += P[j] * bP[size_t(j)];
        }
        // D_i: P's errors move G . O and sum_j P dP alike, by e sum_j P |dP|; then the fused kernel's
        // sums of O (Tk terms) and of G . O (Dv terms), or the composed path's dP and sum_j P dP
        const double errD = e * pdp + std::max(double(Tk + Dv + 10) * u * go, double(Tk + 2) * u * pdp + double(Dv + 2) * u * pbp);
        for (int64_t j = 0; j < Tk; ++j) {
          if (P[j] == 0) continue;  // hidden: dS = 0 exactly on every path
          const double dS = P[j] * (dP[size_t(j)] - Di);
          const double d = e * P[j] * std::abs(dP[size_t(j)] - Di) + P[j] * (double(Dv + 2) * u * bP[size_t(j)] + errD) +
                           3 * u * P[j] * (std::abs(dP[size_t(j)]) + std::abs(Di));
          const double dSr = round_grads ? bf16_of(dS) : dS;
          const double slack = round_grads ? bf16_of(dS + d) - bf16_of(dS - d) : 0.0;
          for (int64_t c = 0; c < D; ++c) {
            const size_t iq = size_t((bh * Tq + i) * D + c), jk = size_t((kv * Tk + j) * D + c);
            dq[iq] += scale * dSr * Kh[j * D + c];
            dq_slack[iq] += scale * slack * std::abs(Kh[j * D + c]);
            dq_sum[iq] += scale * (std::abs(dSr) + slack) * std::abs(Kh[j * D + c]);
            dk[jk] += scale * dSr * Qi[c];
            dk_slack[jk] += scale * slack * std::abs(Qi[c]);
            dk_sum[jk] += scale * (std::abs(dSr) + slack) * std::abs(Qi[c]);
          }
          for (int64_t c = 0; c < Dv; ++c) {
            const size_t jv = size_t((kv * Tk + j) * Dv + c);
            dv[jv] += P[j] * M[j] * Gi[c];
            bdv[jv] += (e + double(Tq * Gq + 8) * u) * P[j] * M[j] * std::abs(Gi[c]);
          }
        }
      }
    }
  std::vector<double> bdq(dq.size()), bdk(dk.size());
  for (size_t x = 0; x < dq.size(); ++x) bdq[x] = dq_slack[x] + double(Tk + 8) * u * dq_sum[x];
  for (size_t x = 0; x < dk.size(); ++x) bdk[x] = dk_slack[x] + double(Tq * Gq + 8) * u * dk_sum[x];
  const Shape so{B, H, Tq, Dv};
  return {{from_vector(out, so), from_vector(dq, q.shape()), from_vector(dk, k.shape()), from_vector(dv, v.shape())},
          {from_vector(bout, so), from_vector(bdq, q.shape()), from_vector(bdk, k.shape()), from_vector(bdv, v.shape())}};
}

// Every element of got within its bound of the rule: |got - value| <= bound, none over. The
// message names the worst element and how much of its bound it uses.
void check_within(const Tensor& got, const Tensor& value, const Tensor& bound) {
  const std::vector<double> x = got.detach().to(DType::f64).to_vector<double>(), y = value.to_vector<double>(),
                            b = bound.to_vector<double>();
  REQUIRE(x.size() == y.size());
  size_t over = 0, at = 0;
  double worst = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    const double diff = std::abs(x[e] - y[e]);
    const double r = !(diff == diff) ? HUGE_VAL : diff == 0 ? 0 : b[e] > 0 ? diff / b[e] : HUGE_VAL;  // NaN: over
    over += !(diff <= b[e]);
    if (r > worst) worst = r, at = e;
  }
  INFO("worst of ", x.size(), ": element ", at, " got ", x[at], ", rule ", y[at], ", bound ", b[at], " (", worst,
       " of it)");
  CHECK(over == 0);
}

// The share of the elements of got outside their bound of the rule.
double share_outside(const Tensor& got, const Tensor& value, const Tensor& bound) {
  const std::vector<double> x = got.detach().to(DType::f64).to_vector<double>(), y = value.to_vector<double>(),
                            b = bound.to_vector<double>();
  size_t n = 0;
  for (size_t e = 0; e < x.size(); ++e) n += std::abs(x[e] - y[e]) > b[e];
  return x.empty() ? 0.0 : double(n) / double(x.size());
}

// The f64 kernel on the bf16 values of q, k, v: out and the gradients of sum(out * g), with dO and
// dS unrounded (f64 runs no autocast). It checks the rule without rounding.
std::vector<Tensor> f64_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const SdpaOptions& o) {
  Tensor q64 = bf16_f64(q).set_requires_grad(true), k64 = bf16_f64(k).set_requires_grad(true),
         v64 = bf16_f64(v).set_requires_grad(true);
  Tensor y = scaled_dot_product_attention(q64, k64, v64, o).out;
  sum(mul(y, g.detach().to(DType::f64))).backward();
  return {y.detach(), q64.grad(), k64.grad(), v64.grad()};
}

// Two f64 evaluations of one function: sums of at most a few hundred terms, each off by 2^-53 of
// its terms, so far below 1e-10 of the largest element.
void check_f64_equal(const Tensor& a, const Tensor& b) {
  const double tol = 1e-10 * std::max(max_diff(b, zeros_like(b)), 1e-300);
  CHECK(max_diff(a, b) <= tol);
}

}  // namespace

TEST_CASE("autocast: attention is the f32 attention of bf16 q, k, v, whose backward reads dO and dS in bf16, fused and composed") {
  const Tensor q0 = rnd({2, 3, 9, 16}, 41), k0 = rnd({2, 3, 9, 16}, 42), v0 = rnd({2, 3, 9, 16}, 43);
  const Tensor g = rnd({2, 3, 9, 16}, 44);
  SdpaOptions o;
  o.causal = true;
  const double scale = 0.25;  // 1 / sqrt(16)
  SdpaOptions ow = o;
  ow.return_weights = true;
  const Tensor weights = scaled_dot_product_attention(bf16_f64(q0), bf16_f64(k0), bf16_f64(v0), ow).weights;
  const Rule rule = attention_rule(q0, k0, v0, g, weights, Tensor(), scale);
  // The rule without the rounding of dO and dS is the f64 kernel's attention of the rounded q, k, v.
  // The bounds tell the two apart: the rounding moves each term of dV (by dO) and of dQ, dK (by dO
  // and dS) by up to 2^-8 of it, far more than the f32 sums' (n + 8) 2^-24 of all the terms. So the
  // unrounded gradients lie beyond twice the bound in more than 5% of their elements, where a path
  // that skipped the rounding (within one bound of them) fails check_within.
  const Rule plain = attention_rule(q0, k0, v0, g, weights, Tensor(), scale, false);
  const std::vector<Tensor> f64 = f64_attention(q0, k0, v0, g, o);
  check_f64_equal(rule.value[0], f64[0]);  // the forward rounds nothing more
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    check_f64_equal(plain.value[i], f64[i]);
    if (i > 0) CHECK(share_outside(plain.value[i], rule.value[i], mul(rule.bound[i], 2.0)) > 0.05);
  }
  const bool native_before = cpu::sbgemm_native();
  cpu::set_sbgemm_native(false);  // the bf16 products on AVX512-BF16: the case further below
  for (bool composed : {false, true}) {
    INFO("path: ", std::string(composed ? "return_weights (composed)" : "fused"));
    Tensor q = q0.detach().set_requires_grad(true), k = k0.detach().set_requires_grad(true),
           v = v0.detach().set_requires_grad(true);
    SdpaOptions oc = o;
    oc.return_weights = composed;
    Tensor y;
    {
      AutocastGuard bf16(Precision::bf16);
      y = scaled_dot_product_attention(q, k, v, oc).out;
    }
    sum(mul(y, g)).backward();
    const std::vector<Tensor> got = {y, q.grad(), k.grad(), v.grad()};
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      check_within(got[i], rule.value[i], rule.bound[i]);
    }
    // and not the f32 attention of the unrounded q, k, v (2^-8 of each operand moves most outputs
    // far beyond their bound)
    CHECK(share_outside(scaled_dot_product_attention(q0, k0, v0, o).out, rule.value[0], rule.bound[0]) > 0.9);
  }
  cpu::set_sbgemm_native(native_before);
}

TEST_CASE("autocast: fused CPU attention keeps q, k, v in 16 bits: the bits of f32 rounded copies, half the memory") {
  // q, k, v as the heads of one fused projection (B, T, 3, H, D): strided views, as in
  // MultiHeadAttention; the reference runs the f32 kernel on f32 rounded copies (round_bf16 /
  // round_fp16: straight-through gradients). The same values through the same f32 arithmetic: the
  // same bits, forward and backward (backward: the f32 kernel called directly with the same
  // rounding of dO and dS, AttentionGeom::grad_operands, which only autocast sets).
  // The bits hold for the kernel's own f32 products: bf16 scores on AVX512-BF16 (native, the next
  // case) sum the same products in another order, so they are switched off here.
  const bool native_before = cpu::sbgemm_native();
  if (native_before) cpu::set_sbgemm_native(false);
  const int64_t B = 2, T = 37, H = 3, D = 16;
  const Tensor qkv = rnd({B, T, 3, H, D}, 61);
  for (Precision p : {Precision::bf16, Precision::fp16})
    for (int mask = 0; mask < 4; ++mask) {
      CAPTURE(name(p));
      CAPTURE(mask);
      // mask 3: none, and q, k, v as three tensors of their own (each cast alone), where the heads
      // of one tensor are cast as one run of it
      const bool one_run = mask < 3;
      SdpaOptions o;
      o.causal = mask == 1;
      if (mask == 2) o.key_padding_lengths = from_vector<int64_t>({T, 20}, {2});
      auto r = [p](const Tensor& t) { return round_operand(t, p); };
      auto run = [&](bool autocast, std::vector<Tensor>* grads, uint64_t* held) {
        Tensor x = qkv.detach().set_requires_grad(true);
        Tensor q = x.select(2, 0).transpose(1, 2), k = x.select(2, 1).transpose(1, 2), v = x.select(2, 2).transpose(1, 2);
        if (!one_run) q = q.contiguous(), k = k.contiguous(), v = v.contiguous();
        const uint64_t before = alloc_stats().bytes_in_use;
        Tensor y;
        if (autocast) {
          AutocastGuard guard(p);
          y = scaled_dot_product_attention(q, k, v, o).out;
        } else {
          y = scaled_dot_product_attention(r(q), r(k), r(v), o).out;
        }
        *held = alloc_stats().bytes_in_use - before;
        sum(mul(y, rnd(y.shape(), 62))).backward();
        *grads = {y.detach(), x.grad()};
      };
      std::vector<Tensor> got, want;
      uint64_t held16 = 0, held32 = 0;
      run(true, &got, &held16);
      run(false, &want, &held32);
      check_close(got[0], want[0], 0, 0);
      // backward: the f32 kernel on contiguous rounded copies, dO rounded, dS rounded in the kernel
      const Tensor x = qkv.detach();
      auto head = [&](int64_t which) { return r(x.select(2, which).transpose(1, 2)).contiguous(); };
      const Tensor q = head(0), k = head(1), v = head(2);
      const Tensor dout = r(rnd({B, H, T, D}, 62)).contiguous();
      cpu::AttentionGeom g;
      g.BH = B * H, g.H = H, g.Tq = g.Tk = T, g.D = g.Dv = D, g.scale = 1.0 / std::sqrt(double(D));
      g.causal = o.causal, g.grad_operands = p;
      if (o.key_padding_lengths.defined()) g.lengths = o.key_padding_lengths.data<int64_t>();
      Tensor out = empty({B, H, T, D}), lse = empty({B, H, T}), dq = zeros({B, H, T, D}), dk = zeros({B, H, T, D}),
             dv = zeros({B, H, T, D});
      cpu::attention_forward<float>(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                                    v.data<float>(), g);
      check_close(got[0], out, 0, 0);
      cpu::attention_backward<float>(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                                     q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                     lse.data<float>(), g);
      const Tensor gx = got[1];
      check_close(gx.select(2, 0).transpose(1, 2).contiguous(), dq, 0, 0);
      check_close(gx.select(2, 1).transpose(1, 2).contiguous(), dk, 0, 0);
      check_close(gx.select(2, 2).transpose(1, 2).contiguous(), dv, 0, 0);
      CHECK(max_diff(gx, want[1]) > 0);  // not the gradients without the rounding
      // kept: out and lse as in f32, q, k, v in 2 bytes instead of 4 (one copy of the run they tile)
      const uint64_t n = uint64_t(B * H * T * D);
      CHECK(held16 == held32 - 3 * alloc_size_class(n * 4) +
                          (one_run ? alloc_size_class(3 * n * 2) : 3 * alloc_size_class(n * 2)));
    }
  if (native_before) cpu::set_sbgemm_native(true);
}

TEST_CASE("autocast: bf16 attention products on AVX512-BF16, against the rule by hand, the emulation and the ops, the same bits at 1 and 2 threads") {
  if (!cpu::sbgemm_supported()) {
    MESSAGE("[skipped: no avx512_bf16] the native bf16 scores need AVX512-BF16; the emulated path is the case above");
    return;
  }
  const bool native_before = cpu::sbgemm_native();
  const int threads_before = num_threads();
  struct Case {
    const char* name;
    int64_t B, H, Hkv, Tq, Tk, D;
    int mask;  // 0 none, 1 causal, 2 key padding, 3 window, 4 block mask, 5 dropout
  };
  // ragged tiles: 37 queries (blocks of 32 + 5 rows: 8-row and 1-row blocks), 300 keys (a tile of
  // 256 and one of 44: full and masked columns); a window over 77 keys starts key tiles at odd
  // keys (the pairs of K rows from an odd key) and ends them at odd counts; D 15 is odd, so it
  // keeps the f32 products
  const Case cases[] = {{"d 16", 2, 3, 3, 37, 300, 16, 0},        {"d 32 causal", 1, 2, 2, 300, 300, 32, 1},
                        {"d 64 padding", 2, 2, 2, 37, 70, 64, 2}, {"d 16 window, grouped", 1, 4, 2, 90, 90, 16, 3},
                        {"d 32 block mask", 1, 2, 2, 96, 96, 32, 4}, {"d 16 dropout", 1, 2, 2, 40, 40, 16, 5},
                        {"d 32 window, odd Tq and Tk (key tiles from odd keys)", 1, 2, 2, 45, 77, 32, 3},
                        {"d 15 (odd: f32 products)", 1, 2, 2, 37, 45, 15, 1}};
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    const Tensor q0 = rnd({c.B, c.H, c.Tq, c.D}, 71), k0 = rnd({c.B, c.Hkv, c.Tk, c.D}, 72),
                 v0 = rnd({c.B, c.Hkv, c.Tk, c.D}, 73), g = rnd({c.B, c.H, c.Tq, c.D}, 74);
    SdpaOptions o;
    o.causal = c.mask == 1;
    if (c.mask == 2) o.key_padding_lengths = from_vector<int64_t>({c.Tk, 23}, {2});
    if (c.mask == 3) o.window = 7;
    o.enable_gqa = c.Hkv != c.H;
    if (c.mask == 4)  // blocks of 32: the diagonal and the first column
      o.block_mask = nn::local_global_block_mask(c.Tq, 32, 0, 1), o.block_size = 32;
    Generator drop(5);
    if (c.mask == 5) o.dropout = 0.25, o.generator = &drop;
    // out and the gradients of q, k, v under bf16 autocast, on the path the switches give
    auto run = [&](bool native, int threads, bool composed = false) {
      cpu::set_sbgemm_native(native);
      set_num_threads(threads);
      drop.manual_seed(5);
      Tensor q = q0.detach().set_requires_grad(true), k = k0.detach().set_requires_grad(true),
             v = v0.detach().set_requires_grad(true);
      Tensor y;
      {
        AutocastGuard bf16(Precision::bf16);
        SdpaOptions oc = o;
        oc.return_weights = composed;
        y = scaled_dot_product_attention(q, k, v, oc).out;
      }
      sum(mul(y, g)).backward();
      return std::vector<Tensor>{y.detach(), q.grad(), k.grad(), v.grad()};
    };
    const auto one = run(true, 1), two = run(true, 2), emulated = run(false, 2), composed = run(true, 2, true);
    // the rule by hand from the weights P of the f64 composed path and the keep factors M of the
    // same dropout stream (f32's 1 / (1 - p), as the f32 paths multiply)
    SdpaOptions ow = o;
    ow.return_weights = true;
    drop.manual_seed(5);
    const Tensor weights = scaled_dot_product_attention(bf16_f64(q0), bf16_f64(k0), bf16_f64(v0), ow).weights;
    Tensor keep, keep64;  // f32's 1 / (1 - p) as the f32 paths multiply, and f64's as the f64 kernel
    if (c.mask == 5) {
      drop.manual_seed(5);
      keep = dropout(ones(weights.shape()), o.dropout, true, &drop);
      drop.manual_seed(5);
      keep64 = dropout(ones(weights.shape(), DType::f64), o.dropout, true, &drop);
    }
    const double scale = 1.0 / std::sqrt(double(c.D));
    const Rule rule = attention_rule(q0, k0, v0, g, weights, keep, scale);
    // without the rounding of dO and dS it is the f64 kernel's attention of the rounded q, k, v
    // (which checks the rule's masks, groups and dropout); and its bounds tell the rounding apart
    // (the case above)
    const Rule plain = attention_rule(q0, k0, v0, g, weights, keep64, scale, false);
    drop.manual_seed(5);
    const std::vector<Tensor> f64 = f64_attention(q0, k0, v0, g, o);
    bool differs = false;
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(i);
      check_close(one[i], two[i], 0, 0);  // the same bits at any thread count
      check_f64_equal(plain.value[i], f64[i]);
      if (i > 0) CHECK(share_outside(plain.value[i], rule.value[i], mul(rule.bound[i], 2.0)) > 0.05);
      // each path within the bound of every element: the native products (exact products summed two
      // at a time), the emulation (the same products one at a time) and the ops (return_weights)
      {
        INFO("path: native");
        check_within(one[i], rule.value[i], rule.bound[i]);
      }
      {
        INFO("path: emulated");
        check_within(emulated[i], rule.value[i], rule.bound[i]);
      }
      {
        INFO("path: composed");
        check_within(composed[i], rule.value[i], rule.bound[i]);
      }
      differs = differs || max_diff(one[i], emulated[i]) > 0;
    }
    CHECK(differs == (c.D % 2 == 0));  // the even head sizes ran the native scores, the odd one not
  }
  cpu::set_sbgemm_native(native_before);
  set_num_threads(threads_before);
}

TEST_CASE("autocast: fp16 rounds the operands of matmul, linear and attention to IEEE half") {
  Tensor a = rnd({7, 33}, 51).set_requires_grad(true), b = rnd({33, 5}, 52).set_requires_grad(true);
  auto half_f64 = [](const Tensor& t) { return round_fp16(t.detach()).to(DType::f64); };
  Tensor y;
  {
    AutocastGuard fp16(Precision::fp16);
    CHECK(autocast_operands(DType::f32) == Precision::fp16);
    y = matmul(a, b);
  }
  CHECK(max_diff(y, matmul(half_f64(a), half_f64(b))) < 1e-5);
  CHECK(max_diff(y, matmul(a.detach(), b.detach())) > 1e-5);              // not the f32 product
  CHECK(max_diff(y, matmul(bf16_f64(a), bf16_f64(b))) > 1e-3);            // nor the bf16 one
  Tensor g = rnd(y.shape(), 53);
  sum(mul(y, g)).backward();
  CHECK(max_diff(a.grad(), matmul(half_f64(g), half_f64(b).transpose(0, 1))) < 1e-5);
  CHECK(max_diff(b.grad(), matmul(half_f64(a).transpose(0, 1), half_f64(g))) < 1e-5);
  // a gradient below half's smallest subnormal (2^-24) vanishes in the backward GEMM: why fp16
  // training scales its loss (optim::GradScaler)
  a.set_grad(Tensor());
  Tensor y2;
  {
    AutocastGuard fp16(Precision::fp16);
    y2 = matmul(a, b.detach());
  }
  sum(mul(y2, full(y2.shape(), 1e-9))).backward();
  CHECK(max(abs(a.grad())).item<double>() == 0);

  Tensor x = rnd({2, 9, 24}, 54), w = rnd({8, 24}, 55);
  Tensor yl;
  {
    AutocastGuard fp16(Precision::fp16);
    yl = linear(x, w);
  }
  CHECK(max_diff(yl, matmul(half_f64(x), half_f64(w).transpose(0, 1))) < 1e-5);

  Tensor q = rnd({1, 2, 7, 16}, 56), k = rnd({1, 2, 7, 16}, 57), v = rnd({1, 2, 7, 16}, 58);
  SdpaOptions o;
  o.causal = true;
  Tensor ya;
  {
    AutocastGuard fp16(Precision::fp16);
    ya = scaled_dot_product_attention(q, k, v, o).out;
  }
  CHECK(max_diff(ya, scaled_dot_product_attention(round_fp16(q), round_fp16(k), round_fp16(v), o).out) < 1e-6);
  CHECK(max_diff(ya, scaled_dot_product_attention(q, k, v, o).out) > 1e-6);
}
