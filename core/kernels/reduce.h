// Reduction kernels (math in autograd/ops.h: sum, max, argmax).
//
// Shapes, the one legend of both backends (core/cpu/reduce.cpp, cuda/reduce.cu):
//   in (outer, R, inner) contiguous   out (outer, inner)
// The reduced dims are the middle run of length R (the op front permutes/copies other layouts
// into this form). Each backend sums in an order fixed by the shapes, so its results are the same
// run to run and at any thread count; the two backends' sums may differ by rounding.
//
// No include guard: core/kernels.h reads this file inside namespace ag::cpu (core/cpu/reduce.cpp)
// and inside ag::cuda (cuda/reduce.cu), so each kernel is declared once for both backends.
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

template <class T> void sum_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner);
template <class T> void max_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner);
// index (in [0, R)) of the first maximum; NaN counts as the maximum, as in PyTorch
template <class T> void argmax_forward(int64_t* out, const T* in, int64_t outer, int64_t R, int64_t inner);

// Instantiated for f32, f64 and i64 by both backends: core/cpu/reduce.cpp and cuda/reduce.cu end
// with AG_INSTANTIATE_REDUCE_KERNELS.
#define AG_REDUCE_KERNELS(T) \
  AG_INSTANTIATE(sum_forward<T>) AG_INSTANTIATE(max_forward<T>) AG_INSTANTIATE(argmax_forward<T>)
#define AG_INSTANTIATE_REDUCE_KERNELS AG_REDUCE_KERNELS(float) AG_REDUCE_KERNELS(double) AG_REDUCE_KERNELS(int64_t)

#endif  // AG_KERNELS_CPU
