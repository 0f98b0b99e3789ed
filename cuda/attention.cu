// Fused scaled dot-product attention on the GPU. Shapes, strides and contracts:
// core/kernels/attention.h. Math: autograd/ops.h (scaled_dot_product_attention); derivation:
// docs/math/attention.md.
//
// The kernels compute exactly what cpu::attention_forward / attention_backward define (the same
// masks from the same rule, core/kernels/attention_mask.h; lse = +inf and out = 0 for a row with no
// visible key; the dropout mask from the same Philox elements, core/kernels/dropout_mask.h),
// FlashAttention-2 style: no Tq x Tk matrix in global memory.
//
// f32, D and Dv <= 128: the tiled kernels below. Everything else (f64, larger heads): one thread
// per row, the simple reference path at the end of the file.
//
// The tiles. A block is 4 warps; it owns 32 rows (8 per warp) and walks 32 columns at a time, one
// column per lane: lane j of a warp computes the scores of its 8 rows against column j, so the
// row-wise reductions of the softmax are warp shuffles and nothing in a tile needs the whole
// block. Head vectors (rows of Q, K, V, dO) sit in shared memory as rows of 32 C floats (C =
// ceil(max(D, Dv) / 32), 1, 2 or 4), zero-padded: a lane then owns the columns lane + 32 c of the
// output rows (c < C), and the dot products run over D rounded up to 4 in float4 steps. A tile read
// by one row per lane has its rows padded by 4 floats: with 32 C + 4 floats per row (an odd
// number of 16-byte units) the float4 reads of 8 consecutive lanes fall into 8 different bank
// groups, so they are conflict-free; tiles read with every lane on the same row are broadcasts.
// Padding rows (past Tq or Tk) are zeros too: a weight of 0 times garbage could be NaN.
//
// Work skipped. key_range (the causal / window / lengths range of a query row) only grows with the
// row: lo and hi never decrease as i increases. So the keys a block of query rows i0..i1 can see
// lie in key_bounds = [lo(i0), hi(i1)), and a key tile [j0, j1) outside it is hidden from the
// whole block (tile_hidden): causal attention visits about half of the tiles. With a block mask,
// a tile whose blocks are all dropped (block_cover none) is skipped too (tile_blocks_kept), so the
// work grows with the kept blocks; inside a visited tile visible() checks each (i, j), the block
// mask included.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "core/kernels.h"
#include "core/kernels/attention_mask.h"
#include "core/kernels/dropout_mask.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

constexpr int kWarps = 4;              // warps per block
constexpr int kThreads = 32 * kWarps;  // threads per block
constexpr int kRows = 8;               // rows per warp
constexpr int kTile = kWarps * kRows;  // rows per block = columns per tile = 32, one per lane
static_assert(kTile == 32, "one column of a tile per lane");

// The geometry as the kernels read it: the masks (Tq, Tk, causal, window, lengths and key_mask in
// device memory; the rule is core/kernels/attention_mask.h), sizes, strides resolved.
struct Geo : Visibility {
  int64_t BH, H, D, Dv;
  int64_t G;  // query heads per key/value head: query head h reads key/value head h / G
  int64_t qb, qh, qt, kb, kh, kt, vb, vh, vt;  // element strides along B, H, T of q, k, v
  double scale;
  double dropout, keep;    // keep = 1 / (1 - dropout), the factor of a kept weight
  uint64_t seed, offset;
  const float* alibi;      // (H) ALiBi slopes in device memory, or null
  Precision grad_operands;  // autocast: dS rounded to this format before dQ and dK (AttentionGeom)
};

// dS_ij as the products dQ = scale dS K and dK = scale dS^T Q read it: rounded under autocast
// (AttentionGeom::grad_operands; f32 only), as the CPU kernels do.
template <class T>
__device__ inline T product_ds(const Geo& g, T ds) {
  if constexpr (std::is_same_v<T, float>) return pw::round_operand(ds, g.grad_operands);
  return ds;
}

// The ALiBi bias of the scaled score of pair (i, j) in head bh % H (core/kernels/attention_mask.h),
// 0 without slopes.
template <class T>
__device__ inline T alibi_term(const Geo& g, int64_t bh, int64_t i, int64_t j) {
  return g.alibi ? T(alibi_bias(double(g.alibi[bh % g.H]), g.Tq, g.Tk, i, j)) : T(0);
}

// Dropout keep factor of weight (bh, i, j): keep or 0, by the rule of core/kernels/dropout_mask.h
// (element (bh Tq + i) Tk + j of ag::dropout's Philox stream), as on the CPU. Not inlined: the ten
// Philox rounds inlined at every use (8 rows per thread in the tiled kernels) cost ~60 registers per
// thread even without dropout, and that limits how many blocks share an SM. Scalars by value, so
// the call needs no copy of Geo.
template <class T>
__device__ __noinline__ T keep_factor(uint64_t seed, uint64_t offset, double dropout, double keep, uint64_t idx) {
  return dropout_keep(seed, offset, idx, dropout) ? T(keep) : T(0);
}
template <class T>
__device__ inline T keep_factor(const Geo& g, int64_t bh, int64_t i, int64_t j) {
  return keep_factor<T>(g.seed, g.offset, g.dropout, g.keep, attention_dropout_element(bh, i, j, g.Tq, g.Tk));
}

template <class T>
__device__ inline T warp_max(T x) {
  for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <class T>
__device__ inline T warp_sum(T x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// tile (kTile, LD) = rows r0 .. r0 + kTile of x (row stride ldx; rows < n and columns < Dx are
// real), zeros elsewhere. Consecutive threads read consecutive elements of a row: coalesced.
template <int LD>
__device__ inline void load_tile(float* tile, const float* x, int64_t ldx, int64_t r0, int64_t n, int64_t Dx) {
  for (int e = threadIdx.x; e < kTile * LD; e += kThreads) {
    const int r = e / LD, c = e % LD;
    tile[e] = (r0 + r < n && c < Dx) ? x[(r0 + r) * ldx + c] : 0.f;
  }
}

__device__ inline float dot4(float s, float4 a, float4 b) {
  s = fmaf(a.x, b.x, s);
  s = fmaf(a.y, b.y, s);
  s = fmaf(a.z, b.z, s);
  return fmaf(a.w, b.w, s);
}
__device__ inline float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Whether block_mask keeps some block that rows [i0, i1) x keys [j0, j1) (both non-empty) overlap:
// block_cover(g, i0, i1, j0, j1) != none of core/kernels/attention_mask.h, with the overlapped
// blocks shared among the threads (one each for bs >= 32; a sequential walk would cost each thread
// up to 32 x 32 reads for bs = 1) and joined by __syncthreads_or. A barrier: every thread of the
// block calls it, with the same arguments, and gets the same answer.
__device__ inline bool tile_blocks_kept(const Geo& g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t bs = g.block_size, r0 = i0 / bs, c0 = j0 / bs;
  const int64_t nc = (j1 - 1) / bs - c0 + 1, n = ((i1 - 1) / bs - r0 + 1) * nc;
  int kept = 0;
  for (int64_t e = threadIdx.x; e < n && !kept; e += blockDim.x)
    kept = g.block_mask[(r0 + e / nc) * g.block_cols + c0 + e % nc];
  return __syncthreads_or(kept) != 0;
}

// The tiled kernels are compiled twice, with a block mask (Blocks) and without. Without, the
// geometry they read has block_mask = nullptr as a constant, so the compiler drops every block
// check of the mask rule: compiled once for both, those checks cost the dense kernels registers
// and so blocks per SM (docs/benchmarks.md, "Where the time goes"). The forward reads a copy made here; the backward kernels clear the field of their
// parameter in place instead: the same effect, in the form that gets each the fewest registers
// (ptxas, sm_90).
template <bool Blocks>
__device__ inline Geo blocks_only_if(const Geo& g) {
  Geo c = g;
  if constexpr (!Blocks) c.block_mask = nullptr;
  return c;
}

// Shared memory of each kernel, in floats, for C (see the layouts in the kernels).
__host__ __device__ constexpr int row_ld(int C) { return 32 * C; }      // a tile read with one row per warp (broadcast)
__host__ __device__ constexpr int lane_ld(int C) { return 32 * C + 4; } // a tile read with one row per lane
constexpr size_t forward_floats(int C) { return size_t(kTile) * (2 * row_ld(C) + lane_ld(C)) + kTile * kTile; }
constexpr size_t backward_kv_floats(int C) {
  return size_t(kTile) * (2 * row_ld(C) + 2 * lane_ld(C)) + 2 * kTile * kTile + 2 * kTile;
}
constexpr size_t backward_q_floats(int C) {
  return size_t(kTile) * (2 * row_ld(C) + 2 * lane_ld(C)) + kTile * kTile + 2 * kTile;
}

// ---- forward ---------------------------------------------------------------------------------
// Block (bh, query tile i0): rows i = i0 + 8 warp + r of head bh. For each key tile j0, lane j:
//   s_ij = scale q_i . k_j   (-inf where j is hidden from i)
// then the online softmax of each row over the tiles seen so far (docs/math/attention.md, "The
// fused kernel: recompute instead of storing T x T"): m the running max, l the running sum of
// e^(s - m), acc the running sum of e^(s - m) v, all in registers; alpha = e^(m - m') rescales
// them when the max grows. With dropout l counts every weight and only the values are dropped, as
// on the CPU. After the last tile out_i = acc / l and lse_i = m + log l. A row that saw no key
// keeps m = -inf, l = 0: out = 0, lse = +inf.
// The sum over j of p_ij v_j: lane c owns the output columns c + 32 cc; p of the warp's rows goes
// through shared memory (Ps) and is read back as float4 broadcasts, 4 keys at a time.
template <int C, bool Blocks>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Geo geo) {
  const Geo g = blocks_only_if<Blocks>(geo);
  constexpr int LB = row_ld(C), LL = lane_ld(C);
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // (32, LB)  query rows of the block
  float* Ks = Qs + kTile * LB;                  // (32, LL)  key tile, one key per lane
  float* Vs = Ks + kTile * LL;                  // (32, LB)  value tile
  float* Ps = Vs + kTile * LB;                  // (32, 32)  p of each row of the block
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t nqt = (g.Tq + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / nqt, i0 = (blockIdx.x % nqt) * kTile, b = bh / g.H, h = bh % g.H;
  const float* K = k + b * g.kb + (h / g.G) * g.kh;
  const float* V = v + b * g.vb + (h / g.G) * g.vh;
  load_tile<LB>(Qs, q + b * g.qb + h * g.qh, g.qt, i0, g.Tq, g.D);
  const KeyRange span = key_bounds(g, b, i0, min(i0 + kTile, g.Tq));  // the keys the block may see
  const int D4 = int((g.D + 3) / 4 * 4);
  const float scale = float(g.scale);

  float m[kRows], l[kRows], acc[kRows][C];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = 0.f;
  }
  const int64_t i1 = min(i0 + kTile, g.Tq);
  for (int64_t j0 = span.lo; j0 < span.hi; j0 += kTile) {
    // a tile of dropped blocks only: skipped by the whole block (uniform)
    if (g.block_mask && !tile_blocks_kept(g, i0, i1, j0, min(j0 + kTile, g.Tk))) continue;
    __syncthreads();  // every warp is done with the previous tile (and Qs is complete)
    load_tile<LL>(Ks, K, g.kt, j0, g.Tk, g.D);
    load_tile<LB>(Vs, V, g.vt, j0, g.Tk, g.Dv);
    __syncthreads();
    const int64_t j = j0 + lane;
    float s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = 0.f;
    for (int d = 0; d < D4; d += 4) {  // s_r = q_r . k_lane
      const float4 kk = ld4(Ks + lane * LL + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = dot4(s[r], ld4(Qs + (warp * kRows + r) * LB + d), kk);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = i0 + warp * kRows + r;
      const bool vis = i < g.Tq && visible(g, b, i, j);
      const float x = vis ? s[r] * scale + alibi_term<float>(g, bh, i, j) : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(x));  // the same in every lane: warp-uniform branch
      float p = 0.f;
      if (m_new != -INFINITY) {  // else nothing visible yet in this row: contributes nothing
        const float alpha = expf(m[r] - m_new);  // rescales what was summed under the old max
        p = expf(x - m_new);                      // hidden: e^-inf = 0
        l[r] = l[r] * alpha + warp_sum(p);
        m[r] = m_new;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] *= alpha;
        if (g.dropout > 0 && vis) p *= keep_factor<float>(g, bh, i, j);
      }
      Ps[(warp * kRows + r) * kTile + lane] = p;
    }
    __syncwarp();  // a warp reads back only its own rows of Ps
    for (int jj = 0; jj < kTile; jj += 4) {  // acc_r += sum_jj p_r,jj v_jj
      float4 pp[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) pp[r] = ld4(Ps + (warp * kRows + r) * kTile + jj);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float* vc = Vs + jj * LB + lane + 32 * c;
        const float v0 = vc[0], v1 = vc[LB], v2 = vc[2 * LB], v3 = vc[3 * LB];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          acc[r][c] = fmaf(pp[r].w, v3, fmaf(pp[r].z, v2, fmaf(pp[r].y, v1, fmaf(pp[r].x, v0, acc[r][c]))));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= g.Tq) continue;
    // a row with no visible key gives zeros (not NaN) and lse = +inf, which backward reads as P = 0
    const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;
    float* o = out + (bh * g.Tq + i) * g.Dv;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < g.Dv) o[lane + 32 * c] = acc[r][c] * inv;
    if (lane == 0) lse[bh * g.Tq + i] = l[r] > 0 ? m[r] + logf(l[r]) : INFINITY;
  }
}

// ---- backward --------------------------------------------------------------------------------
// Math: autograd/ops.h (scaled_dot_product_attention); derived in docs/math/attention.md,
// "Backward, through both matmuls and the softmax": D_i = dO_i . O_i, and M_ij below is the
// dropout keep factor of weight (i, j) (1 without dropout). Each tile's P is rebuilt from the
// saved lse instead of stored.
//
// Deterministic, no atomics: every gradient element is summed by one thread in a fixed order.
// dK and dV need a sum over the queries, dQ one over the keys, so there are two kernels, which
// both recompute S and dP tile by tile (FlashAttention-2 with a separate dQ pass, the price of no
// atomic adds): attention_backward_kv_kernel, one block per key tile, walks the query tiles;
// attention_backward_q_kernel, one block per query tile, walks the key tiles. D_i comes first
// (attention_rowdot_kernel), one number per row.

// Dd (rows) = rowsum(dout * out), one warp per row. Grid-stride over the rows: blocks_for caps the
// grid (65535 x 32 blocks of 8 warps, about 16.7M rows), and B x H x T can be larger.
template <class T>
__global__ void attention_rowdot_kernel(T* Dd, const T* dout, const T* out, int64_t rows, int64_t Dv) {
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  // the whole warp takes the same rows: warp_sum needs all 32 lanes
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; row < rows; row += warps) {
    T d = 0;
    for (int64_t c = lane; c < Dv; c += 32) d += dout[row * Dv + c] * out[row * Dv + c];
    d = warp_sum(d);
    if (lane == 0) Dd[row] = d;
  }
}

// The scores and weight gradients of one (query i, key j) pair from its two dot products:
//   s = q_i . k_j,  dp = dO_i . v_j  ->  pm = P_ij M_ij (what V saw),  ds = dS_ij
__device__ inline void pair_grads(const Geo& g, bool vis, float s, float dp, float li, float di, int64_t bh, int64_t i,
                                  int64_t j, float& pm, float& ds) {
  const float p = vis ? expf(s * float(g.scale) + alibi_term<float>(g, bh, i, j) - li) : 0.f;  // hidden keys: 0
  if (g.dropout > 0) {
    const float mk = vis ? keep_factor<float>(g, bh, i, j) : 0.f;
    pm = p * mk;
    ds = product_ds(g, p * (dp * mk - di));
  } else {
    pm = p;
    ds = product_ds(g, p * (dp - di));
  }
}

// Block (bh, key tile j0): keys j = j0 + 8 warp + r, lane = a query of the current query tile.
//   dV_j += sum_i P_ij M_ij dO_i,   dK_j += scale sum_i dS_ij Q_i
template <int C, bool Blocks>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                 const float* v, const float* lse, const float* Dd, Geo g) {
  if constexpr (!Blocks) g.block_mask = nullptr;  // blocks_only_if, in place
  constexpr int LB = row_ld(C), LL = lane_ld(C);
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // (32, LB)  keys of the block
  float* Vs = Ks + kTile * LB;                  // (32, LB)  their values
  float* Qs = Vs + kTile * LB;                  // (32, LL)  query tile, one query per lane
  float* dOs = Qs + kTile * LL;                 // (32, LL)  dO of those queries
  float* Ps = dOs + kTile * LL;                 // (32, 32)  P M of each key row against each query
  float* dSs = Ps + kTile * kTile;              // (32, 32)  dS, the same
  float* Ls = dSs + kTile * kTile;              // (32)      lse of the query tile
  float* Ds = Ls + kTile;                       // (32)      D_i of the query tile
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t nkt = (g.Tk + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / nkt, j0 = (blockIdx.x % nkt) * kTile, b = bh / g.H, h = bh % g.H;
  const float* Q = q + b * g.qb + h * g.qh;
  const float* dO = dout + bh * g.Tq * g.Dv;
  load_tile<LB>(Ks, k + b * g.kb + (h / g.G) * g.kh, g.kt, j0, g.Tk, g.D);
  load_tile<LB>(Vs, v + b * g.vb + (h / g.G) * g.vh, g.vt, j0, g.Tk, g.Dv);
  const int64_t j1 = min(j0 + kTile, g.Tk);  // keys [j0, j1) are real
  const int D4 = int((g.D + 3) / 4 * 4), Dv4 = int((g.Dv + 3) / 4 * 4);

  float dK[kRows][C], dV[kRows][C];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) dK[r][c] = dV[r][c] = 0.f;
  for (int64_t i0 = 0; i0 < g.Tq; i0 += kTile) {
    // no row of this query tile sees a key of the block's: skipped by the whole block (uniform).
    // tile_hidden(g, b, i0, i1, j0, j1) of core/kernels/attention_mask.h, written out: the call
    // costs this kernel registers (ptxas, sm_90) and so a block per SM.
    const int64_t ilast = min(i0 + kTile, g.Tq) - 1;
    if (key_range(g, b, i0).lo >= j1 || key_range(g, b, ilast).hi <= j0) continue;
    if (g.block_mask && !tile_blocks_kept(g, i0, ilast + 1, j0, j1)) continue;  // dropped blocks only
    __syncthreads();  // every warp is done with the previous query tile (and Ks, Vs are complete)
    load_tile<LL>(Qs, Q, g.qt, i0, g.Tq, g.D);
    load_tile<LL>(dOs, dO, g.Dv, i0, g.Tq, g.Dv);
    if (threadIdx.x < kTile) {
      const int64_t i = i0 + threadIdx.x;
      Ls[threadIdx.x] = i < g.Tq ? lse[bh * g.Tq + i] : INFINITY;
      Ds[threadIdx.x] = i < g.Tq ? Dd[bh * g.Tq + i] : 0.f;
    }
    __syncthreads();
    const int64_t i = i0 + lane;
    const float li = Ls[lane], di = Ds[lane];
    const bool row_ok = i < g.Tq && li < INFINITY;  // a row that saw no key (lse = +inf) has P = 0
    const KeyRange range = key_range(g, b, i);
    float s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = 0.f;
    for (int d = 0; d < D4; d += 4) {  // s_r = q_lane . k_r (same order of terms as the forward)
      const float4 qq = ld4(Qs + lane * LL + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = dot4(s[r], qq, ld4(Ks + (warp * kRows + r) * LB + d));
    }
    for (int d = 0; d < Dv4; d += 4) {  // dp_r = dO_lane . v_r
      const float4 oo = ld4(dOs + lane * LL + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) dp[r] = dot4(dp[r], oo, ld4(Vs + (warp * kRows + r) * LB + d));
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t j = j0 + warp * kRows + r;
      float pm, ds;
      pair_grads(g, row_ok && sees(g, b, i, range, j), s[r], dp[r], li, di, bh, i, j, pm, ds);
      Ps[(warp * kRows + r) * kTile + lane] = pm;
      dSs[(warp * kRows + r) * kTile + lane] = ds;
    }
    __syncwarp();  // a warp reads back only its own rows of Ps, dSs
    for (int ii = 0; ii < kTile; ii += 4) {  // dV_r += sum_ii (P M)_r,ii dO_ii
      float4 pp[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) pp[r] = ld4(Ps + (warp * kRows + r) * kTile + ii);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float* oc = dOs + ii * LL + lane + 32 * c;
        const float o0 = oc[0], o1 = oc[LL], o2 = oc[2 * LL], o3 = oc[3 * LL];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          dV[r][c] = fmaf(pp[r].w, o3, fmaf(pp[r].z, o2, fmaf(pp[r].y, o1, fmaf(pp[r].x, o0, dV[r][c]))));
      }
    }
    for (int ii = 0; ii < kTile; ii += 4) {  // dK_r += sum_ii dS_r,ii Q_ii  (scale at the end)
      float4 dd[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) dd[r] = ld4(dSs + (warp * kRows + r) * kTile + ii);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float* qc = Qs + ii * LL + lane + 32 * c;
        const float q0 = qc[0], q1 = qc[LL], q2 = qc[2 * LL], q3 = qc[3 * LL];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          dK[r][c] = fmaf(dd[r].w, q3, fmaf(dd[r].z, q2, fmaf(dd[r].y, q1, fmaf(dd[r].x, q0, dK[r][c]))));
      }
    }
  }
  const float scale = float(g.scale);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t j = j0 + warp * kRows + r;
    if (j >= g.Tk) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = lane + 32 * c;
      if (col < g.D) dk[(bh * g.Tk + j) * g.D + col] += scale * dK[r][c];
      if (col < g.Dv) dv[(bh * g.Tk + j) * g.Dv + col] += dV[r][c];
    }
  }
}

// Block (bh, query tile i0): rows i = i0 + 8 warp + r, lane = a key of the current key tile.
//   dQ_i += scale sum_j dS_ij K_j
template <int C, bool Blocks>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                                const float* lse, const float* Dd, Geo g) {
  if constexpr (!Blocks) g.block_mask = nullptr;  // blocks_only_if, in place
  constexpr int LB = row_ld(C), LL = lane_ld(C);
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // (32, LB)  query rows of the block
  float* dOs = Qs + kTile * LB;                 // (32, LB)  their dO
  float* Ks = dOs + kTile * LB;                 // (32, LL)  key tile, one key per lane
  float* Vs = Ks + kTile * LL;                  // (32, LL)  its values
  float* dSs = Vs + kTile * LL;                 // (32, 32)  dS of each row against each key
  float* Ls = dSs + kTile * kTile;              // (32)      lse of the rows
  float* Ds = Ls + kTile;                       // (32)      D_i of the rows
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t nqt = (g.Tq + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / nqt, i0 = (blockIdx.x % nqt) * kTile, b = bh / g.H, h = bh % g.H;
  const float* K = k + b * g.kb + (h / g.G) * g.kh;
  const float* V = v + b * g.vb + (h / g.G) * g.vh;
  load_tile<LB>(Qs, q + b * g.qb + h * g.qh, g.qt, i0, g.Tq, g.D);
  load_tile<LB>(dOs, dout + bh * g.Tq * g.Dv, g.Dv, i0, g.Tq, g.Dv);
  if (threadIdx.x < kTile) {
    const int64_t i = i0 + threadIdx.x;
    Ls[threadIdx.x] = i < g.Tq ? lse[bh * g.Tq + i] : INFINITY;
    Ds[threadIdx.x] = i < g.Tq ? Dd[bh * g.Tq + i] : 0.f;
  }
  const KeyRange span = key_bounds(g, b, i0, min(i0 + kTile, g.Tq));  // the keys the block may see
  const int D4 = int((g.D + 3) / 4 * 4), Dv4 = int((g.Dv + 3) / 4 * 4);

  float dQ[kRows][C];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) dQ[r][c] = 0.f;
  const int64_t i1 = min(i0 + kTile, g.Tq);
  for (int64_t j0 = span.lo; j0 < span.hi; j0 += kTile) {
    if (g.block_mask && !tile_blocks_kept(g, i0, i1, j0, min(j0 + kTile, g.Tk))) continue;  // as in the forward
    __syncthreads();  // every warp is done with the previous key tile (and Qs, dOs, Ls, Ds are complete)
    load_tile<LL>(Ks, K, g.kt, j0, g.Tk, g.D);
    load_tile<LL>(Vs, V, g.vt, j0, g.Tk, g.Dv);
    __syncthreads();
    const int64_t j = j0 + lane;
    float s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = 0.f;
    for (int d = 0; d < D4; d += 4) {  // s_r = q_r . k_lane
      const float4 kk = ld4(Ks + lane * LL + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = dot4(s[r], ld4(Qs + (warp * kRows + r) * LB + d), kk);
    }
    for (int d = 0; d < Dv4; d += 4) {  // dp_r = dO_r . v_lane
      const float4 vv = ld4(Vs + lane * LL + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) dp[r] = dot4(dp[r], ld4(dOs + (warp * kRows + r) * LB + d), vv);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = warp * kRows + r;
      const int64_t i = i0 + row;
      const float li = Ls[row];
      const bool vis = i < g.Tq && li < INFINITY && visible(g, b, i, j);
      float pm, ds;
      pair_grads(g, vis, s[r], dp[r], li, Ds[row], bh, i, j, pm, ds);
      dSs[row * kTile + lane] = ds;
    }
    __syncwarp();  // a warp reads back only its own rows of dSs
    for (int jj = 0; jj < kTile; jj += 4) {  // dQ_r += sum_jj dS_r,jj K_jj  (scale at the end)
      float4 dd[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) dd[r] = ld4(dSs + (warp * kRows + r) * kTile + jj);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float* kc = Ks + jj * LL + lane + 32 * c;
        const float k0 = kc[0], k1 = kc[LL], k2 = kc[2 * LL], k3 = kc[3 * LL];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          dQ[r][c] = fmaf(dd[r].w, k3, fmaf(dd[r].z, k2, fmaf(dd[r].y, k1, fmaf(dd[r].x, k0, dQ[r][c]))));
      }
    }
  }
  const float scale = float(g.scale);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= g.Tq) continue;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < g.D) dq[(bh * g.Tq + i) * g.D + lane + 32 * c] += scale * dQ[r][c];
  }
}

// ---- the simple path: f64, and heads wider than 128 ------------------------------------------
// One thread per row, the same math as the tiled kernels, read straight from global memory: the
// reference the tiled kernels can be checked against. Deterministic like them: each thread owns
// its output rows.

// Thread (bh, i): the online softmax of the forward, accumulating straight into the output row.
template <class T>
__global__ void attention_forward_naive_kernel(T* out, T* lse, const T* q, const T* k, const T* v, Geo g) {
  const int64_t n = g.BH * g.Tq;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < n; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bh = w / g.Tq, i = w % g.Tq, b = bh / g.H, h = bh % g.H;
    const T* Qi = q + b * g.qb + h * g.qh + i * g.qt;
    const T* K = k + b * g.kb + (h / g.G) * g.kh;
    const T* V = v + b * g.vb + (h / g.G) * g.vh;
    T* o = out + w * g.Dv;
    for (int64_t c = 0; c < g.Dv; ++c) o[c] = 0;  // alpha = 0 at the first key must not meet garbage
    T m = -T(INFINITY), l = 0;
    const KeyRange r = key_range(g, b, i);
    for (int64_t j = r.lo; j < r.hi; ++j) {
      if (!sees(g, b, i, r, j)) continue;
      T s = 0;
      for (int64_t d = 0; d < g.D; ++d) s += Qi[d] * K[j * g.kt + d];
      s = s * T(g.scale) + alibi_term<T>(g, bh, i, j);
      const T m_new = s > m ? s : m;
      const T alpha = exp(m - m_new), p = exp(s - m_new);
      l = l * alpha + p;
      m = m_new;
      const T pm = g.dropout > 0 ? p * keep_factor<T>(g, bh, i, j) : p;
      for (int64_t c = 0; c < g.Dv; ++c) o[c] = o[c] * alpha + pm * V[j * g.vt + c];
    }
    const T inv = l > 0 ? T(1) / l : T(0);
    for (int64_t c = 0; c < g.Dv; ++c) o[c] *= inv;
    lse[w] = l > 0 ? m + log(l) : T(INFINITY);
  }
}

// Thread (bh, i): dQ_i += scale sum_j dS_ij K_j
template <class T>
__global__ void attention_backward_q_naive_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v,
                                                  const T* lse, const T* Dd, Geo g) {
  const int64_t n = g.BH * g.Tq;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < n; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bh = w / g.Tq, i = w % g.Tq, b = bh / g.H, h = bh % g.H;
    const T li = lse[w], di = Dd[w];
    if (!(li < T(INFINITY))) continue;  // a row that saw no key: P = 0, no gradient
    const T* Qi = q + b * g.qb + h * g.qh + i * g.qt;
    const T* K = k + b * g.kb + (h / g.G) * g.kh;
    const T* V = v + b * g.vb + (h / g.G) * g.vh;
    const T* dOi = dout + w * g.Dv;
    T* dQi = dq + w * g.D;
    const KeyRange r = key_range(g, b, i);
    for (int64_t j = r.lo; j < r.hi; ++j) {
      if (!sees(g, b, i, r, j)) continue;
      T s = 0, dp = 0;
      for (int64_t d = 0; d < g.D; ++d) s += Qi[d] * K[j * g.kt + d];
      for (int64_t c = 0; c < g.Dv; ++c) dp += dOi[c] * V[j * g.vt + c];
      const T p = exp(s * T(g.scale) + alibi_term<T>(g, bh, i, j) - li),
              mk = g.dropout > 0 ? keep_factor<T>(g, bh, i, j) : T(1);
      const T ds = product_ds(g, p * (dp * mk - di));
      for (int64_t d = 0; d < g.D; ++d) dQi[d] += T(g.scale) * ds * K[j * g.kt + d];
    }
  }
}

// Thread (bh, j): dV_j += sum_i P_ij M_ij dO_i,  dK_j += scale sum_i dS_ij Q_i
template <class T>
__global__ void attention_backward_kv_naive_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                                   const T* lse, const T* Dd, Geo g) {
  const int64_t n = g.BH * g.Tk;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < n; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bh = w / g.Tk, j = w % g.Tk, b = bh / g.H, h = bh % g.H;
    const T* Kj = k + b * g.kb + (h / g.G) * g.kh + j * g.kt;
    const T* Vj = v + b * g.vb + (h / g.G) * g.vh + j * g.vt;
    const T* Q = q + b * g.qb + h * g.qh;
    T *dKj = dk + w * g.D, *dVj = dv + w * g.Dv;
    for (int64_t i = 0; i < g.Tq; ++i) {
      const T li = lse[bh * g.Tq + i];
      if (!(li < T(INFINITY)) || !visible(g, b, i, j)) continue;
      const T* Qi = Q + i * g.qt;
      const T* dOi = dout + (bh * g.Tq + i) * g.Dv;
      T s = 0, dp = 0;
      for (int64_t d = 0; d < g.D; ++d) s += Qi[d] * Kj[d];
      for (int64_t c = 0; c < g.Dv; ++c) dp += dOi[c] * Vj[c];
      const T p = exp(s * T(g.scale) + alibi_term<T>(g, bh, i, j) - li),
              mk = g.dropout > 0 ? keep_factor<T>(g, bh, i, j) : T(1);
      const T ds = product_ds(g, p * (dp * mk - Dd[bh * g.Tq + i]));
      for (int64_t c = 0; c < g.Dv; ++c) dVj[c] += p * mk * dOi[c];
      for (int64_t d = 0; d < g.D; ++d) dKj[d] += T(g.scale) * ds * Qi[d];
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

// lengths and key_mask as the kernels need them: device memory is used where it is; a host array
// is copied to a temporary device buffer, returned to the allocator when this goes out of scope.
// Freeing right after the launches is safe: every later use of the buffer is ordered after these
// kernels by the device's one stream.
struct DeviceCopy {
  void* ptr = nullptr;
  size_t bytes = 0;
  int device = 0;
  DeviceCopy() = default;
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  ~DeviceCopy() {
    if (ptr) device_free(device, ptr, bytes);
  }
  template <class U>
  const U* of(const U* p, size_t n) {
    if (!p || n == 0) return p;
    cudaPointerAttributes a{};
    cudaCheck(cudaPointerGetAttributes(&a, p));
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return p;
    device = current_device(), bytes = n * sizeof(U), ptr = device_alloc(device, bytes);
    cudaCheck(cudaMemcpyAsync(ptr, p, bytes, cudaMemcpyHostToDevice, stream()));
    return static_cast<const U*>(ptr);
  }
};

Geo make_geo(const AttentionGeom& g, DeviceCopy& lengths, DeviceCopy& key_mask, DeviceCopy& block_mask,
             DeviceCopy& alibi) {
  Geo e{};
  e.BH = g.BH, e.H = g.H, e.G = g.G, e.Tq = g.Tq, e.Tk = g.Tk, e.D = g.D, e.Dv = g.Dv;
  e.causal = g.causal, e.window = g.window;
  // cpu head_view: -1 is the stride of a contiguous (B, H, T, D) tensor
  auto resolve = [&](const Strides& s, int64_t H, int64_t T, int64_t D, int64_t& b, int64_t& h, int64_t& t) {
    t = s.t >= 0 ? s.t : D, h = s.h >= 0 ? s.h : T * t, b = s.b >= 0 ? s.b : H * h;
  };
  resolve(g.q, g.H, g.Tq, g.D, e.qb, e.qh, e.qt);
  resolve(g.k, g.H / g.G, g.Tk, g.D, e.kb, e.kh, e.kt);
  resolve(g.v, g.H / g.G, g.Tk, g.Dv, e.vb, e.vh, e.vt);
  e.scale = g.scale;
  const int64_t B = g.H > 0 ? g.BH / g.H : 0;
  e.lengths = lengths.of(g.lengths, size_t(B));
  e.key_mask = key_mask.of(g.key_mask, size_t(B * g.Tk));
  e.block_mask = block_mask.of(g.block_mask, size_t(g.block_rows * g.block_cols));
  e.block_cols = g.block_cols, e.block_size = g.block_size;
  e.dropout = g.dropout, e.keep = g.dropout > 0 ? dropout_scale<double>(g.dropout) : 1.0;
  e.seed = g.seed, e.offset = g.offset;
  e.alibi = alibi.of(g.alibi, size_t(g.H));
  e.grad_operands = g.grad_operands;
  return e;
}

// Chunks of 32 columns per lane for the tiled kernels: 1, 2 or 4; 0 when a head is too wide.
int chunks(const AttentionGeom& g) {
  const int64_t c = std::max<int64_t>(std::max<int64_t>((g.D + 31) / 32, (g.Dv + 31) / 32), 1);
  return c <= 1 ? 1 : c <= 2 ? 2 : c <= 4 ? 4 : 0;
}

// A launch of a tiled kernel with `floats` of dynamic shared memory (over 48 KiB needs an opt-in).
template <class Kernel, class... Args>
void launch_tiled(Kernel kernel, int64_t blocks, size_t floats, Args... args) {
  const size_t bytes = floats * sizeof(float);
  if (blocks > INT32_MAX) raise("cuda attention: " + std::to_string(blocks) + " blocks exceed the grid limit");
  if (bytes > 48 * 1024) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  kernel<<<unsigned(blocks), kThreads, bytes, stream()>>>(args...);
  kernelCheck();
}

template <int C>
void forward_tiled(float* out, float* lse, const float* q, const float* k, const float* v, const Geo& e) {
  launch_tiled(e.block_mask ? attention_forward_kernel<C, true> : attention_forward_kernel<C, false>,
               e.BH * ((e.Tq + kTile - 1) / kTile), forward_floats(C), out, lse, q, k, v, e);
}

template <int C>
void backward_tiled(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                    const float* lse, const float* Dd, const Geo& e) {
  if (e.Tq > 0)
    launch_tiled(e.block_mask ? attention_backward_kv_kernel<C, true> : attention_backward_kv_kernel<C, false>,
                 e.BH * ((e.Tk + kTile - 1) / kTile), backward_kv_floats(C), dk, dv, dout, q, k, v, lse, Dd, e);
  if (e.Tk > 0)
    launch_tiled(e.block_mask ? attention_backward_q_kernel<C, true> : attention_backward_q_kernel<C, false>,
                 e.BH * ((e.Tq + kTile - 1) / kTile), backward_q_floats(C), dq, dout, q, k, v, lse, Dd, e);
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionGeom& g) {
  if (g.BH == 0 || g.Tq == 0) return;
  DeviceCopy lengths, key_mask, block_mask, alibi;
  const Geo e = make_geo(g, lengths, key_mask, block_mask, alibi);
  if constexpr (std::is_same_v<T, float>) {
    const int C = chunks(g);
    if (C == 1) return forward_tiled<1>(out, lse, q, k, v, e);
    if (C == 2) return forward_tiled<2>(out, lse, q, k, v, e);
    if (C == 4) return forward_tiled<4>(out, lse, q, k, v, e);
  }
  attention_forward_naive_kernel<T><<<blocks_for(g.BH * g.Tq, 128), 128, 0, stream()>>>(out, lse, q, k, v, e);
  kernelCheck();
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionGeom& g) {
  // the gradients are written (core/kernels/attention.h): zeros first, which the tiled and naive
  // kernels below add into (a key no query sees, or no pair (i, j) at all, keeps them)
  const auto zero = [](T* p, int64_t n) {
    if (n > 0) cudaCheck(cudaMemsetAsync(p, 0, size_t(n) * sizeof(T), stream()));
  };
  zero(dq, g.BH * g.Tq * g.D), zero(dk, g.BH * g.Tk * g.D), zero(dv, g.BH * g.Tk * g.Dv);
  if (g.BH == 0 || g.Tq == 0 || g.Tk == 0) return;  // no pair (i, j)
  DeviceCopy lengths, key_mask, block_mask, alibi;
  const Geo e = make_geo(g, lengths, key_mask, block_mask, alibi);
  // D_i = dO_i . O_i, one number per query row, in a scratch buffer
  const int64_t rows = g.BH * g.Tq;
  const int device = current_device();
  T* Dd = static_cast<T*>(device_alloc(device, size_t(rows) * sizeof(T)));
  struct Release {
    int device;
    T* p;
    size_t bytes;
    ~Release() { device_free(device, p, bytes); }
  } release{device, Dd, size_t(rows) * sizeof(T)};
  attention_rowdot_kernel<T><<<blocks_for(rows * 32, 256), 256, 0, stream()>>>(Dd, dout, out, rows, g.Dv);
  kernelCheck();
  if constexpr (std::is_same_v<T, float>) {
    const int C = chunks(g);
    if (C == 1) return backward_tiled<1>(dq, dk, dv, dout, q, k, v, lse, Dd, e);
    if (C == 2) return backward_tiled<2>(dq, dk, dv, dout, q, k, v, lse, Dd, e);
    if (C == 4) return backward_tiled<4>(dq, dk, dv, dout, q, k, v, lse, Dd, e);
  }
  attention_backward_q_naive_kernel<T><<<blocks_for(rows, 128), 128, 0, stream()>>>(dq, dout, q, k, v, lse, Dd, e);
  kernelCheck();
  attention_backward_kv_naive_kernel<T><<<blocks_for(g.BH * g.Tk, 128), 128, 0, stream()>>>(dk, dv, dout, q, k, v,
                                                                                           lse, Dd, e);
  kernelCheck();
}

// The kernels of core/kernels/attention.h for the dtypes listed there.
AG_INSTANTIATE_ATTENTION_KERNELS

}  // namespace ag::cuda
