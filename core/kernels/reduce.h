#pragma once
// Reduction kernels. The input is contiguous and seen as [outer, R, inner]: the reduced dims
// are the middle run of length R (the op front permutes/copies other layouts into this form).
// out is [outer, inner]. Results do not depend on the thread count: each output is reduced by
// one thread in a fixed order, and a full reduction (outer*inner == 1) sums fixed-size blocks.
#include <cstdint>

namespace ag::cpu {

template <class T> void sum_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner);
template <class T> void max_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner);
// index (in [0, R)) of the first maximum; NaN counts as the maximum, as in PyTorch
template <class T> void argmax_forward(int64_t* out, const T* in, int64_t outer, int64_t R, int64_t inner);

}  // namespace ag::cpu

// The same on the GPU (cuda/reduce.cu): a fixed tree order per output, no atomics, so results are
// the same run to run (they may differ from the CPU's sums by rounding).
namespace ag::cuda {

template <class T> void sum_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner);
template <class T> void max_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner);
template <class T> void argmax_forward(int64_t* out, const T* in, int64_t outer, int64_t R, int64_t inner);

}  // namespace ag::cuda
