#pragma once
// The loop plan of the elementwise engine: how the strided operands of an elementwise op are walked.
// One function builds it for both engines, the CPU's (core/cpu/loops.h, which walks it row by row)
// and the GPU's (cuda/loops.cuh, one thread per element), so they visit the same elements in the
// same places.
//
//   The output is contiguous with shape (s_0, ..., s_{n-1}); operand k is read through its layout,
//   element (i_0, ..., i_{n-1}) at  sum_d i_d t_kd  (t_kd its strides; t = 0 on a broadcast dim).
//   The plan keeps the same walk in as few dims as possible:
//     - a dim of size 1 is dropped (its index is always 0);
//     - dim d is merged into the kept dim c before it when, for EVERY operand k,
//           t_kc = t_kd s_d
//       (stepping c once is stepping d s_d times): the two become one dim of size s_c s_d and
//       strides t_kd. A contiguous operand set collapses to one dim; a transposed or broadcast
//       operand keeps only the dims it must.
//     - no dim left (a scalar, or every dim of size 1): one dim of size 1, strides 0.
//   Element i of the output (row-major) then reads operand k at plan_offsets(p, i)[k]: i written
//   in the mixed radix of the plan's sizes, times the strides.
//
// Plain C++17 and AG_HD: nvcc compiles this header for the device, g++ for the host.
#include <cstdint>

#include "core/kernels.h"

namespace ag {

template <int N>
struct LoopPlan {
  int nd = 0;
  int64_t n = 0;  // elements
  int64_t size[kLayoutMaxDims];
  int64_t stride[N][kLayoutMaxDims];  // stride[k][d]: operand k along plan dim d
};

// The plan for N operands of one shape (in[0]'s: the others have been expanded to it).
template <int N>
AG_HD inline LoopPlan<N> make_plan(const Layout* const (&in)[N]) {
  const Layout& l0 = *in[0];
  LoopPlan<N> p;
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

// off[k] = the element offset of operand k for the row-major output index i.
template <int N>
AG_HD inline void plan_offsets(const LoopPlan<N>& p, int64_t i, int64_t (&off)[N]) {
  if (p.nd == 1) {  // the common case (contiguous, or one broadcast/strided dim): no division
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int k = 0; k < N; ++k) off[k] = i * p.stride[k][0];
    return;
  }
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = p.nd - 1; d >= 0; --d) {
    const int64_t s = p.size[d], r = i % s;
    i /= s;
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int k = 0; k < N; ++k) off[k] += r * p.stride[k][d];
  }
}

}  // namespace ag
