// GPU kernels of the normalisation & loss ops, the twins of core/cpu/nn.cpp. Shapes and contracts:
// core/kernels/nn.h. Math: autograd/ops.h, under each op's name.
//
// A row (inner == 1) is one block of kThreads: each thread strides over the row, and the row's
// max and sums are combined by block_reduce, a fixed tree. A middle-dim softmax (inner > 1) is one
// thread per column, reading neighbouring columns together (coalesced). No atomics anywhere:
// layer_norm's dw, db sum fixed blocks of rows into partials, then the partials in order;
// embedding's dw sums each row's positions in increasing order after a stable sort.
#include "core/kernels.h"
#include "core/kernels/dropout_mask.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

// ============================== softmax / log_softmax ==========================================
// m = max x (NaN skipped: it still reaches y through exp, as on the CPU), s = sum e^(x - m),
// y = e^(x - m) / s  or  (x - m) - log s.
template <class T, bool Log>
__global__ void softmax_rows_kernel(T* y, const T* x, int64_t C) {
  __shared__ T sh[kThreads];
  const T* xr = x + int64_t(blockIdx.x) * C;
  T* yr = y + int64_t(blockIdx.x) * C;
  T m = lowest<T>();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = xr[c] > m ? xr[c] : m;
  m = block_reduce(m, MaxSkipNanOp{}, sh);
  T s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dexp(xr[c] - m);
  s = block_reduce(s, SumOp{}, sh);
  if (Log) {
    const T log_s = dlog(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (xr[c] - m) - log_s;
  } else {
    const T inv = T(1) / s;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = dexp(xr[c] - m) * inv;
  }
}

template <class T, bool Log>
__global__ void softmax_columns_kernel(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < outer * inner;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (w / inner) * C * inner + w % inner;
    const T* xc = x + base;
    T* yc = y + base;
    T m = lowest<T>();
    for (int64_t c = 0; c < C; ++c) m = xc[c * inner] > m ? xc[c * inner] : m;
    T s = 0;
    for (int64_t c = 0; c < C; ++c) s += dexp(xc[c * inner] - m);
    if (Log) {
      const T log_s = dlog(s);
      for (int64_t c = 0; c < C; ++c) yc[c * inner] = (xc[c * inner] - m) - log_s;
    } else {
      const T inv = T(1) / s;
      for (int64_t c = 0; c < C; ++c) yc[c * inner] = dexp(xc[c * inner] - m) * inv;
    }
  }
}

// Backward (math: autograd/ops.h, softmax and log_softmax): the row's one sum, sum_i g_i y_i
// (softmax) or sum_i g_i (log_softmax), then dx += each element's term.
template <class T, bool Log>
__global__ void softmax_backward_rows_kernel(T* dx, const T* dy, const T* y, int64_t C) {
  __shared__ T sh[kThreads];
  const int64_t off = int64_t(blockIdx.x) * C;
  const T *gr = dy + off, *yr = y + off;
  T* dr = dx + off;
  T acc = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += Log ? gr[c] : gr[c] * yr[c];
  acc = block_reduce(acc, SumOp{}, sh);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dr[c] += Log ? gr[c] - dexp(yr[c]) * acc : yr[c] * (gr[c] - acc);
}

template <class T, bool Log>
__global__ void softmax_backward_columns_kernel(T* dx, const T* dy, const T* y, int64_t outer, int64_t C,
                                                int64_t inner) {
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < outer * inner;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (w / inner) * C * inner + w % inner;
    const T *gc = dy + base, *yc = y + base;
    T* dc = dx + base;
    T acc = 0;
    for (int64_t c = 0; c < C; ++c) acc += Log ? gc[c * inner] : gc[c * inner] * yc[c * inner];
    for (int64_t c = 0; c < C; ++c)
      dc[c * inner] += Log ? gc[c * inner] - dexp(yc[c * inner]) * acc : yc[c * inner] * (gc[c * inner] - acc);
  }
}

template <class T, bool Log>
void softmax_family(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  if (outer * C * inner == 0) return;
  if (inner == 1)
    softmax_rows_kernel<T, Log><<<unsigned(outer), kThreads, 0, stream()>>>(y, x, C);
  else
    softmax_columns_kernel<T, Log><<<blocks_for(outer * inner), kThreads, 0, stream()>>>(y, x, outer, C, inner);
  kernelCheck();
}

template <class T, bool Log>
void softmax_family_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner) {
  if (outer * C * inner == 0) return;
  if (inner == 1)
    softmax_backward_rows_kernel<T, Log><<<unsigned(outer), kThreads, 0, stream()>>>(dx, dy, y, C);
  else
    softmax_backward_columns_kernel<T, Log>
        <<<blocks_for(outer * inner), kThreads, 0, stream()>>>(dx, dy, y, outer, C, inner);
  kernelCheck();
}

// =================================== layer_norm ===============================================
// Forward, one block per row: mu = mean x, var = mean (x - mu)^2 (the exact two-pass variance),
// rstd = 1 / sqrt(var + eps), y = (x - mu) rstd w + b.
template <class T>
__global__ void layer_norm_forward_kernel(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t N,
                                          T eps) {
  __shared__ T sh[kThreads];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * N;
  T* yr = y + r * N;
  T s = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += xr[i];
  const T mu = block_reduce(s, SumOp{}, sh) / T(N);
  T q = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) q += (xr[i] - mu) * (xr[i] - mu);
  const T var = block_reduce(q, SumOp{}, sh) / T(N);
  const T rs = T(1) / sqrt(var + eps);
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    T v = (xr[i] - mu) * rs;
    if (w) v = v * w[i];
    if (b) v = v + b[i];
    yr[i] = v;
  }
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx of one row per block (math: autograd/ops.h, layer_norm): the two row means by block_reduce,
// then dx WRITTEN (=), as the CPU's.
template <class T>
__global__ void layer_norm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const T* mean,
                                              const T* rstd, int64_t N) {
  __shared__ T sh[kThreads];
  const int64_t r = blockIdx.x;
  const T *g = dy + r * N, *xr = x + r * N;
  const T mu = mean[r], rs = rstd[r];
  T sa = 0, sc = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const T xhat = (xr[i] - mu) * rs, dxhat = w ? g[i] * w[i] : g[i];
    sa += dxhat;
    sc += dxhat * xhat;
  }
  const T a = block_reduce(sa, SumOp{}, sh) / T(N);
  const T c = block_reduce(sc, SumOp{}, sh) / T(N);
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const T xhat = (xr[i] - mu) * rs, dxhat = w ? g[i] * w[i] : g[i];
    dx[r * N + i] = rs * (dxhat - a - xhat * c);
  }
}

// dw, db: the sums over rows, first per block of rows (blockIdx.y), one thread per column, into
// partial [nblk][2][N]; then the partials in block order.
template <class T>
__global__ void layer_norm_backward_wb_partial_kernel(T* partial, const T* dy, const T* x, const T* mean,
                                                      const T* rstd, int64_t R, int64_t N, int64_t rows_per_block) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= N) return;
  const int64_t k = blockIdx.y, r0 = k * rows_per_block, r1 = min(R, r0 + rows_per_block);
  T pw = 0, pb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const T g = dy[r * N + j];
    pw += g * ((x[r * N + j] - mean[r]) * rstd[r]);
    pb += g;
  }
  partial[(2 * k) * N + j] = pw;
  partial[(2 * k + 1) * N + j] = pb;
}

template <class T>
__global__ void layer_norm_backward_wb_sum_kernel(T* dw, T* db, const T* partial, int64_t nblk, int64_t N) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= N) return;
  T sw = 0, sb = 0;
  for (int64_t k = 0; k < nblk; ++k) {
    sw += partial[(2 * k) * N + j];
    sb += partial[(2 * k + 1) * N + j];
  }
  if (dw) dw[j] += sw;
  if (db) db[j] += sb;
}

// =================================== embedding ================================================
template <class T>
__global__ void embedding_forward_kernel(T* y, const T* w, const int64_t* idx, int64_t R, int64_t D) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < R * D; e += int64_t(gridDim.x) * blockDim.x)
    y[e] = w[idx[e / D] * D + e % D];
}

// embedding's scatter-add, each dw row summing its positions r in increasing order: keys/pos are
// idx sorted stably with its positions, so each run of equal keys lists its r in order. The block at the
// start of a run adds the whole run into its dw row; the other blocks have nothing to do.
template <class T>
__global__ void scatter_add_runs_kernel(T* dw, const T* dy, const int64_t* keys, const int64_t* pos, int64_t R,
                                        int64_t D) {
  for (int64_t p = blockIdx.x; p < R; p += gridDim.x) {
    if (p > 0 && keys[p] == keys[p - 1]) continue;  // not the start of a run
    const int64_t v = keys[p];
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      T acc = dw[v * D + j];
      for (int64_t q = p; q < R && keys[q] == v; ++q) acc += dy[pos[q] * D + j];
      dw[v * D + j] = acc;
    }
  }
}

// ================================= cross_entropy ==============================================
// Forward, one block per row:  logp = (x - m) - log sum e^(x - m);  with q = (1 - s) onehot(t) + s / C,
//   loss = -(1 - s) logp_t - (s / C) sum_c logp_c   (0 for an ignored row, whose logp is still written).
template <class T>
__global__ void cross_entropy_forward_kernel(T* loss, T* logp, const T* logits, const int64_t* target, int64_t C,
                                             int64_t ignore_index, double smoothing) {
  __shared__ T sh[kThreads];
  const int64_t n = blockIdx.x;
  const T* xr = logits + n * C;
  T* lp = logp + n * C;
  T m = lowest<T>();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = xr[c] > m ? xr[c] : m;
  m = block_reduce(m, MaxSkipNanOp{}, sh);
  T s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dexp(xr[c] - m);
  const T log_s = dlog(block_reduce(s, SumOp{}, sh));
  T sum_lp = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    lp[c] = (xr[c] - m) - log_s;
    sum_lp += lp[c];
  }
  sum_lp = block_reduce(sum_lp, SumOp{}, sh);
  if (threadIdx.x != 0) return;
  const int64_t t = target[n];
  if (t == ignore_index) {
    loss[n] = 0;
    return;
  }
  const T lp_t = (xr[t] - m) - log_s;  // = lp[t], which another thread may have written
  const T s_on = T(1 - smoothing), s_all = T(smoothing / double(C));
  loss[n] = smoothing > 0 ? -(s_on * lp_t + s_all * sum_lp) : -lp_t;
}

// One thread per element of dlogits (math: autograd/ops.h, cross_entropy).
template <class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* dloss, int64_t dloss_stride, const T* logp,
                                              const int64_t* target, int64_t N, int64_t C, int64_t ignore_index,
                                              T q_on, T q_off, T scale) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < N * C; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e / C, c = e % C, t = target[n];
    if (t == ignore_index) continue;
    const T g = dloss[n * dloss_stride] * scale;
    dlogits[e] += (dexp(logp[e]) - (c == t ? q_on : q_off)) * g;
  }
}

// ==================================== dropout =================================================
// The CPU's mask, by the rule of core/kernels/dropout_mask.h, one thread per Philox block.
// y = x * (kept ? 1/(1-p) : 0); the backward's dx += g s is one fma, as the CPU writes it.
template <class T, bool Accumulate>
__global__ void dropout_kernel(T* out, const T* in, int64_t n, double p, uint64_t seed, uint64_t offset, T scale) {
  const int64_t blocks = int64_t(dropout_blocks(n));
  for (int64_t blk = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; blk < blocks;
       blk += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 r = philox4x32_10(seed, offset + uint64_t(blk));
    for (int64_t j = 0; j < 4 && blk * 4 + j < n; ++j) {
      const int64_t i = blk * 4 + j;
      const T s = dropout_keeps(r.v[j], p) ? scale : T(0);
      out[i] = Accumulate ? fma(in[i], s, out[i]) : mul_rn(in[i], s);
    }
  }
}

}  // namespace

template <class T>
void softmax_forward(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  softmax_family<T, false>(y, x, outer, C, inner);
}
template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner) {
  softmax_family_backward<T, false>(dx, dy, y, outer, C, inner);
}
template <class T>
void log_softmax_forward(T* y, const T* x, int64_t outer, int64_t C, int64_t inner) {
  softmax_family<T, true>(y, x, outer, C, inner);
}
template <class T>
void log_softmax_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner) {
  softmax_family_backward<T, true>(dx, dy, y, outer, C, inner);
}

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t R, int64_t N, double eps) {
  if (R == 0) return;
  layer_norm_forward_kernel<<<unsigned(R), kThreads, 0, stream()>>>(y, mean, rstd, x, w, b, N, T(eps));
  kernelCheck();
}

template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         int64_t R, int64_t N) {
  if (R == 0 || N == 0) return;
  if (dx) {
    layer_norm_backward_dx_kernel<<<unsigned(R), kThreads, 0, stream()>>>(dx, dy, x, w, mean, rstd, N);
    kernelCheck();
  }
  if (!dw && !db) return;
  // at most 256 blocks of rows: a function of R alone, so the partials (and the sums) are too
  const int64_t rows_per_block = (R + 255) / 256, nblk = (R + rows_per_block - 1) / rows_per_block;
  Scratch partial(size_t(2 * nblk * N) * sizeof(T));
  const unsigned cols = unsigned((N + kThreads - 1) / kThreads);
  layer_norm_backward_wb_partial_kernel<<<dim3(cols, unsigned(nblk)), kThreads, 0, stream()>>>(
      partial.as<T>(), dy, x, mean, rstd, R, N, rows_per_block);
  kernelCheck();
  layer_norm_backward_wb_sum_kernel<<<cols, kThreads, 0, stream()>>>(dw, db, partial.as<T>(), nblk, N);
  kernelCheck();
}

template <class T>
void embedding_forward(T* y, const T* w, const int64_t* idx, int64_t R, int64_t D) {
  if (R * D == 0) return;
  embedding_forward_kernel<<<blocks_for(R * D), kThreads, 0, stream()>>>(y, w, idx, R, D);
  kernelCheck();
}

template <class T>
void embedding_backward(T* dw, const T* dy, const int64_t* idx, int64_t R, int64_t V, int64_t D) {
  if (R * D == 0) return;
  Scratch keys(size_t(R) * sizeof(int64_t)), pos(size_t(R) * sizeof(int64_t));
  sort_by_index(keys.as<int64_t>(), pos.as<int64_t>(), idx, R, V);
  const unsigned grid = unsigned(R < 65535 * 32 ? R : 65535 * 32);
  scatter_add_runs_kernel<<<grid, kThreads, 0, stream()>>>(dw, dy, keys.as<int64_t>(), pos.as<int64_t>(), R, D);
  kernelCheck();
}

template <class T>
void cross_entropy_forward(T* loss, T* logp, const T* logits, const int64_t* target, int64_t N, int64_t C,
                           int64_t ignore_index, double smoothing) {
  if (N == 0) return;
  cross_entropy_forward_kernel<<<unsigned(N), kThreads, 0, stream()>>>(loss, logp, logits, target, C, ignore_index,
                                                                       smoothing);
  kernelCheck();
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* dloss, int64_t dloss_stride, const T* logp, const int64_t* target,
                            int64_t N, int64_t C, int64_t ignore_index, double smoothing, double scale) {
  if (N * C == 0) return;
  const T q_off = T(smoothing / double(C)), q_on = T(1 - smoothing + smoothing / double(C));
  cross_entropy_backward_kernel<<<blocks_for(N * C), kThreads, 0, stream()>>>(
      dlogits, dloss, dloss_stride, logp, target, N, C, ignore_index, q_on, q_off, T(scale));
  kernelCheck();
}

template <class T>
void dropout_forward(T* y, const T* x, int64_t n, double p, uint64_t seed, uint64_t offset) {
  if (n == 0) return;
  dropout_kernel<T, false><<<blocks_for(int64_t(dropout_blocks(n))), kThreads, 0, stream()>>>(
      y, x, n, p, seed, offset, dropout_scale<T>(p));
  kernelCheck();
}

template <class T>
void dropout_backward(T* dx, const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset) {
  if (n == 0) return;
  dropout_kernel<T, true><<<blocks_for(int64_t(dropout_blocks(n))), kThreads, 0, stream()>>>(
      dx, dy, n, p, seed, offset, dropout_scale<T>(p));
  kernelCheck();
}

// rope: one thread per pair (R T D/2 of them), its angle's cos and sin in f64 as the CPU's table
// (core/kernels.h rope_angle), rounded to T.
template <class T>
__global__ void rope_kernel(T* y, const T* x, int64_t R, int64_t Tn, int64_t D, int64_t offset, double base,
                            bool interleaved, bool inverse) {
  const int64_t half = D / 2, n = R * Tn * half;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / half, k = e % half, t = row % Tn;
    double sa, ca;
    sincos(rope_angle(offset + t, k, D, base), &sa, &ca);
    const T c = T(ca), s = T(inverse ? -sa : sa);
    const int64_t i1 = row * D + (interleaved ? 2 * k : k), i2 = i1 + (interleaved ? 1 : half);
    const T x1 = x[i1], x2 = x[i2];
    y[i1] = x1 * c - x2 * s;
    y[i2] = x1 * s + x2 * c;
  }
}

template <class T>
void rope_forward(T* y, const T* x, int64_t R, int64_t Tn, int64_t D, int64_t offset, double base, bool interleaved,
                  bool inverse) {
  if (R * Tn * D == 0) return;
  rope_kernel<T><<<blocks_for(R * Tn * (D / 2)), kThreads, 0, stream()>>>(y, x, R, Tn, D, offset, base, interleaved,
                                                                           inverse);
  kernelCheck();
}

// The kernels of core/kernels/nn.h for the dtypes listed there.
AG_INSTANTIATE_NN_KERNELS

}  // namespace ag::cuda
