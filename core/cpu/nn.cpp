// CPU kernels of the normalisation & loss ops. Shapes and contracts: core/kernels/nn.h. Math:
// autograd/ops.h, under each op's name.
//
// Every kernel splits its rows over parallel_for; each output element is computed by one thread in
// a fixed order, and the one cross-row sum (layer_norm's dw, db) adds fixed blocks of rows in a
// fixed order, so no result depends on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/vecmath.h"  // vexp: inline fast_exp for float (1 ulp), std::exp for double
#include "core/kernels.h"
#include "core/kernels/dropout_mask.h"
#include "core/parallel.h"

namespace ag::cpu {

namespace {

// Rows per parallel_for chunk so that a chunk holds about kGrain elements.
int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(row_len, 1)); }

// max over a row. NaN is skipped here, but it still turns the whole row to NaN through exp below,
// as in PyTorch. A row of -inf gives m = -inf and then x - m = NaN: softmax of an all -inf row
// is NaN, exactly as PyTorch's.
template <class T>
T row_max(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Columns handled together by the [outer, C, inner] kernels (inner > 1): the loops over C run
// along these contiguous columns, so they vectorise like the row case. 128: fewer columns make
// more strided jumps per element, more let the block's passes fall out of L2
// (docs/benchmarks.md, "Memory-bound ops").
constexpr int64_t kCols = 128;

// Calls body(off, n) for every block of n <= kCols columns of every outer slice o, where off is
// the offset of element (o, 0, i0) and consecutive c are `inner` apart.
template <class Body>
void for_each_column_block(int64_t outer, int64_t C, int64_t inner, Body&& body) {
  const int64_t nblk = (inner + kCols - 1) / kCols;
  parallel_for(outer * nblk, row_grain(C * kCols), [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      int64_t o = w / nblk, i0 = (w % nblk) * kCols;
      body(o * C * inner + i0, std::min(kCols, inner - i0));
    }
  });
}

// m[i] = max over c of x[c * inner + i] for the n columns of one block (see above).
template <class T>
void column_block_max(T* m, const T* x, int64_t C, int64_t inner, int64_t n) {
  for (int64_t i = 0; i < n; ++i) m[i] = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < C; ++c) {
    const T* xc = x + c * inner;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) m[i] = xc[i] > m[i] ? xc[i] : m[i];
  }
}

}  // namespace

// ============================== softmax / log_softmax ==========================================
// Forward, per row of C (three passes over a row that sits in L1, so memory sees one read of x
// and one write of y):  m = max x;  e_c = exp(x_c - m), s = sum e_c;  y_c = e_c / s.
template <class T>
void softmax_forward(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  if (inner == 1) {
    parallel_for(outer, row_grain(C), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = x + r * C;
        T* yr = y + r * C;
        const T m = row_max(xr, C);
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; ++c) {
          T ex = vexp(xr[c] - m);
          yr[c] = ex;
          s += ex;
        }
        const T inv = T(1) / s;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] *= inv;
      }
    });
    return;
  }
  // softmax over a middle dim: the same three passes, each vectorised along the inner columns
  for_each_column_block(outer, C, inner, [&](int64_t off, int64_t n) {
    T m[kCols], s[kCols] = {};
    column_block_max(m, x + off, C, inner, n);
    for (int64_t c = 0; c < C; ++c) {
      const T* xc = x + off + c * inner;
      T* yc = y + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        yc[i] = vexp(xc[i] - m[i]);
        s[i] += yc[i];
      }
    }
    for (int64_t i = 0; i < n; ++i) s[i] = T(1) / s[i];
    for (int64_t c = 0; c < C; ++c) {
      T* yc = y + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yc[i] *= s[i];
    }
  });
}

// Backward (math: autograd/ops.h, softmax): two passes over a row in L1, the dot sum_i g_i y_i,
// then dx += y (g - dot).
template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner) {
  if (inner == 1) {
    parallel_for(outer, row_grain(C), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T *gr = dy + r * C, *yr = y + r * C;
        T* dr = dx + r * C;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; ++c) dot += gr[c] * yr[c];
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dr[c] += yr[c] * (gr[c] - dot);
      }
    });
    return;
  }
  for_each_column_block(outer, C, inner, [&](int64_t off, int64_t n) {
    T dot[kCols] = {};
    for (int64_t c = 0; c < C; ++c) {
      const T *gc = dy + off + c * inner, *yc = y + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dot[i] += gc[i] * yc[i];
    }
    for (int64_t c = 0; c < C; ++c) {
      const T *gc = dy + off + c * inner, *yc = y + off + c * inner;
      T* dc = dx + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dc[i] += yc[i] * (gc[i] - dot[i]);
    }
  });
}

// log_softmax forward: y_c = (x_c - m) - log sum_j e^(x_j - m). Two passes over x (in L1).
template <class T>
void log_softmax_forward(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  if (inner == 1) {
    parallel_for(outer, row_grain(C), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = x + r * C;
        T* yr = y + r * C;
        const T m = row_max(xr, C);
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; ++c) s += vexp(xr[c] - m);
        const T log_s = std::log(s);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) - log_s;
      }
    });
    return;
  }
  for_each_column_block(outer, C, inner, [&](int64_t off, int64_t n) {
    T m[kCols], s[kCols] = {};
    column_block_max(m, x + off, C, inner, n);
    for (int64_t c = 0; c < C; ++c) {
      const T* xc = x + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) s[i] += vexp(xc[i] - m[i]);
    }
    for (int64_t i = 0; i < n; ++i) s[i] = std::log(s[i]);
    for (int64_t c = 0; c < C; ++c) {
      const T* xc = x + off + c * inner;
      T* yc = y + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yc[i] = (xc[i] - m[i]) - s[i];
    }
  });
}

// Backward (math: autograd/ops.h, log_softmax): two passes over a row in L1, the sum of g, then
// dx += g - e^y sum.
template <class T>
void log_softmax_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner) {
  if (inner == 1) {
    parallel_for(outer, row_grain(C), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T *gr = dy + r * C, *yr = y + r * C;
        T* dr = dx + r * C;
        T gs = 0;
#pragma omp simd reduction(+ : gs)
        for (int64_t c = 0; c < C; ++c) gs += gr[c];
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dr[c] += gr[c] - vexp(yr[c]) * gs;
      }
    });
    return;
  }
  for_each_column_block(outer, C, inner, [&](int64_t off, int64_t n) {
    T gs[kCols] = {};
    for (int64_t c = 0; c < C; ++c) {
      const T* gc = dy + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) gs[i] += gc[i];
    }
    for (int64_t c = 0; c < C; ++c) {
      const T *gc = dy + off + c * inner, *yc = y + off + c * inner;
      T* dc = dx + off + c * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dc[i] += gc[i] - vexp(yc[i]) * gs[i];
    }
  });
}

// The reference: one element at a time, straight from the formulas of autograd/ops.h.
// snippet-begin: softmax-forward-naive
template <class T>
void softmax_forward_naive(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const T* xr = x + o * C * inner + i;
      T* yr = y + o * C * inner + i;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c * inner]);
      T s = 0;
      for (int64_t c = 0; c < C; ++c) s += std::exp(xr[c * inner] - m);
      for (int64_t c = 0; c < C; ++c) yr[c * inner] = std::exp(xr[c * inner] - m) / s;
    }
}
// snippet-end: softmax-forward-naive

// snippet-begin: softmax-backward-naive
template <class T>
void softmax_backward_naive(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * C * inner + i;
      T dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += dy[base + c * inner] * y[base + c * inner];
      for (int64_t c = 0; c < C; ++c) dx[base + c * inner] += y[base + c * inner] * (dy[base + c * inner] - dot);
    }
}
// snippet-end: softmax-backward-naive

// =================================== layer_norm ===============================================
// Both kernels are written so that memory, not arithmetic, sets their speed: a row of N = 1024
// floats (4 KB) is read from memory ONCE, by the first loop over it, and the later loops run over
// it while it sits in L1. What keeps those loops cheap:
//   - sums use kLanes independent lanes (lane_sum, fold_lanes), not `omp simd reduction`, whose
//     single vector accumulator makes each add wait for the one before (and whose 16 lanes GCC
//     then adds one by one);
//   - the moments take one pass of shifted sums (row_moments), with the exact two-pass variance
//     as the fallback when the shift is poor;
//   - backward: the two row sums and the dw, db partials share the loop that reads g and x, and
//     dx is written (=) rather than added into a zero-filled buffer (a full write + read saved).
namespace {

// Lanes of independent partial sums: four AVX-512 registers' worth (64 floats, 32 doubles). With
// one accumulator every add waits for the one before it; with four registers four adds are in
// flight at once and the loads, not the add latency, set the pace. Lane j sums elements j,
// j + kLanes, j + 2 kLanes, ..., so the order of the additions depends on N alone (never on the
// thread count); it differs from a left-to-right sum only by rounding.
template <class T>
constexpr int64_t kLanes = 4 * 64 / int64_t(sizeof(T));

// acc[0] + ... + acc[kLanes - 1], by halves (32 + 32, then 16 + 16, ...): log2(kLanes) vector
// adds instead of kLanes dependent scalar ones. The unroll makes every trip count a constant, so
// each step is one full-width vector add with no loop or remainder code around it.
template <class T>
T fold_lanes(T* acc) {
#pragma GCC unroll 8
  for (int64_t h = kLanes<T> / 2; h >= 1; h /= 2)
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) acc[j] += acc[j + h];
  return acc[0];
}

// sum over i < n of term(i), in kLanes lanes (see above)
template <class T, class F>
T lane_sum(int64_t n, F term) {
  T acc[kLanes<T>] = {};
  int64_t i = 0;
  for (; i + kLanes<T> <= n; i += kLanes<T>)
#pragma omp simd
    for (int64_t j = 0; j < kLanes<T>; ++j) acc[j] += term(i + j);
  for (int64_t j = 0; i + j < n; ++j) acc[j] += term(i + j);  // the last n % kLanes
  return fold_lanes(acc);
}

// Mean and 1 / sqrt(var + eps) of one row, reading x once.
//
// For any shift k,  mean = k + d  and  var = mean((x - k)^2) - d^2,  where d = mean(x - k), so
// one pass accumulating (x - k) and (x - k)^2 gives both. In floating point the subtraction
// mean((x - k)^2) - d^2 = (var + d^2) - d^2 cancels: its relative error is about
// eps_machine (1 + d^2 / var), so k must be close to the mean. We take k = the mean of the first
// kLanes elements (the whole row when N <= kLanes, and then d is ~0), which is typically within
// std / 8 of the mean. When it is not (d^2 > var: a row whose start differs from the rest, or
// Inf/NaN), the variance is recomputed by the exact two-pass formula, mean((x - mean)^2), over
// the row still in L1; so the variance is never worse than about 2 eps_machine relative.
template <class T>
void row_moments(const T* x, int64_t N, double eps, T& mean, T& rstd) {
  constexpr int64_t L = kLanes<T>;
  const int64_t n0 = std::min(N, L);
  T first[L] = {};
  for (int64_t j = 0; j < n0; ++j) first[j] = x[j];
  const T k = fold_lanes(first) / T(n0);
  T s[L] = {}, q[L] = {};  // lanes of sum (x - k) and sum (x - k)^2
  int64_t i = 0;
  for (; i + L <= N; i += L)
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) {
      const T v = x[i + j] - k;
      s[j] += v;
      q[j] += v * v;
    }
  for (int64_t j = 0; i + j < N; ++j) {
    const T v = x[i + j] - k;
    s[j] += v;
    q[j] += v * v;
  }
  const T d = fold_lanes(s) / T(N), mu = k + d;
  T var = fold_lanes(q) / T(N) - d * d;
  if (!(d * d <= var))  // a poor shift (or NaN): the exact two-pass variance, from L1
    var = lane_sum<T>(N, [&](int64_t i) { return (x[i] - mu) * (x[i] - mu); }) / T(N);
  mean = mu;
  rstd = T(1) / std::sqrt(var + T(eps));
}

}  // namespace

// Forward, per row: mu and rstd in one pass over x (row_moments), then one loop writing
//   y = (x - mu) rstd w + b
// from the row in L1.
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t R, int64_t N, double eps) {
  parallel_for(R, row_grain(N), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const T* xr = x + r * N;
      T* yr = y + r * N;
      T mu, rs;
      row_moments(xr, N, eps, mu, rs);
      mean[r] = mu;
      rstd[r] = rs;
      // one loop per case so each vectorises without a per-element test
      if (w && b) {
#pragma omp simd
        for (int64_t i = 0; i < N; ++i) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
      } else if (w) {
#pragma omp simd
        for (int64_t i = 0; i < N; ++i) yr[i] = (xr[i] - mu) * rs * w[i];
      } else if (b) {
#pragma omp simd
        for (int64_t i = 0; i < N; ++i) yr[i] = (xr[i] - mu) * rs + b[i];
      } else {
#pragma omp simd
        for (int64_t i = 0; i < N; ++i) yr[i] = (xr[i] - mu) * rs;
      }
    }
  });
}

namespace {

// Rows per block of layer_norm's backward: at least 64K elements a block, and at most 64 blocks, so
// the partial dw, db (2 N values a block) stay small next to x. It depends only on R and N, so the
// blocks, their partial sums and the final result are the same for any thread count.
constexpr int64_t kMaxBlocks = 64;
int64_t ln_block_rows(int64_t R, int64_t N) {
  const int64_t by_size = (int64_t(1) << 16) / std::max<int64_t>(N, 1), by_count = (R + kMaxBlocks - 1) / kMaxBlocks;
  return std::max<int64_t>({int64_t(1), by_size, by_count});
}

// One row of layer_norm's backward: dx (if non-null) and this block's partial dw, db (pw, pb, if
// non-null). HasW: w given (else w = 1). HasP: pw, pb given. Math: autograd/ops.h, layer_norm.
// Two loops: the first reads g and x from memory and does everything that needs no row mean (the
// two sums, in kLanes lanes, and the dw, db partials); the second writes dx from the row in L1.
template <class T, bool HasW, bool HasP>
void layer_norm_backward_row(T* dx, T* pw, T* pb, const T* g, const T* x, const T* w, T mu, T rs, int64_t N) {
  constexpr int64_t L = kLanes<T>;
  T sa[L] = {}, sc[L] = {};  // lanes of sum dxhat and sum dxhat * xhat
  // one element of the first loop; the lambda is inlined into both loops below
  auto step = [&](int64_t i, int64_t j) {
    const T xhat = (x[i] - mu) * rs, dxhat = HasW ? g[i] * w[i] : g[i];
    sa[j] += dxhat;
    sc[j] += dxhat * xhat;
    if constexpr (HasP) {
      pw[i] += g[i] * xhat;
      pb[i] += g[i];
    }
  };
  int64_t i = 0;
  for (; i + L <= N; i += L)
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) step(i + j, j);
  for (int64_t j = 0; i + j < N; ++j) step(i + j, j);
  const T a = fold_lanes(sa) / T(N), c = fold_lanes(sc) / T(N);
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) {
    const T xhat = (x[i] - mu) * rs, dxhat = HasW ? g[i] * w[i] : g[i];
    dx[i] = rs * (dxhat - a - xhat * c);
  }
}

// dw, db only (dx not wanted): the partials alone.
template <class T>
void layer_norm_backward_row_wb(T* pw, T* pb, const T* g, const T* x, T mu, T rs, int64_t N) {
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) {
    pw[i] += g[i] * ((x[i] - mu) * rs);
    pb[i] += g[i];
  }
}

}  // namespace

// Backward: one pass over the rows computes dx and, per fixed block of rows, partial sums of dw
// and db; the partials are then added in block order (parallel over the N columns). dx is
// written, not accumulated (see core/kernels/nn.h).
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         int64_t R, int64_t N) {
  const bool want_wb = dw || db;
  if (!dx && !want_wb) return;
  const int64_t rows_per_block = ln_block_rows(R, N), nblk = (R + rows_per_block - 1) / rows_per_block;
  std::vector<T> partial(want_wb ? size_t(2 * nblk * N) : 0, T(0));  // [nblk][pw (N), pb (N)]
  parallel_for(nblk, 1, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      T* pw = want_wb ? partial.data() + 2 * k * N : nullptr;
      T* pb = want_wb ? pw + N : nullptr;
      for (int64_t r = k * rows_per_block; r < std::min(R, (k + 1) * rows_per_block); ++r) {
        const T *g = dy + r * N, *xr = x + r * N;
        T* dxr = dx ? dx + r * N : nullptr;
        if (!dx)
          layer_norm_backward_row_wb(pw, pb, g, xr, mean[r], rstd[r], N);
        else if (w && want_wb)
          layer_norm_backward_row<T, true, true>(dxr, pw, pb, g, xr, w, mean[r], rstd[r], N);
        else if (w)
          layer_norm_backward_row<T, true, false>(dxr, pw, pb, g, xr, w, mean[r], rstd[r], N);
        else if (want_wb)
          layer_norm_backward_row<T, false, true>(dxr, pw, pb, g, xr, w, mean[r], rstd[r], N);
        else
          layer_norm_backward_row<T, false, false>(dxr, pw, pb, g, xr, w, mean[r], rstd[r], N);
      }
    }
  });
  if (!want_wb) return;
  parallel_for(N, 1024, [&](int64_t jb, int64_t je) {
    for (int64_t k = 0; k < nblk; ++k) {
      const T *pw = partial.data() + 2 * k * N, *pb = pw + N;
      if (dw)
#pragma omp simd
        for (int64_t j = jb; j < je; ++j) dw[j] += pw[j];
      if (db)
#pragma omp simd
        for (int64_t j = jb; j < je; ++j) db[j] += pb[j];
    }
  });
}

// snippet-begin: layer-norm-forward-naive
template <class T>
void layer_norm_forward_naive(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t R, int64_t N,
                              double eps) {
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * N;
    T mu = 0;
    for (int64_t i = 0; i < N; ++i) mu += xr[i];
    mu /= T(N);
    T var = 0;
    for (int64_t i = 0; i < N; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    var /= T(N);
    const T rs = T(1) / std::sqrt(var + T(eps));
    for (int64_t i = 0; i < N; ++i) {
      T xhat = (xr[i] - mu) * rs;
      y[r * N + i] = xhat * (w ? w[i] : T(1)) + (b ? b[i] : T(0));
    }
    mean[r] = mu;
    rstd[r] = rs;
  }
}
// snippet-end: layer-norm-forward-naive

// snippet-begin: layer-norm-backward-naive
template <class T>
void layer_norm_backward_naive(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                               int64_t R, int64_t N) {
  for (int64_t r = 0; r < R; ++r) {
    const T *g = dy + r * N, *xr = x + r * N;
    const T mu = mean[r], rs = rstd[r];
    T dxhat_mean = 0, dxhat_xhat_mean = 0;
    for (int64_t i = 0; i < N; ++i) {
      T xhat = (xr[i] - mu) * rs, dxhat = g[i] * (w ? w[i] : T(1));
      dxhat_mean += dxhat;
      dxhat_xhat_mean += dxhat * xhat;
    }
    dxhat_mean /= T(N);
    dxhat_xhat_mean /= T(N);
    for (int64_t i = 0; i < N; ++i) {
      T xhat = (xr[i] - mu) * rs, dxhat = g[i] * (w ? w[i] : T(1));
      if (dx) dx[r * N + i] += rs * (dxhat - dxhat_mean - xhat * dxhat_xhat_mean);
      if (dw) dw[i] += g[i] * xhat;
      if (db) db[i] += g[i];
    }
  }
}
// snippet-end: layer-norm-backward-naive

// =================================== embedding ================================================
// y[r, :] = w[idx[r], :]
// snippet-begin: embedding-forward
template <class T>
void embedding_forward(T* y, const T* w, const int64_t* idx, int64_t R, int64_t D) {
  parallel_for(R, row_grain(D), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::copy(w + idx[r] * D, w + (idx[r] + 1) * D, y + r * D);
  });
}
// snippet-end: embedding-forward

// Backward (math: autograd/ops.h, embedding): a scatter-add into the rows of dw. A counting sort
// groups the positions by row v (in increasing r), then each thread owns whole rows of dw: no two
// threads write one row, and each row adds its positions in the same order whatever the thread
// count.
// snippet-begin: embedding-backward
template <class T>
void embedding_backward(T* dw, const T* dy, const int64_t* idx, int64_t R, int64_t V, int64_t D) {
  std::vector<int64_t> start(size_t(V) + 1, 0);
  std::vector<int64_t> order(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) start[idx[r] + 1]++;
  std::vector<int64_t> rows;  // the rows of dw that receive something, in increasing order
  for (int64_t v = 0; v < V; ++v) {
    if (start[v + 1] > 0) rows.push_back(v);
    start[v + 1] += start[v];
  }
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < R; ++r) order[next[idx[r]]++] = r;
  const int64_t per_row = R / std::max<int64_t>(1, int64_t(rows.size()));
  parallel_for(int64_t(rows.size()), row_grain(D * std::max<int64_t>(1, per_row)), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t v = rows[k];
      T* d = dw + v * D;
      for (int64_t p = start[v]; p < start[v + 1]; ++p) {
        const T* g = dy + order[p] * D;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) d[j] += g[j];
      }
    }
  });
}
// snippet-end: embedding-backward

// ================================= cross_entropy ==============================================
// Forward, per row:  logp = (x - m) - log sum e^(x - m);  with q = (1 - s) onehot(t) + s / C,
//   loss = -sum_c q_c logp_c = -(1 - s) logp_t - (s / C) sum_c logp_c.
// snippet-begin: cross-entropy-forward
template <class T>
void cross_entropy_forward(T* loss, T* logp, const T* logits, const int64_t* target, int64_t N, int64_t C,
                           int64_t ignore_index, double smoothing) {
  const T s_on = T(1 - smoothing), s_all = T(smoothing / double(C));
  parallel_for(N, row_grain(C), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const T* xr = logits + n * C;
      T* lp = logp + n * C;
      const T m = row_max(xr, C);
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += vexp(xr[c] - m);
      const T log_s = std::log(s);
      T sum_lp = 0;
#pragma omp simd reduction(+ : sum_lp)
      for (int64_t c = 0; c < C; ++c) {
        lp[c] = (xr[c] - m) - log_s;
        sum_lp += lp[c];
      }
      const int64_t t = target[n];
      if (t == ignore_index)
        loss[n] = 0;
      else
        loss[n] = smoothing > 0 ? -(s_on * lp[t] + s_all * sum_lp) : -lp[t];
    }
  });
}
// snippet-end: cross-entropy-forward

// Backward (math: autograd/ops.h, cross_entropy): one pass per row, p_k = e^(logp_k) recomputed
// from the saved log-probabilities; q_on and q_off are q at the target and elsewhere.
// snippet-begin: cross-entropy-backward
template <class T>
void cross_entropy_backward(T* dlogits, const T* dloss, int64_t dloss_stride, const T* logp, const int64_t* target,
                            int64_t N, int64_t C, int64_t ignore_index, double smoothing, double scale) {
  const T q_off = T(smoothing / double(C)), q_on = T(1 - smoothing + smoothing / double(C));
  parallel_for(N, row_grain(C), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const int64_t t = target[n];
      if (t == ignore_index) continue;
      const T g = dloss[n * dloss_stride] * T(scale);
      const T* lp = logp + n * C;
      T* d = dlogits + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) d[c] += (vexp(lp[c]) - (c == t ? q_on : q_off)) * g;
    }
  });
}
// snippet-end: cross-entropy-backward

// ==================================== dropout =================================================
// Which elements are kept, and the factor of a kept one: the rule of core/kernels/dropout_mask.h,
// shared with the GPU. One Philox block gives the bits of four elements, so it is drawn once per
// block here.
// Written as x * (m ? 1/(1-p) : 0), so an inf or NaN that is dropped gives NaN, as PyTorch's
// x * mask * scale does. The backward's dx += g * s is one std::fma (one rounding on every build,
// as on the GPU: cuda/nn.cu).
namespace {
template <class T, bool Accumulate>
void dropout_apply(T* out, const T* in, int64_t n, double p, uint64_t seed, uint64_t offset) {
  const T scale = dropout_scale<T>(p);
  parallel_for(int64_t(dropout_blocks(n)), kGrain / 4, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const Philox4 r = philox4x32_10(seed, offset + uint64_t(blk));
      for (int64_t j = 0; j < 4 && blk * 4 + j < n; ++j) {
        const int64_t i = blk * 4 + j;
        const T s = dropout_keeps(r.v[j], p) ? scale : T(0);
        if (Accumulate)
          out[i] = std::fma(in[i], s, out[i]);
        else
          out[i] = in[i] * s;
      }
    }
  });
}
}  // namespace

template <class T>
void dropout_forward(T* y, const T* x, int64_t n, double p, uint64_t seed, uint64_t offset) {
  dropout_apply<T, false>(y, x, n, p, seed, offset);
}

// Backward (math: autograd/ops.h, dropout): the forward's loop adding into dx, with the mask
// drawn again from (seed, offset) rather than stored.
template <class T>
void dropout_backward(T* dx, const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset) {
  dropout_apply<T, true>(dx, dy, n, p, seed, offset);
}

// ================================ rope ==========================================================
// The cos and sin of the T x D/2 angles once per call (in f64, rounded to T), then every row of
// the R slices turned pair by pair: the table is R times smaller than x.
// snippet-begin: rope
template <class T>
void rope_forward(T* y, const T* x, int64_t R, int64_t Tn, int64_t D, int64_t offset, double base, bool interleaved,
                  bool inverse) {
  const int64_t half = D / 2;
  std::vector<T> cs(size_t(Tn * half)), sn(size_t(Tn * half));
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t k = 0; k < half; ++k) {
      const double a = rope_angle(offset + t, k, D, base);
      cs[size_t(t * half + k)] = T(std::cos(a));
      sn[size_t(t * half + k)] = T(inverse ? -std::sin(a) : std::sin(a));
    }
  // pair k is (x[k * step], x[k * step + gap]): rotate-half (1, D/2) or interleaved (2, 1)
  const int64_t step = interleaved ? 2 : 1, gap = interleaved ? 1 : half;
  parallel_for(R * Tn, row_grain(D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *c = cs.data() + (r % Tn) * half, *s = sn.data() + (r % Tn) * half, *xr = x + r * D;
      T* yr = y + r * D;
#pragma omp simd
      for (int64_t k = 0; k < half; ++k) {
        const T x1 = xr[k * step], x2 = xr[k * step + gap];
        yr[k * step] = x1 * c[k] - x2 * s[k];
        yr[k * step + gap] = x1 * s[k] + x2 * c[k];
      }
    }
  });
}
// snippet-end: rope

// ================================ instantiations ==============================================
// The kernels of core/kernels/nn.h for the dtypes listed there.
AG_INSTANTIATE_NN_KERNELS
// and the CPU's own references
AG_INSTANTIATE(softmax_forward_naive<float>) AG_INSTANTIATE(softmax_forward_naive<double>)
AG_INSTANTIATE(softmax_backward_naive<float>) AG_INSTANTIATE(softmax_backward_naive<double>)
AG_INSTANTIATE(layer_norm_forward_naive<float>) AG_INSTANTIATE(layer_norm_forward_naive<double>)
AG_INSTANTIATE(layer_norm_backward_naive<float>) AG_INSTANTIATE(layer_norm_backward_naive<double>)

}  // namespace ag::cpu
