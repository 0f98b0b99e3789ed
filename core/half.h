#pragma once
// The 16-bit float formats: bfloat16 (bf16) and IEEE half (f16). Their rounding from f32 (ties to
// even, the rule autocast rounds operands by: autograd/autocast.h), their bits, and the two
// storage types of DType::bf16 and DType::f16 (core/dtype.h). Plain C++ only: nvcc compiles this
// header, and the GPU's conversions give the same bits as the CPU's.
//
//   format  sign  exponent  mantissa  largest finite  smallest normal  machine epsilon
//   f32      1      8         23       3.4e38          1.2e-38          2^-23
//   bf16     1      8          7       3.4e38          1.2e-38          2^-7
//   f16      1      5         10       65504           6.1e-5           2^-10
//
// Every bf16 and f16 value is exact in f32, so a 16-bit tensor converts to f32 without loss; the
// other way rounds once, to nearest even.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/hd.h"

namespace ag::pw {

// The bits of an f32 and back (memcpy on the host, the intrinsics in device code).
AG_HD inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
AG_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float y;
  std::memcpy(&y, &u, sizeof y);
  return y;
#endif
}

// x rounded to the nearest bfloat16, returned as the f32 of the same value: bf16 is the top 16
// bits of an f32 (sign, 8 exponent bits, 7 stored mantissa bits), so rounding adds half of the
// dropped 16 bits' range, plus one when the kept part is odd (ties to even), and clears them.
// A carry out of the mantissa raises the exponent, which is the right rounding too (up to inf
// past bf16's largest finite value). NaN stays NaN (made quiet; the carry could turn a NaN with a
// small payload into inf). The same bits as CUDA's __float2bfloat16_rn.
AG_HD inline float round_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;  // NaN: quiet, payload kept
  else u += 0x7fffu + ((u >> 16) & 1u);
  return bits_float(u & 0xffff0000u);
}

// x rounded to the nearest IEEE half (fp16: 5 exponent bits, 10 stored mantissa bits), returned as
// the f32 of the same value; ties to even, as CUDA's __float2half_rn.
//   normal halves (|x| >= 2^-14): the mantissa rounded to 10 bits, as round_bf16 does with 7: add
//     half of the dropped 13 bits' range (plus one when the kept part is odd), clear them; a carry
//     raises the exponent
//   past the largest half, 65504: inf (every |x| >= 65520 rounds there)
//   subnormal halves (|x| < 2^-14): multiples of 2^-24, so rint(x 2^24) 2^-24 (both scalings
//     exact; rint rounds to even in the default rounding mode); below 2^-25 that is 0
//   NaN stays NaN (quiet), inf stays inf
AG_HD inline float round_fp16(float x) {
  const float ax = x < 0 ? -x : x;
  if (!(ax < 0x1p-14f)) {  // normal halves, overflow, inf and NaN
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x + x;  // NaN: quiet
    if ((u & 0x7fffffffu) == 0x7f800000u) return x;     // inf
    u += 0xfffu + ((u >> 13) & 1u);
    u &= 0xffffe000u;
    if ((u & 0x7fffffffu) > 0x477fe000u) u = (u & 0x80000000u) | 0x7f800000u;  // past 65504: inf
    return bits_float(u);
  }
  return rintf(x * 0x1p24f) * 0x1p-24f;
}

// The 16 bits of x, a value already rounded to the format (round_bf16, round_fp16), so the
// conversion is exact; and back to f32. bf16 is the top half of an f32. IEEE half: sign, 5
// exponent bits (bias 15), 10 mantissa bits; an f32 exponent e (bias 127) of a normal half
// becomes e - 112, and a subnormal half holds |x| / 2^-24, an integer below 1024.
AG_HD inline uint16_t bf16_bits(float rounded) { return uint16_t(float_bits(rounded) >> 16); }
AG_HD inline float bf16_value(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }
AG_HD inline uint16_t f16_bits(float rounded) {
  const uint32_t u = float_bits(rounded);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf, or NaN (quiet, the top of its payload kept)
    return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  if (a >= 0x38800000u) return uint16_t(sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));  // >= 2^-14
  return uint16_t(sign | uint32_t(bits_float(a) * 0x1p24f));  // subnormal or zero: exact multiples of 2^-24
}
AG_HD inline float f16_value(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16, e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));         // inf, NaN
  if (e == 0) return bits_float(sign | float_bits(float(m) * 0x1p-24f));    // subnormal or zero
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace ag::pw

namespace ag {

// The element types of DType::bf16 and DType::f16: 16 bits of storage, no arithmetic. A value
// is made from an f32 (rounded to nearest even) and read back as the f32 of the same value; the
// ops compute in f32 (autocast's products read 16-bit operands and sum in f32).
struct bf16 {
  uint16_t bits;
  bf16() = default;
  AG_HD explicit bf16(float x) : bits(pw::bf16_bits(pw::round_bf16(x))) {}
  AG_HD explicit operator float() const { return pw::bf16_value(bits); }
};
struct f16 {
  uint16_t bits;
  f16() = default;
  AG_HD explicit f16(float x) : bits(pw::f16_bits(pw::round_fp16(x))) {}
  AG_HD explicit operator float() const { return pw::f16_value(bits); }
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && std::is_trivially_copyable_v<bf16> &&
              std::is_trivially_copyable_v<f16>);

template <class T> inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// static_cast<To>(v) for every pair of element types, the 16-bit ones included: a 16-bit value
// converts through the f32 of its value, and a value converts to 16 bits by rounding its f32 (an
// f64 is rounded to f32 first, as torch's .to(torch.bfloat16) does). Every copy and cast kernel
// converts with this, on the CPU and the GPU alike.
template <class To, class From>
AG_HD inline To storage_cast(From v) {
  if constexpr (std::is_same_v<To, From>) return v;
  else if constexpr (is_half_v<From> && is_half_v<To>) return To(float(v));
  else if constexpr (is_half_v<From>) return static_cast<To>(float(v));
  else if constexpr (is_half_v<To>) return To(static_cast<float>(v));
  else return static_cast<To>(v);
}

}  // namespace ag
