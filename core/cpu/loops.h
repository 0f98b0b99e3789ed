#pragma once
// The CPU elementwise engine: out[i] = f(a[i], b[i], ...) over strided inputs, contiguous output.
// Inputs come already expanded to the output's shape (broadcast dims have stride 0).
//
//  1. all inputs contiguous: one flat loop the compiler vectorises, split across threads on
//     multiples of kVecBlock elements (parallel_for_elements), so the split never moves which
//     elements the vector loop computes and so never changes a result;
//  2. otherwise dims are coalesced (merged where every operand is contiguous across them) into the
//     loop plan that the GPU engine walks too (core/kernels/loop_plan.h, make_plan), and the loop
//     walks rows of the plan's innermost dim, with vectorised fast paths when an input's inner
//     stride is 1 (contiguous) or 0 (a broadcast value).
#include <cstdint>

#include "core/kernels.h"
#include "core/kernels/loop_plan.h"
#include "core/parallel.h"

namespace ag::cpu {

// Calls row(out_offset, in_offsets[N], len, inner_strides[N]) for every row of the innermost
// dim; rows are split across threads, or the single row is when there is only one.
template <int N, class Row>
void for_each_row(const LoopPlan<N>& p, Row&& row) {
  for (int d = 0; d < p.nd; ++d)
    if (p.size[d] == 0) return;  // no elements (and no division by a zero row length below)
  const int last = p.nd - 1;
  const int64_t inner = p.size[last];
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= p.size[d];
  int64_t inner_stride[N];
  for (int k = 0; k < N; ++k) inner_stride[k] = p.stride[k][last];
  if (rows == 1) {  // chunk bounds on kVecBlock multiples: see parallel_for_elements
    parallel_for_elements(inner, kGrain, [&](int64_t b, int64_t e) {
      int64_t off[N];
      for (int k = 0; k < N; ++k) off[k] = b * inner_stride[k];
      row(b, off, e - b, inner_stride);
    });
    return;
  }
  parallel_for(rows, (kGrain + inner - 1) / inner, [&](int64_t rb, int64_t re) {
    int64_t idx[kLayoutMaxDims];  // multi-index of row rb over dims [0, last)
    int64_t off[N] = {};
    int64_t r = rb;
    for (int d = last - 1; d >= 0; --d) {
      idx[d] = r % p.size[d];
      r /= p.size[d];
      for (int k = 0; k < N; ++k) off[k] += idx[d] * p.stride[k][d];
    }
    for (int64_t i = rb; i < re; ++i) {
      row(i * inner, off, inner, inner_stride);
      for (int d = last - 1; d >= 0; --d) {  // odometer increment
        for (int k = 0; k < N; ++k) off[k] += p.stride[k][d];
        if (++idx[d] < p.size[d]) break;
        for (int k = 0; k < N; ++k) off[k] -= p.size[d] * p.stride[k][d];
        idx[d] = 0;
      }
    }
  });
}

// out = f(a)
template <class R, class A, class F>
void map1(R* out, const A* a, const Layout& la, F f) {
  if (la.is_contiguous()) {
    parallel_for_elements(la.numel(), kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) out[i] = f(a[i]);
    });
    return;
  }
  const Layout* const in[1] = {&la};
  for_each_row(make_plan<1>(in), [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    R* y = out + o;
    const A* x = a + off[0];
    const int64_t s = st[0];
    if (s == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = f(x[i * s]);
    }
  });
}

// out = f(a, b)
template <class R, class A, class B, class F>
void map2(R* out, const A* a, const Layout& la, const B* b, const Layout& lb, F f) {
  if (la.is_contiguous() && lb.is_contiguous()) {
    parallel_for_elements(la.numel(), kGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) out[i] = f(a[i], b[i]);
    });
    return;
  }
  const Layout* const in[2] = {&la, &lb};
  for_each_row(make_plan<2>(in), [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    R* y = out + o;
    const A* x0 = a + off[0];
    const B* x1 = b + off[1];
    if (st[0] == 1 && st[1] == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i], x1[i]);
    } else if (st[0] == 1 && st[1] == 0) {
      const B v = x1[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i], v);
    } else if (st[0] == 0 && st[1] == 1) {
      const A v = x0[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = f(v, x1[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i * st[0]], x1[i * st[1]]);
    }
  });
}

// out = f(a, b, c)
template <class R, class A, class B, class C, class F>
void map3(R* out, const A* a, const Layout& la, const B* b, const Layout& lb, const C* c,
          const Layout& lc, F f) {
  if (la.is_contiguous() && lb.is_contiguous() && lc.is_contiguous()) {
    parallel_for_elements(la.numel(), kGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) out[i] = f(a[i], b[i], c[i]);
    });
    return;
  }
  const Layout* const in[3] = {&la, &lb, &lc};
  for_each_row(make_plan<3>(in), [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    R* y = out + o;
    const A* x0 = a + off[0];
    const B* x1 = b + off[1];
    const C* x2 = c + off[2];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i], x1[i], x2[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i * st[0]], x1[i * st[1]], x2[i * st[2]]);
    }
  });
}

}  // namespace ag::cpu
