// Kernels of the tensor core: copies and casts, fill, arange, random numbers; and the elementwise
// engine map1/map2/map3 that runs the pointwise functors (core/kernels/pointwise.h).
//
// Shapes, the one legend of both backends (dst is contiguous unless a Layout is given for it):
//   cast_copy       dst (n) contiguous, src strided by its Layout
//   strided_copy    dst, src strided, one shape
//   fill            dst strided
//   arange          dst (n)
//   uniform/normal  dst (n); element i from Philox(seed, offset + i/4), lane i%4
//   randint         dst (n); element i from Philox(seed, offset + i/2), lanes (0,1) or (2,3)
//   map1/2/3        out (n) contiguous in the layouts' shape; a, b, c strided by la, lb, lc
//                   (already expanded to that shape: a broadcast dim has stride 0)
//
// No include guard: core/kernels.h reads this file once inside namespace ag::cpu (defined in
// core/cpu/core.cpp; the engine in core/cpu/loops.h) and once inside ag::cuda (cuda/core.cu; the
// engine in cuda/pointwise.cu), so each kernel is declared once for both backends. On the GPU,
// uniform and randint give bit-identical values to the CPU's; normal's f32 values too (its
// log/cos/sin are computed in f64, whose last-ulp differences reach the f32 result almost never),
// its f64 values agree to a few ulp.
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

// dst[i] = storage_cast<To>(src[layout element i]) (core/half.h); dst contiguous, src strided.
template <class To, class From> void cast_copy(To* dst, const From* src, const Layout& src_layout);
// dst[layout element i] = src[layout element i]; both strided with the same shape.
template <class T> void strided_copy(T* dst, const Layout& dst_layout, const T* src, const Layout& src_layout);
template <class T> void fill(T* dst, const Layout& dst_layout, T value);
template <class T> void arange(T* dst, int64_t n, double start, double step);
// Random fills of a contiguous buffer from Philox(seed, offset) (which lanes: the legend above).
template <class T> void uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double low, double high);
template <class T> void normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double std);
void randint(int64_t* dst, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high);

// ---- the elementwise engine: out = f(inputs read through their layouts), f a functor of
// core/kernels/pointwise.h. Instantiated for the (functor, dtype) pairs the op fronts use
// (autograd/ops/elementwise.cpp), listed once in core/kernels/pointwise.h, by
// core/cpu/pointwise.cpp and cuda/pointwise.cu.
template <class R, class A, class F>
void map1(R* out, const A* a, const Layout& la, F f);
template <class R, class A, class B, class F>
void map2(R* out, const A* a, const Layout& la, const B* b, const Layout& lb, F f);
template <class R, class A, class B, class C, class F>
void map3(R* out, const A* a, const Layout& la, const B* b, const Layout& lb, const C* c, const Layout& lc, F f);

// Instantiated for these dtypes by both backends: core/cpu/core.cpp and cuda/core.cu end with
// AG_INSTANTIATE_CORE_KERNELS. cast_copy (ag::storage_cast, core/half.h) and the copies for every
// dtype, the 16-bit storage ones included; arange for the numeric ones, the random fills for the
// floating ones.
#define AG_CORE_KERNELS_ANY(T)                                                                             \
  AG_INSTANTIATE(cast_copy<T, float>) AG_INSTANTIATE(cast_copy<T, double>)                                 \
  AG_INSTANTIATE(cast_copy<T, int64_t>) AG_INSTANTIATE(cast_copy<T, bool>)                                 \
  AG_INSTANTIATE(cast_copy<T, ::ag::bf16>) AG_INSTANTIATE(cast_copy<T, ::ag::f16>)                         \
  AG_INSTANTIATE(strided_copy<T>) AG_INSTANTIATE(fill<T>)
#define AG_INSTANTIATE_CORE_KERNELS                                                                      \
  AG_CORE_KERNELS_ANY(float) AG_CORE_KERNELS_ANY(double) AG_CORE_KERNELS_ANY(int64_t) AG_CORE_KERNELS_ANY(bool) \
  AG_CORE_KERNELS_ANY(::ag::bf16) AG_CORE_KERNELS_ANY(::ag::f16)                                        \
  AG_INSTANTIATE(arange<float>) AG_INSTANTIATE(arange<double>) AG_INSTANTIATE(arange<int64_t>)          \
  AG_INSTANTIATE(uniform<float>) AG_INSTANTIATE(uniform<double>)                                         \
  AG_INSTANTIATE(normal<float>) AG_INSTANTIATE(normal<double>)

#endif  // AG_KERNELS_CPU
