// index_select kernels (math in autograd/ops.h, index_select).
//
// Shapes, the one legend of both backends (core/cpu/index.cpp, cuda/index.cu):
//   x, dx (B, N, D)   idx (L) with values in [0, N)   out, dout (B, L, D)
// B is the product of the dims before the indexed one, N its size, D the product of the dims
// after it; all buffers are contiguous. The op front has checked every index.
// On the GPU (cuda/index.cu) the backward sorts the indices (stably) and sums each dx row in
// increasing l, as the CPU does: no atomics, the same sums run to run.
//
// No include guard: core/kernels.h reads this file inside namespace ag::cpu (core/cpu/index.cpp)
// and inside ag::cuda (cuda/index.cu), so each kernel is declared once for both backends.
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

// out[b, l, :] = x[b, idx[l], :]
template <class T>
void index_select_forward(T* out, const T* x, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D);
// dx[b, idx[l], :] += dout[b, l, :], the l in increasing order (repeated indices accumulate, and
// the sums do not depend on the thread count)
template <class T>
void index_select_backward(T* dx, const T* dout, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D);

// Instantiated by both backends: core/cpu/index.cpp and cuda/index.cu end with
// AG_INSTANTIATE_INDEX_KERNELS. The forward also gathers i64 values; gradients are floating.
#define AG_INSTANTIATE_INDEX_KERNELS                                                                        \
  AG_INSTANTIATE(index_select_forward<float>) AG_INSTANTIATE(index_select_forward<double>)                  \
  AG_INSTANTIATE(index_select_forward<int64_t>) AG_INSTANTIATE(index_select_backward<float>)                \
  AG_INSTANTIATE(index_select_backward<double>)

#endif  // AG_KERNELS_CPU
