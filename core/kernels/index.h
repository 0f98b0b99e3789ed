#pragma once
// index_select kernels (math in autograd/ops.h, index_select).
//   x, dx (B, N, D)   idx (L) with values in [0, N)   out, dout (B, L, D)
// B is the product of the dims before the indexed one, N its size, D the product of the dims
// after it; all buffers are contiguous. The op front has checked every index.
#include <cstdint>

namespace ag::cpu {

// out[b, l, :] = x[b, idx[l], :]
template <class T>
void index_select_forward(T* out, const T* x, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D);
// dx[b, idx[l], :] += dout[b, l, :], the l in increasing order (repeated indices accumulate, and
// the sums do not depend on the thread count)
template <class T>
void index_select_backward(T* dx, const T* dout, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D);

}  // namespace ag::cpu

// The same on the GPU (cuda/index.cu); the backward sorts the indices (stably) and sums each dx row
// in increasing l, as the CPU does: no atomics, the same sums run to run.
namespace ag::cuda {

template <class T>
void index_select_forward(T* out, const T* x, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D);
template <class T>
void index_select_backward(T* dx, const T* dout, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D);

}  // namespace ag::cuda
