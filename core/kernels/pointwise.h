#pragma once
// Pointwise functors: the per-element math of every elementwise op and of its backward, shared by
// the CPU engine (core/cpu/loops.h: map1/map2/map3) and the GPU one (cuda/pointwise.cu). The
// formulas are those of autograd/ops.h; a backward functor takes (saved values..., g) and returns dx.
// At the end: the list of (functor, dtype) pairs both engines are instantiated for.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.h"  // float_bits, round_bf16, round_fp16
#include "core/kernels.h"
#include "core/precision.h"

#if !defined(__CUDACC__)
namespace ag {
// The inline, vectorisable float forms of core/cpu/vecmath.h (exp within 1 ulp, Phi within
// 1.2e-7; faster than libmvec's calls: docs/benchmarks.md, "Memory-bound ops"), only
// declared here: the functors' bodies are compiled only where an engine is instantiated for them
// (core/cpu/pointwise.cpp, which includes vecmath.h), so an op front that merely names a functor
// never reads the CPU's math.
inline float fast_exp(float x);
inline float fast_normal_cdf(float x);
inline float fast_normal_pdf(float x);
}  // namespace ag
#endif

namespace ag::pw {

// The float functors below take the fast forms declared above on the CPU; double (the gradient
// checks) and device code use std::.
template <class T>
AG_HD inline T exp(T x) {
#if !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, float>) return fast_exp(x);
#endif
  return std::exp(x);
}
// snippet-begin: normal-cdf
// Phi(x) = (1 + erf(x / sqrt 2)) / 2, the standard normal CDF
template <class T>
AG_HD inline T normal_cdf(T x) {
#if !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, float>) return fast_normal_cdf(x);
#endif
  return T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
}
// phi(x) = e^(-x^2/2) / sqrt(2 pi), the standard normal density
template <class T>
AG_HD inline T normal_pdf(T x) {
#if !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, float>) return fast_normal_pdf(x);
#endif
  return std::exp(T(-0.5) * x * x) * T(0.3989422804014327);  // 1/sqrt(2 pi)
}
// snippet-end: normal-cdf

// ---- binary arithmetic --------------------------------------------------------------------
struct Add { template <class T> AG_HD T operator()(T a, T b) const { return a + b; } };
struct Sub { template <class T> AG_HD T operator()(T a, T b) const { return a - b; } };
struct Mul { template <class T> AG_HD T operator()(T a, T b) const { return a * b; } };
struct Div { template <class T> AG_HD T operator()(T a, T b) const { return a / b; } };
// div's gradient of b (autograd/ops.h, div)
struct DivBackwardB { template <class T> AG_HD T operator()(T a, T b, T g) const { return -g * a / (b * b); } };
// in-place updates: x + alpha * o, x * v
struct AddScaled {
  double alpha;
  template <class T> AG_HD T operator()(T x, T o) const { return x + T(alpha) * o; }
};
struct Scale {
  double v;
  template <class T> AG_HD T operator()(T x) const { return x * T(v); }
};
struct Neg { template <class T> AG_HD T operator()(T x) const { return -x; } };

// ---- pow ----------------------------------------------------------------------------------
struct PowScalar {
  double p;
  template <class T> AG_HD T operator()(T x) const { return std::pow(x, T(p)); }
};
// pow(x, p)'s gradient (autograd/ops.h, pow)
struct PowScalarBackward {
  double p;
  template <class T> AG_HD T operator()(T x, T g) const { return p == 0 ? T(0) : g * T(p) * std::pow(x, T(p - 1)); }
};
struct Pow { template <class T> AG_HD T operator()(T x, T t) const { return std::pow(x, t); } };
// pow(x, t)'s gradient of x
struct PowBackwardX {
  template <class T> AG_HD T operator()(T x, T t, T g) const { return t == 0 ? T(0) : g * t * std::pow(x, t - 1); }
};
// pow(x, t)'s gradient of t: 0 where x == 0 (and t >= 0), as PyTorch
struct PowBackwardT {
  template <class T> AG_HD T operator()(T x, T t, T g) const {
    return (x == 0 && t >= 0) ? T(0) : g * std::pow(x, t) * std::log(x);
  }
};

// ---- unary --------------------------------------------------------------------------------
struct Exp { template <class T> AG_HD T operator()(T x) const { return pw::exp(x); } };
struct Log { template <class T> AG_HD T operator()(T x) const { return std::log(x); } };
struct Sqrt { template <class T> AG_HD T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <class T> AG_HD T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Tanh { template <class T> AG_HD T operator()(T x) const { return std::tanh(x); } };
struct Sigmoid { template <class T> AG_HD T operator()(T x) const { return T(1) / (T(1) + pw::exp(-x)); } };
struct Relu { template <class T> AG_HD T operator()(T x) const { return x < T(0) ? T(0) : x; } };  // NaN stays NaN
struct Abs { template <class T> AG_HD T operator()(T x) const { return x < T(0) ? -x : x; } };

// backward functors, (saved, g) -> dx
struct ExpBackward { template <class T> AG_HD T operator()(T y, T g) const { return g * y; } };       // y = e^x
struct LogBackward { template <class T> AG_HD T operator()(T x, T g) const { return g / x; } };
struct SqrtBackward { template <class T> AG_HD T operator()(T y, T g) const { return g / (T(2) * y); } };
struct RsqrtBackward { template <class T> AG_HD T operator()(T y, T g) const { return T(-0.5) * g * y * y * y; } };
struct TanhBackward { template <class T> AG_HD T operator()(T y, T g) const { return g * (T(1) - y * y); } };
struct SigmoidBackward { template <class T> AG_HD T operator()(T y, T g) const { return g * y * (T(1) - y); } };
struct ReluBackward { template <class T> AG_HD T operator()(T x, T g) const { return x > T(0) ? g : T(0); } };
struct AbsBackward {
  template <class T> AG_HD T operator()(T x, T g) const { return x > T(0) ? g : (x < T(0) ? -g : T(0)); }
};

// snippet-begin: gelu
// gelu, exact: x * Phi(x)
struct Gelu { template <class T> AG_HD T operator()(T x) const { return x * normal_cdf(x); } };
// Phi(x) + x phi(x)
struct GeluBackward {
  template <class T> AG_HD T operator()(T x, T g) const { return g * (normal_cdf(x) + x * normal_pdf(x)); }
};
// snippet-end: gelu
// snippet-begin: gelu-tanh
// gelu, tanh approximation
struct GeluTanh {
  template <class T> AG_HD T operator()(T x) const {
    T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);  // sqrt(2/pi) (x + 0.044715 x^3)
    return T(0.5) * x * (T(1) + std::tanh(u));
  }
};
struct GeluTanhBackward {
  template <class T> AG_HD T operator()(T x, T g) const {
    T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
    T t = std::tanh(u);
    T du = T(0.7978845608028654) * (T(1) + T(3 * 0.044715) * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};
// snippet-end: gelu-tanh
struct Silu { template <class T> AG_HD T operator()(T x) const { return x / (T(1) + pw::exp(-x)); } };
// silu's gradient (autograd/ops.h, silu)
struct SiluBackward {
  template <class T> AG_HD T operator()(T x, T g) const {
    T s = T(1) / (T(1) + pw::exp(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};

struct Clamp {
  double lo, hi;
  template <class T> AG_HD T operator()(T x) const { return x < T(lo) ? T(lo) : (x > T(hi) ? T(hi) : x); }
};
struct ClampBackward {
  double lo, hi;
  template <class T> AG_HD T operator()(T x, T g) const { return (x >= T(lo) && x <= T(hi)) ? g : T(0); }
};

struct Maximum { template <class T> AG_HD T operator()(T a, T b) const { return (a > b || a != a) ? a : b; } };
struct Minimum { template <class T> AG_HD T operator()(T a, T b) const { return (a < b || a != a) ? a : b; } };
// share of g that goes to a in max(a, b): 1 if a wins, 1/2 on a tie, else 0 (mirror for min)
struct MaximumBackwardA {
  template <class T> AG_HD T operator()(T a, T b, T g) const { return a > b ? g : (a == b ? g / T(2) : T(0)); }
};
struct MinimumBackwardA {
  template <class T> AG_HD T operator()(T a, T b, T g) const { return a < b ? g : (a == b ? g / T(2) : T(0)); }
};

// ---- bf16 and fp16 rounding (autocast, autograd/autocast.h): the rules are in core/half.h -----
struct RoundBf16 { AG_HD float operator()(float x) const { return round_bf16(x); } };
struct RoundFp16 { AG_HD float operator()(float x) const { return round_fp16(x); } };

// An f32 operand as autocast reads it (core/precision.h): as it is, or rounded to bf16 or fp16.
AG_HD inline float round_operand(float x, Precision p) {
  return p == Precision::bf16 ? round_bf16(x) : p == Precision::fp16 ? round_fp16(x) : x;
}

// ---- comparisons and selection --------------------------------------------------------------
struct Eq { template <class T> AG_HD bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <class T> AG_HD bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <class T> AG_HD bool operator()(T a, T b) const { return a < b; } };
struct Le { template <class T> AG_HD bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <class T> AG_HD bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <class T> AG_HD bool operator()(T a, T b) const { return a >= b; } };
struct Where { template <class T> AG_HD T operator()(bool c, T a, T b) const { return c ? a : b; } };

}  // namespace ag::pw

// ---- the instantiation list: every (functor, dtype) of the op fronts (autograd/ops/elementwise.cpp)
// map_float1/2/3 (f32, f64), map_numeric2, neg, add_ and mul_ (f32, f64, i64), compare and where
// (every dtype), the 16-bit rounding of autocast (f32). core/cpu/pointwise.cpp and
// cuda/pointwise.cu end with AG_INSTANTIATE_POINTWISE_KERNELS; an op that pairs a functor with a
// new dtype adds one line here. The engine templates are declared in core/kernels/core.h.
#define AG_PW_MAP1(T, F) AG_INSTANTIATE(map1<T, T, pw::F>)        // T -> T
#define AG_PW_MAP2(T, F) AG_INSTANTIATE(map2<T, T, T, pw::F>)     // T, T -> T
#define AG_PW_MAP3(T, F) AG_INSTANTIATE(map3<T, T, T, T, pw::F>)  // T, T, T -> T
#define AG_PW_COMPARE(T, F) AG_INSTANTIATE(map2<bool, T, T, pw::F>)
#define AG_PW_WHERE(T) AG_INSTANTIATE(map3<T, bool, T, T, pw::Where>)
#define AG_PW_FLOATING(T)                                                                                       \
  AG_PW_MAP1(T, PowScalar) AG_PW_MAP1(T, Exp) AG_PW_MAP1(T, Log) AG_PW_MAP1(T, Sqrt) AG_PW_MAP1(T, Rsqrt)       \
  AG_PW_MAP1(T, Tanh) AG_PW_MAP1(T, Sigmoid) AG_PW_MAP1(T, Relu) AG_PW_MAP1(T, Abs) AG_PW_MAP1(T, Silu)         \
  AG_PW_MAP1(T, Gelu) AG_PW_MAP1(T, GeluTanh) AG_PW_MAP1(T, Clamp)                                              \
  AG_PW_MAP2(T, ExpBackward) AG_PW_MAP2(T, LogBackward) AG_PW_MAP2(T, SqrtBackward) AG_PW_MAP2(T, RsqrtBackward) \
  AG_PW_MAP2(T, TanhBackward) AG_PW_MAP2(T, SigmoidBackward) AG_PW_MAP2(T, ReluBackward)                        \
  AG_PW_MAP2(T, AbsBackward) AG_PW_MAP2(T, SiluBackward) AG_PW_MAP2(T, GeluBackward)                            \
  AG_PW_MAP2(T, GeluTanhBackward) AG_PW_MAP2(T, ClampBackward) AG_PW_MAP2(T, PowScalarBackward)                 \
  AG_PW_MAP2(T, Div) AG_PW_MAP2(T, Pow) AG_PW_MAP2(T, Maximum) AG_PW_MAP2(T, Minimum)                           \
  AG_PW_MAP3(T, DivBackwardB) AG_PW_MAP3(T, PowBackwardX) AG_PW_MAP3(T, PowBackwardT)                           \
  AG_PW_MAP3(T, MaximumBackwardA) AG_PW_MAP3(T, MinimumBackwardA)
#define AG_PW_NUMERIC(T)                                                                                   \
  AG_PW_MAP1(T, Neg) AG_PW_MAP1(T, Scale) AG_PW_MAP2(T, Add) AG_PW_MAP2(T, Sub) AG_PW_MAP2(T, Mul)         \
  AG_PW_MAP2(T, AddScaled)
#define AG_PW_ANY(T)                                                                                        \
  AG_PW_COMPARE(T, Eq) AG_PW_COMPARE(T, Ne) AG_PW_COMPARE(T, Lt) AG_PW_COMPARE(T, Le) AG_PW_COMPARE(T, Gt) \
  AG_PW_COMPARE(T, Ge) AG_PW_WHERE(T)
#define AG_INSTANTIATE_POINTWISE_KERNELS                                                                   \
  AG_PW_FLOATING(float) AG_PW_FLOATING(double)                                                             \
  AG_PW_MAP1(float, RoundBf16) AG_PW_MAP1(float, RoundFp16)                                                \
  AG_PW_NUMERIC(float) AG_PW_NUMERIC(double) AG_PW_NUMERIC(int64_t)                                        \
  AG_PW_ANY(float) AG_PW_ANY(double) AG_PW_ANY(int64_t) AG_PW_ANY(bool)
