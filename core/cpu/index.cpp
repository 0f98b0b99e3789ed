// index_select on the CPU. Shapes and contracts: core/kernels/index.h. Math: autograd/ops.h
// (index_select).
#include <algorithm>
#include <cassert>

#include "core/kernels.h"
#include "core/parallel.h"

namespace ag::cpu {

template <class T>
void index_select_forward(T* out, const T* x, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D) {
  // one output row (b, l) per work item: a contiguous copy of D values
  parallel_for(B * L, std::max<int64_t>(1, kGrain / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L, l = r % L, i = idx[l];
      assert(i >= 0 && i < N);
      const T* src = x + (b * N + i) * D;
      T* dst = out + r * D;
#pragma omp simd
      for (int64_t k = 0; k < D; ++k) dst[k] = src[k];
    }
  });
}

template <class T>
void index_select_backward(T* dx, const T* dout, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D) {
  // Two l with the same index write the same dx row, so threads split over (b, block of k), never
  // over l: each dx element is summed by one thread, in increasing l, whatever the thread count.
  const int64_t kb = 256, nblk = (D + kb - 1) / kb;
  parallel_for(B * nblk, std::max<int64_t>(1, kGrain / std::max<int64_t>(L * kb, 1)), [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / nblk, k0 = (w % nblk) * kb, n = std::min(kb, D - k0);
      for (int64_t l = 0; l < L; ++l) {
        const int64_t i = idx[l];
        assert(i >= 0 && i < N);
        T* d = dx + (b * N + i) * D + k0;
        const T* g = dout + (b * L + l) * D + k0;
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) d[k] += g[k];
      }
    }
  });
}

// The kernels of core/kernels/index.h for the dtypes listed there.
AG_INSTANTIATE_INDEX_KERNELS

}  // namespace ag::cpu
