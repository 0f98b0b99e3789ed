#pragma once
// Vectorisable math for the hot loops of the CPU kernels.
//
// 1. glibc's libmvec: GCC vectorises expf/logf/tanhf/erff (and the double forms) inside
//    `#pragma omp simd` loops once the SIMD variants are declared, as below (what <math.h> itself
//    does only under -ffast-math, which we avoid so NaN and Inf propagate exactly). libmvec's
//    functions are accurate to 4 ulp, but they are calls, slow enough to leave softmax and gelu
//    compute-bound.
// 2. fast_exp, fast_normal_cdf, fast_normal_pdf (float only): plain inline C++ with no branches and
//    no intrinsics, which the compiler vectorises in place: fast_exp is 21 vector operations and
//    no call (docs/benchmarks.md, "Memory-bound ops"). Each states its derivation and
//    accuracy; tests/core/test_vecmath.cpp measures that accuracy over the whole range.
//    Double stays on std:: (libmvec): f64 is for gradient checks, not speed.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) float erff(float) noexcept;
__attribute__((simd("notinbranch"))) double exp(double) noexcept;
__attribute__((simd("notinbranch"))) double log(double) noexcept;
__attribute__((simd("notinbranch"))) double tanh(double) noexcept;
__attribute__((simd("notinbranch"))) double erf(double) noexcept;
}
#endif

namespace ag {

// Forced inline: these are called per element inside loops that must vectorise. Left to its
// heuristics, GCC sometimes keeps one as a call in one copy of a loop (the single-thread branch of
// parallel_for, which GELU and softmax take on one thread), and a call stops vectorisation.
#if defined(__GNUC__)
#define AG_VEC_INLINE inline __attribute__((always_inline))
#else
#define AG_VEC_INLINE inline
#endif

// a * b + c, rounded once where the target has a fast fused multiply-add (FP_FAST_FMAF: any x86
// built with -march for Haswell/Zen or later, ARMv8). Elsewhere std::fma would be a slow library
// call that stops vectorisation, so it is two roundings there; the error bounds quoted below are
// for the fused form (unfused, fast_exp's measured error is 1.18 ulp instead of 0.91).
AG_VEC_INLINE float mul_add(float a, float b, float c) {
#if defined(FP_FAST_FMAF)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// v, or +0 where c holds. Written with bits rather than `c ? 0 : v` so that GCC keeps the loop
// branch-free: given a constant arm, it moves the computation of v into a branch and then cannot
// vectorise the loop (FP operations may trap, so it will not compute them unconditionally). Here
// it becomes one compare and a zero-masked final operation.
AG_VEC_INLINE float zero_where(bool c, float v) { return std::bit_cast<float>(std::bit_cast<int32_t>(v) & -int32_t(!c)); }

// e^x, max error 0.91 ulp over all floats (measured exhaustively, denormal results included); exact
// special values: e^0 = 1, e^-inf = 0, e^+inf = +inf, NaN -> NaN, 0 below x = -103.97 (half the
// least denormal) and +inf above x = 88.7228 (FLT_MAX), as the correctly rounded result.
//
//  1. Range reduction (Cody and Waite): x = n ln2 + r, n = round(x / ln2), so |r| <= ln2 / 2 and
//       e^x = 2^n e^r.
//     n: adding 1.5 * 2^23 to x log2(e) leaves no bits for a fraction, so the sum rounds it to the
//     nearest integer, and n sits in the low bits of the sum. It is capped at 128: above
//     (x > 89.1) e^x overflows anyway, and then r > ln2/2, so e^r > 1 and e^r 2^128 overflows to
//     +inf as it should (x = +inf gives r = +inf). r = x - n ln2 with ln2 = ln2_hi + ln2_lo,
//     ln2_hi = 355/512 having 9 significant bits: n ln2_hi (|n| <= 150 for x >= -104, 8 bits) is
//     exact, and so is x - n ln2_hi (both are multiples of ulp(x) for |x| < 128, and the
//     difference is below 1/2), which leaves only the small term n ln2_lo to round (error < 2e-8,
//     0.2 ulp of e^r).
//  2. e^r = 1 + r + r^2 Q(r) on |r| <= 0.3466, Q of degree 4 fitted for the least maximum relative
//     error (Lawson's iteration on a dense grid): 3.1e-9, 0.05 ulp, before rounding. Horner's rule;
//     1 and r have exact coefficients, so e^0 = 1 exactly.
//  3. 2^n from its bits: a float with exponent field n + 127 and zero mantissa. Two factors
//     2^n1 2^n2 (n1 = floor(n / 2), n2 = n - n1, each in [-80, 64], so each a normal float) make
//     the result round once into the denormal range (x < -87.34) or overflow to +inf (x > 88.72),
//     as the exact value would: p 2^n1 is exact, only the last product rounds.
//  4. Below x = -104 the result is 0; this also covers x = -inf and the huge negative n, for which
//     r and the exponent bits are meaningless. A NaN x propagates through r.
AG_VEC_INLINE float fast_exp(float x) {
  constexpr float kLog2e = 1.44269502f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194442e-4f;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const float k = mul_add(x, kLog2e, kShift);  // kShift + n, exactly
  // n from the low bits (unsigned: for x < -8.7e6 the difference wraps, and step 4 masks it)
  const int32_t n = std::min<int32_t>(int32_t(std::bit_cast<uint32_t>(k) - std::bit_cast<uint32_t>(kShift)), 128);
  const float nf = float(n);
  float r = x - nf * kLn2Hi;  // exact
  r = mul_add(nf, -kLn2Lo, r);
  float q = 1.38146034e-3f;  // Q(r) = c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4
  q = mul_add(q, r, 8.36871564e-3f);
  q = mul_add(q, r, 4.16683890e-2f);
  q = mul_add(q, r, 1.66665211e-1f);
  q = mul_add(q, r, 4.99999940e-1f);
  const float p = mul_add(mul_add(q, r, 1.0f), r, 1.0f);  // 1 + r (1 + r Q)
  const int32_t n1 = n >> 1, n2 = n - n1;
  const float y = p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  return zero_where(x < -104.0f, y);
}

// phi(x) = e^(-x^2/2) / sqrt(2 pi), the standard normal density. Relative error below
// 2e-7 + x^2 3e-8: the rounding of x^2 (half an ulp) becomes a relative error x^2 2^-25 of the
// exponential (3e-6 at |x| = 10, where phi is 8e-23). x = +-inf gives 0, NaN gives NaN.
AG_VEC_INLINE float fast_normal_pdf(float x) { return fast_exp(-0.5f * x * x) * 0.398942280f; }

// Phi(x) = P(X <= x), X standard normal, = (1 + erf(x / sqrt 2)) / 2, with absolute error below
// 1.2e-7 (measured 1.05e-7, 2 ulp of 1/2), so gelu(x) = x Phi(x) is within 1.2e-7 |x|.
//
// With u = |x|, write the left tail as a Gaussian times a slowly varying factor:
//   Phi(-u) = e^(-u^2/2) G(u),   G(u) = e^(u^2/2) Phi(-u) = erfcx(u / sqrt 2) / 2,
// G falls smoothly from 1/2 at u = 0 like 1/(u sqrt(2 pi)) as u -> inf, and a ratio P3(u) / Q4(u)
// follows that tail. Its coefficients are fitted for the least maximum absolute error of Phi,
// e^(-u^2/2) |P3/Q4 - G| (Sanathanan-Koerner iteration with Lawson's weights, u in [0, 15]):
// 2.6e-10, so what remains is float rounding. (The relative error of the ratio reaches 5e-4 for
// large u, so far in the left tail, where Phi < 1e-6, Phi is good to 5e-4 relative: PyTorch's
// float 1 + erf(x / sqrt 2) has no correct digit there and is 0 below x = -5.9.) All
// coefficients are positive, so Horner's rule adds no cancellation. Then by symmetry
//   Phi(x) = E for x < 0,  1 - E for x >= 0,   E = Phi(-|x|).
// Beyond u = 16, E = 0 (e^(-u^2/2) is 0 from u = 14.5 on, while P and Q overflow to inf / inf for
// huge u). Special values: Phi(-inf) = 0, Phi(+inf) = 1, NaN -> NaN.
AG_VEC_INLINE float fast_normal_cdf(float x) {
  const float u = std::abs(x);
  float p = 9.93600208e-3f, q = 2.49871891e-2f;
  p = mul_add(p, u, 8.64639282e-2f);
  q = mul_add(q, u, 2.15234384e-1f);
  p = mul_add(p, u, 2.97780395e-1f);
  q = mul_add(q, u, 7.84737289e-1f);
  p = mul_add(p, u, 0.5f);
  q = mul_add(q, u, 1.39344525e+0f);
  q = mul_add(q, u, 1.0f);
  const float e = zero_where(u > 16.0f, fast_exp(-0.5f * x * x) * (p / q));
  return x < 0.0f ? e : 1.0f - e;
}

// exp for the kernels templated on T: fast_exp for float, std::exp (libmvec) for double.
template <class T>
AG_VEC_INLINE T vexp(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_exp(x);
  else
    return std::exp(x);
}

}  // namespace ag
