#pragma once
// The strided walk of the GPU elementwise kernels (cuda/pointwise.cu, cuda/core.cu): one thread per
// element of the output, which is contiguous in the layouts' shape, reading each operand through
// its layout (stride 0 = a broadcast dim).
//
// The host first coalesces the dims, as the CPU engine does (core/cpu/loops.h, make_plan): dims of
// size 1 are dropped and neighbours merged where every operand is contiguous across them, so a
// contiguous operand set becomes one dim and costs no division per element; a transposed or
// broadcast one keeps only the dims it must.
#include <cstdint>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace ag::cuda {

template <int N>
struct Plan {
  int nd = 0;
  int64_t n = 0;  // elements
  int64_t size[kLayoutMaxDims];
  int64_t stride[N][kLayoutMaxDims];
};

template <int N>
Plan<N> make_plan(const Layout* const (&in)[N]) {
  const Layout& l0 = *in[0];
  Plan<N> p;
  p.n = l0.numel();
  for (int d = 0; d < l0.ndim; ++d) {
    const int64_t s = l0.shape[d];
    if (s == 1) continue;
    if (p.nd > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge &= p.stride[k][p.nd - 1] == in[k]->strides[d] * s;
      if (merge) {
        p.size[p.nd - 1] *= s;
        for (int k = 0; k < N; ++k) p.stride[k][p.nd - 1] = in[k]->strides[d];
        continue;
      }
    }
    p.size[p.nd] = s;
    for (int k = 0; k < N; ++k) p.stride[k][p.nd] = in[k]->strides[d];
    p.nd++;
  }
  if (p.nd == 0) {  // a scalar, or every dim of size 1
    p.nd = 1;
    p.size[0] = 1;
    for (int k = 0; k < N; ++k) p.stride[k][0] = 0;
  }
  return p;
}

// off[k] = element offset of operand k for the row-major output index i
template <int N>
__device__ inline void plan_offsets(const Plan<N>& p, int64_t i, int64_t (&off)[N]) {
  if (p.nd == 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i * p.stride[k][0];
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = p.nd - 1; d >= 0; --d) {
    const int64_t s = p.size[d], r = i % s;
    i /= s;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += r * p.stride[k][d];
  }
}

}  // namespace ag::cuda
