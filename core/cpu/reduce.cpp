// Reductions on the CPU. Shapes and contracts: core/kernels/reduce.h. Math: autograd/ops.h (sum,
// max, argmax). Each output is reduced by one thread in a fixed order, and a full reduction
// (outer * inner == 1) sums fixed-size blocks: no result depends on the thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "core/kernels.h"
#include "core/parallel.h"

namespace ag::cpu {

namespace {
// Fixed block of a full reduction: the partial sums (and so the result) never depend on threads.
constexpr int64_t kReduceBlock = 16384;

template <class T>
T sum_row(const T* x, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i];
  return acc;
}
template <class T>
T max_row(const T* x, int64_t n) {
  T m = x[0];
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= x[i] != x[i];
    m = x[i] > m ? x[i] : m;
  }
  return nan ? std::numeric_limits<T>::quiet_NaN() : m;
}
}  // namespace

template <class T>
void sum_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  if (inner == 1 && outer == 1) {  // full reduction: fixed blocks, then their sum in order
    const std::vector<T> partial =
        parallel_blocks<T>(R, kReduceBlock, [&](int64_t b, int64_t e) { return sum_row(in + b, e - b); });
    T acc = 0;
    for (T p : partial) acc += p;
    *out = acc;
    return;
  }
  if (inner == 1) {  // row sums
    parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(R, 1)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) out[o] = sum_row(in + o * R, R);
    });
    return;
  }
  // column sums: out[o, :] = sum_r in[o, r, :], vectorised along inner, split over (o, inner block).
  // Rows are summed in groups of kRowGroup into `part`, then the groups into y: the rounding error
  // grows with R / kRowGroup + kRowGroup instead of R (a bias gradient sums B*T rows).
  constexpr int64_t ib = 256, kRowGroup = 64;
  const int64_t nblk = (inner + ib - 1) / ib;
  parallel_for(outer * nblk, std::max<int64_t>(1, kGrain / std::max<int64_t>(R * ib, 1)), [&](int64_t b, int64_t e) {
    T part[ib];
    for (int64_t w = b; w < e; ++w) {
      int64_t o = w / nblk, i0 = (w % nblk) * ib, n = std::min(ib, inner - i0);
      T* y = out + o * inner + i0;
      for (int64_t i = 0; i < n; ++i) y[i] = 0;
      for (int64_t r0 = 0; r0 < R; r0 += kRowGroup) {
        for (int64_t i = 0; i < n; ++i) part[i] = 0;
        for (int64_t r = r0; r < std::min(R, r0 + kRowGroup); ++r) {
          const T* x = in + (o * R + r) * inner + i0;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) part[i] += x[i];
        }
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) y[i] += part[i];
      }
    }
  });
}

template <class T>
void max_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  parallel_for(outer * inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(R, 1)), [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      int64_t o = w / inner, i = w % inner;
      if (inner == 1) {
        out[w] = max_row(in + o * R, R);
        continue;
      }
      const T* x = in + o * R * inner + i;
      T m = x[0];
      bool nan = false;
      for (int64_t r = 0; r < R; ++r) {
        T v = x[r * inner];
        nan |= v != v;
        m = v > m ? v : m;
      }
      out[w] = nan ? std::numeric_limits<T>::quiet_NaN() : m;
    }
  });
}

template <class T>
void argmax_forward(int64_t* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  parallel_for(outer * inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(R, 1)), [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      int64_t o = w / inner, i = w % inner;
      const T* x = in + o * R * inner + i;
      int64_t best = 0;
      T m = x[0];
      for (int64_t r = 1; r < R; ++r) {
        T v = x[r * inner];
        if (m != m) break;  // a NaN is the maximum
        if (v > m || v != v) m = v, best = r;
      }
      out[w] = best;
    }
  });
}

// The kernels of core/kernels/reduce.h for the dtypes listed there.
AG_INSTANTIATE_REDUCE_KERNELS

}  // namespace ag::cpu
