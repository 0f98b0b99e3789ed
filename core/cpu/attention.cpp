// Fused attention on the CPU. Shapes and contracts: core/kernels/attention.h. Math: autograd/ops.h,
// scaled_dot_product_attention; the fused algorithm derived: docs/math/attention.md.
//
// Forward, FlashAttention-style: for a block of kBq query rows, walk the keys in blocks of kBk,
// S = scale Q K^T for that tile (one small matrix product), mask it, and fold it into a running
// softmax (m the running max, l the sum, acc the output: online-softmax below). After the last key
// block out = acc / l, and lse = m + log l is saved. Memory: O(kBq kBk + Tk D) scratch per thread
// (a tile, and K^T, V^T of one head), nothing of size Tq x Tk.
// Backward recomputes each tile's P = e^(S - lse) from the saved lse (see attention_backward).
// The tile products are hand-written (tile_product below), not BLAS calls: see why there.
// With a block mask (a block-sparse pattern) a query block walks only the runs of block columns
// that one of its block rows keeps (for_each_key_tile): dropped blocks cost nothing.
// Threads: forward splits over (BH, query block), backward over BH; each output element is
// produced by one thread in a fixed order, so results do not depend on the thread count.
// The rules shared with the GPU kernels: which keys a query sees (core/kernels/attention_mask.h) and
// which weights dropout keeps (core/kernels/dropout_mask.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu/avx512.h"
#include "core/cpu/vecmath.h"
#include "core/kernels.h"
#include "core/kernels/attention_mask.h"
#include "core/kernels/dropout_mask.h"
#include "core/parallel.h"

namespace ag::cpu {

namespace {

// Tile sizes: the fastest of those bench_attention_tiles times (docs/benchmarks.md, "Fused
// attention"). 32 query rows step finely along the causal diagonal,
// and a 32 x 256 tile of scores fits the L1. The key range of a query block starts at its first
// visible key, so causal tiles above the diagonal are skipped.
constexpr int64_t kBq = 32;   // query rows per tile
constexpr int64_t kBk = 256;  // keys per tile
// Multiply-adds below which a run of work items stays on one thread: waking the second thread
// costs a few us, about what one thread needs for 2^16 of them. Generating a token (one query per
// head against the cache) stays on one thread; training-size heads split over the threads.
constexpr int64_t kMinWork = int64_t(1) << 16;
// The grain for parallel_for over work items of `work` multiply-adds each.
int64_t grain_for(int64_t work) { return std::max<int64_t>(1, kMinWork / std::max<int64_t>(work, 1)); }

// The masks (core/kernels/attention_mask.h): which keys each query row may see, the rule the GPU
// kernels and the composed path call too.
Visibility visibility(const AttentionGeom& g) {
  return {g.Tq, g.Tk, g.causal, g.window, g.lengths, g.key_mask, g.block_mask, g.block_cols, g.block_size};
}

// Sets s[j] = hidden for the keys j0 + j (j < nk) row i may not see: outside its range r, masked
// by key_mask, or (when `blocks`: the tile is not inside kept blocks, block_cover) in a block that
// block_mask drops. Range and blocks as plain fills, so the loops that follow stay vectorised.
template <class T>
void hide_keys(T* s, const Visibility& vis, int64_t b, int64_t i, int64_t j0, int64_t nk, KeyRange r, bool blocks,
               T hidden) {
  const int64_t lo = std::clamp<int64_t>(r.lo - j0, 0, nk), hi = std::clamp<int64_t>(r.hi - j0, lo, nk);
  for (int64_t j = 0; j < lo; ++j) s[j] = hidden;
  for (int64_t j = hi; j < nk; ++j) s[j] = hidden;
  if (vis.key_mask)
    for (int64_t j = lo; j < hi; ++j)
      if (key_masked(vis, b, j0 + j)) s[j] = hidden;
  if (blocks) {  // the block columns that row i's block row drops
    const int64_t bs = vis.block_size;
    const bool* kept = vis.block_mask + (i / bs) * vis.block_cols;
    for (int64_t c = j0 / bs; c * bs < j0 + nk; ++c)
      if (!kept[c])
        for (int64_t j = std::max<int64_t>(c * bs - j0, 0), e = std::min((c + 1) * bs - j0, nk); j < e; ++j) s[j] = hidden;
  }
}

// Adds ALiBi's bias (core/kernels/attention_mask.h) of head bh to row i of a tile of scaled scores,
// s[j] for the keys j0 + j (j < nk). Before hide_keys: a hidden key's score is still -inf.
template <class T>
void add_alibi(T* s, const AttentionGeom& g, int64_t bh, int64_t i, int64_t j0, int64_t nk) {
  const double slope = g.alibi[bh % g.H];
#pragma omp simd
  for (int64_t j = 0; j < nk; ++j) s[j] += T(alibi_bias(slope, g.Tq, g.Tk, i, j0 + j));
}

// Calls f(j0, nk, blocks) for the key tiles [j0, j0 + nk) (nk <= kBk) that query rows [i0, i1)
// walk within span: the runs of block columns some of their block rows keep (kept_run; all of span
// without a block mask), kBk keys at a time. blocks: the tile overlaps a dropped block, so its
// rows need the per-element block check (block_cover is not all). Keys of block columns that every
// row drops are never read: the cost grows with the kept blocks, not with Tq x Tk.
template <class F>
void for_each_key_tile(const Visibility& vis, int64_t i0, int64_t i1, KeyRange span, F f) {
  for (KeyRange run = kept_run(vis, i0, i1, span.lo, span.hi); !run.empty(); run = kept_run(vis, i0, i1, run.hi, span.hi))
    for (int64_t j0 = run.lo; j0 < run.hi; j0 += kBk) {
      const int64_t nk = std::min(kBk, run.hi - j0);
      f(j0, nk, block_cover(vis, i0, i1, j0, j0 + nk) != BlockCover::all);
    }
}

// Dropout factor of weight (bh, i, j) (core/kernels/dropout_mask.h): 1 / (1 - p) or 0, from the
// same Philox element as ag::dropout over a contiguous (BH, Tq, Tk) tensor, so the fused and the
// composed paths drop the same weights.
template <class T>
T keep_factor(const AttentionGeom& g, int64_t bh, int64_t i, int64_t j) {
  return dropout_keep(g.seed, g.offset, attention_dropout_element(bh, i, j, g.Tq, g.Tk), g.dropout)
             ? dropout_scale<T>(g.dropout)
             : T(0);
}

// ---- the tile products ----------------------------------------------------------------------
// Every product of the fused kernels has the same form,
//   C (M, N) = alpha A B  (+ C when add),   A (M, K), B (K, N), C row-major with leading dims,
// where A is read through two strides (element (r, p) at A[r ars + p acs]), so a transposed A such
// as P^T or dS^T costs nothing, and B is row-major (contiguous along N). S = Q K^T and dP = dO V^T
// take that form with B = K^T or V^T, transposed once per head into scratch (transpose below).
//
// Why not gemm_blas: the tiles are tiny (32 x 256 x 32) and each BLAS call packs both operands
// again (K^T once per query block, where this kernel transposes K once per head), and the speed
// depends on which kernels OpenBLAS picks (docs/benchmarks.md, "Fused attention").
// Here C is cut into blocks of kR rows x kW columns whose sums live in registers
// while p runs over K: per p, kR broadcasts of A, two vector loads of B and 2 kR fused multiply-adds,
// nothing stored until the block is done (GCC -O3 -march=native turns the p loop into exactly
// that: 8 vbroadcastss, 2 vmovups, 16 vfmadd231ps). With AVX-512 and floats, 8 rows x 32 columns
// = 16 accumulator registers of the 32 (the same for doubles: 8 x 16).
//
// The full-width blocks are written with GCC's vector types (vector_product), so that B's vectors
// are loaded once per p into registers: written as scalar loops over the columns, GCC loads each
// vector of B again as the memory operand of every multiply-add, and the load ports bound the loop.
// On AVX2, 6 rows x 16 columns = 12 accumulators + 2 of B + 1 broadcast = 15 of the 16 registers,
// the shape of the GEMM's kernel_avx2: 12 independent chains of multiply-adds, where the FMA latency
// (4-5 cycles) at 2 per cycle needs 10. Each sum runs over p in order in one accumulator, whatever the block shape.
#if defined(__AVX512F__)
constexpr int kVecBytes = 64, kR = 8;
#else
constexpr int kVecBytes = 32, kR = 6;
#endif
template <class T>
constexpr int kW = 2 * kVecBytes / int(sizeof(T));  // columns of C per register block: two vectors

// A vector register of T (GCC's vector extension: element-wise arithmetic, scalar operands
// broadcast). Loads and stores go through memcpy, which compiles to one unaligned move.
template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};

// One full-width register block: C[r][c] = alpha sum_p A[r, p] B[p, c] (+ C[r][c]), r < R, c < NV
// vectors.
template <class T, int R, int NV>
inline void vector_product(T* C, int64_t ldc, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
                           int64_t K, T alpha, bool add) {
  using V = typename VecOf<T>::type;
  constexpr int L = int(sizeof(V) / sizeof(T));
  V acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t p = 0; p < K; ++p) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], B + p * ldb + v * L, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const T a = A[r * ars + p * acs];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      T* c = C + r * ldc + v * L;
      V y = alpha * acc[r][v];
      if (add) {
        V old;
        std::memcpy(&old, c, sizeof(V));
        y = old + y;
      }
      std::memcpy(c, &y, sizeof(V));
    }
}

// One register block: C[r][c] = alpha sum_p A[r, p] B[p, c] (+ C[r][c]),  r < R,  c < n, with n = CW
// (a compile-time width, so each row of sums is CW / floats-per-vector registers) when kFull.
template <class T, int R, int CW, bool kFull>
inline void block_product(T* C, int64_t ldc, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
                          int64_t K, int64_t n, T alpha, bool add) {
  if constexpr (kFull && CW * sizeof(T) % kVecBytes == 0) {
    vector_product<T, R, int(CW * sizeof(T) / kVecBytes)>(C, ldc, A, ars, acs, B, ldb, K, alpha, add);
    return;
  }
  const int64_t w = kFull ? CW : n;
  T acc[R][CW] = {};
  for (int64_t p = 0; p < K; ++p) {
    const T* b = B + p * ldb;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const T a = A[r * ars + p * acs];
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) acc[r][c] += a * b[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    T* cr = C + r * ldc;
    if (add) {
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) cr[c] += alpha * acc[r][c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) cr[c] = alpha * acc[r][c];
    }
  }
}

// The rows of one column block of width CW (kFull) or n < CW, kR rows at a time.
template <class T, int CW, bool kFull>
void column_block(int64_t M, int64_t n, T alpha, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
                  int64_t K, T* C, int64_t ldc, bool add) {
  int64_t i = 0;
  for (; i + kR <= M; i += kR)
    block_product<T, kR, CW, kFull>(C + i * ldc, ldc, A + i * ars, ars, acs, B, ldb, K, n, alpha, add);
  if constexpr (kR > 4)  // the rest of 32 rows in 6-row blocks: one block of 2
    for (; i + 2 <= M; i += 2)
      block_product<T, 2, CW, kFull>(C + i * ldc, ldc, A + i * ars, ars, acs, B, ldb, K, n, alpha, add);
  for (; i < M; ++i) block_product<T, 1, CW, kFull>(C + i * ldc, ldc, A + i * ars, ars, acs, B, ldb, K, n, alpha, add);
}

// C (M, N) = alpha A B (+ C when add), as described above, block by block: full blocks of W columns,
// then one of W/2 (a single vector: the N = 16 of a small head's P V, dQ, dK, dV products, which
// a runtime width would leave in memory instead of registers), then the ragged rest.
template <class T>
void tile_product(int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t ars, int64_t acs, const T* B,
                  int64_t ldb, T* C, int64_t ldc, bool add) {
  constexpr int W = kW<T>, H = kW<T> / 2;
  int64_t j = 0;
  for (; j + W <= N; j += W) column_block<T, W, true>(M, W, alpha, A, ars, acs, B + j, ldb, K, C + j, ldc, add);
  if (j + H <= N) column_block<T, H, true>(M, H, alpha, A, ars, acs, B + j, ldb, K, C + j, ldc, add), j += H;
  if (j < N) column_block<T, H, false>(M, N - j, alpha, A, ars, acs, B + j, ldb, K, C + j, ldc, add);
}

// xt (cols, rows) = x^T for x (rows, cols), both row-major: K or V of one head turned so that the
// products above run along the keys. Done once per head, not per tile, and written row by row of
// xt (contiguous stores): stores down the columns of xt, kBk elements apart, would put the 32
// stores of a row of x into 4 cache sets and thrash the L1 (docs/benchmarks.md, "Fused attention").
// x has row stride ld (>= cols); xt has row stride ldt (>= rows), from transposed_ld.
// A 16-bit x (attention_forward_16) is widened to T on the way, exactly.
template <class T, class In>
void transpose(T* xt, int64_t ldt, const In* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t c = 0; c < cols; ++c)
#pragma omp simd
    for (int64_t r = 0; r < rows; ++r) xt[c * ldt + r] = storage_cast<T>(x[r * ld + c]);
}

// Rows [0, n) of x (row stride ld, cols elements each) as T: x itself when it is T, else widened
// (exactly) into buf, row stride cols. The products read T.
template <class T, class In>
std::pair<const T*, int64_t> rows_as(const In* x, int64_t ld, int64_t n, int64_t cols, std::vector<T>& buf) {
  if constexpr (std::is_same_v<In, T>) {
    return {x, ld};
  } else {
    buf.resize(size_t(n * cols));
    for (int64_t r = 0; r < n; ++r)
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) buf[size_t(r * cols + c)] = storage_cast<T>(x[r * ld + c]);
    return {buf.data(), cols};
  }
}

// The row stride of K^T and V^T for Tk keys: Tk rounded up to a cache line, plus one line. A tile
// product reads D rows of K^T at this stride; with a stride of Tk itself, a power-of-two Tk of
// 1024 or more puts all of them in one set of the L1 (its sets repeat every 4 KiB), which holds
// only 8 of them. The extra line moves each row to the next set (docs/benchmarks.md, "Long
// sequences").
template <class T>
int64_t transposed_ld(int64_t Tk) {
  constexpr int64_t line = 64 / int64_t(sizeof(T));
  return (Tk + line - 1) / line * line + line;
}

// ---- products of bf16 operands on AVX512-BF16 ----------------------------------------------------
// Under bf16 autocast q, k and v hold bf16 values, so S = scale Q K^T can multiply them as they are:
// VDPBF16PS treats each 32-bit lane as a pair of bf16 values and adds both products into the
// lane's f32 sum (each product is exact in f32, 8 x 8 significant bits), 32 multiply-adds per
// instruction where an f32 FMA does 16. The pairs run along the summed dimension: word pp of row i
// of Q is (Q[i][2pp], Q[i][2pp + 1]), two adjacent values, read as they are; K^T is turned once
// per head into D/2 rows of such words (transpose_words). The products are the f32 tile products'
// (the same exact products), summed two at a time, so they differ from them by f32 rounding only,
// as sbgemm's differ from the emulation (core/cpu/gemm.cpp); each sum runs over pp in order in one
// register, so the results do not depend on the thread count.
// Backward's products whose operands are bf16 under autocast run here too: dP = dO V^T (dO rounded
// by the caller, V^T in pairs along Dv), dQ = scale dS K and dK = scale dS^T Q (dS rounded,
// AttentionGeom::grad_operands; K and Q in pairs of rows, pair_rows). P V and dV = P^T dO keep f32
// products: P is not rounded (the forward's normaliser is known only after the last key tile).
// Used when the CPU has AVX512-BF16 and the library's bf16 products are native (sbgemm_native),
// for an even head size (and an even Dv for backward's); else the f32 tile products of the
// widened values compute the same numbers, as for fp16.
#if defined(__x86_64__)
#define AG_ATTENTION_BF16 1

// The 32-bit word of the bf16 pair at x (x[0] in its low half): one unaligned load.
inline uint32_t pair_word(const bf16* x) {
  uint32_t w;
  std::memcpy(&w, x, sizeof w);
  return w;
}

// kt (D/2 rows, row stride ldt) = the pairs of x (rows of D bf16 values, row stride ld, D even)
// turned: kt[pp ldt + r] = (x[r][2pp], x[r][2pp + 1]). Written row by row of kt, as transpose.
void transpose_words(uint32_t* kt, int64_t ldt, const bf16* x, int64_t rows, int64_t D, int64_t ld) {
  for (int64_t pp = 0; pp < D / 2; ++pp)
    for (int64_t r = 0; r < rows; ++r) kt[pp * ldt + r] = pair_word(x + r * ld + 2 * pp);
}

// C[r][c] = alpha sum_pp A(r, pp) . B(pp, c) (+ C[r][c] when add) for r < R and c < n <= 32:
// A(r, pp) the word at a + r lda + 2 pp (bf16 values), B(pp, c) = b[pp ldb + c]. 2 R accumulators
// of 16 sums.
template <int R, bool kFull>
AG_BF16_TARGET void pair_block(float* C, int64_t ldc, const bf16* a, int64_t lda, const uint32_t* b, int64_t ldb,
                               int64_t kp, int64_t n, float alpha, bool add) {
  const __mmask16 m0 = kFull ? __mmask16(0xffff) : first_lanes(n), m1 = kFull ? __mmask16(0xffff) : first_lanes(n - 16);
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = _mm512_setzero_ps(), acc[r][1] = _mm512_setzero_ps();
  for (int64_t pp = 0; pp < kp; ++pp) {
    const uint32_t* bp = b + pp * ldb;
    const __m512bh b0 = (__m512bh)(kFull ? _mm512_loadu_si512(bp) : _mm512_maskz_loadu_epi32(m0, bp));
    const __m512bh b1 = (__m512bh)(kFull ? _mm512_loadu_si512(bp + 16) : _mm512_maskz_loadu_epi32(m1, bp + 16));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(int(pair_word(a + r * lda + 2 * pp)));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    __m512 y0 = _mm512_mul_ps(va, acc[r][0]), y1 = _mm512_mul_ps(va, acc[r][1]);
    if (add) {  // C + alpha acc, as tile_product adds
      y0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, C + r * ldc), y0);
      y1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, C + r * ldc + 16), y1);
    }
    _mm512_mask_storeu_ps(C + r * ldc, m0, y0);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, y1);
  }
}

template <bool kFull>
AG_BF16_TARGET void pair_columns(int64_t M, int64_t n, int64_t kp, float alpha, const bf16* a, int64_t lda,
                                 const uint32_t* b, int64_t ldb, float* C, int64_t ldc, bool add) {
  int64_t i = 0;
  for (; i + 8 <= M; i += 8) pair_block<8, kFull>(C + i * ldc, ldc, a + i * lda, lda, b, ldb, kp, n, alpha, add);
  for (; i < M; ++i) pair_block<1, kFull>(C + i * ldc, ldc, a + i * lda, lda, b, ldb, kp, n, alpha, add);
}

// C (M, N) = alpha A B (+ C when add) over kp pairs of the sum: A (M rows of 2 kp bf16 values,
// row stride lda, the pairs side by side), B = kp rows of N words (row stride ldb), word (pp, c)
// holding B's rows 2 pp and 2 pp + 1 of column c (transpose_words, pair_rows); C row-major with
// row stride ldc. An odd count of summed terms pads A's last pair with a zero.
AG_BF16_TARGET void pair_product(int64_t M, int64_t N, int64_t kp, float alpha, const bf16* a, int64_t lda,
                                 const uint32_t* b, int64_t ldb, float* C, int64_t ldc, bool add) {
  int64_t j = 0;
  for (; j + 32 <= N; j += 32) pair_columns<true>(M, 32, kp, alpha, a, lda, b + j, ldb, C + j, ldc, add);
  if (j < N) pair_columns<false>(M, N - j, kp, alpha, a, lda, b + j, ldb, C + j, ldc, add);
}

// w (ceil(rows / 2) rows of cols words, row stride ldw) = the rows of x (rows x cols bf16 values,
// row stride ld) in pairs: w[rr ldw + c] = (x[2 rr][c], x[2 rr + 1][c]), the second a zero past an
// odd last row. The B operand of a product summed along x's rows (pair_product).
void pair_rows(uint32_t* w, int64_t ldw, const bf16* x, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t rr = 0; 2 * rr < rows; ++rr) {
    const bf16* x0 = x + 2 * rr * ld;
    if (2 * rr + 1 < rows) {
      const bf16* x1 = x0 + ld;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) w[rr * ldw + c] = uint32_t(x0[c].bits) | uint32_t(x1[c].bits) << 16;
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) w[rr * ldw + c] = uint32_t(x0[c].bits);
    }
  }
}
#endif

// transpose_words and pair_product for In = bf16 (native_scores is false for every other In).
template <class In>
void transpose_pairs(uint32_t* kt, int64_t ldt, const In* x, int64_t rows, int64_t D, int64_t ld) {
#if defined(AG_ATTENTION_BF16)
  if constexpr (std::is_same_v<In, bf16>) transpose_words(kt, ldt, x, rows, D, ld);
#endif
  (void)kt, (void)ldt, (void)x, (void)rows, (void)D, (void)ld;
}
template <class T, class A>
void product_native(int64_t M, int64_t N, int64_t kp, T alpha, const A* a, int64_t lda, const uint32_t* b,
                    int64_t ldb, T* C, int64_t ldc, bool add) {
#if defined(AG_ATTENTION_BF16)
  if constexpr (std::is_same_v<A, bf16> && std::is_same_v<T, float>) pair_product(M, N, kp, alpha, a, lda, b, ldb, C, ldc, add);
#endif
  (void)M, (void)N, (void)kp, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)C, (void)ldc, (void)add;
}
template <class In>
void pair_rows_of(uint32_t* w, int64_t ldw, const In* x, int64_t ld, int64_t rows, int64_t cols) {
#if defined(AG_ATTENTION_BF16)
  if constexpr (std::is_same_v<In, bf16>) pair_rows(w, ldw, x, ld, rows, cols);
#endif
  (void)w, (void)ldw, (void)x, (void)ld, (void)rows, (void)cols;
}

// Whether the scores of q, k stored as In run on pair_product (above): bf16 operands summed in f32,
// an even head size, and the library's bf16 products native.
template <class T, class In>
bool native_scores(int64_t D) {
#if defined(AG_ATTENTION_BF16)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<In, bf16>) return D % 2 == 0 && sbgemm_native();
#endif
  (void)D;
  return false;
}

// Where head bh of a (B, H, T, D) input starts, and its row stride.
struct HeadView {
  int64_t offset, ld;
};
HeadView head_view(const Strides& s, int64_t bh, int64_t H, int64_t T, int64_t D) {
  const int64_t t = s.t >= 0 ? s.t : D, h = s.h >= 0 ? s.h : T * t, b = s.b >= 0 ? s.b : H * h;
  return {(bh / H) * b + (bh % H) * h, t};
}
// The key/value head that query head bh reads, as a (batch, head) index over H / G heads.
int64_t kv_head(const AttentionGeom& g, int64_t bh) { return (bh / g.H) * (g.H / g.G) + (bh % g.H) / g.G; }

}  // namespace

namespace {

template <class T, class In>
void forward(T* out, T* lse, const In* q, const In* k, const In* v, const AttentionGeom& g) {
  const int64_t nqb = (g.Tq + kBq - 1) / kBq, D = g.D, Dv = g.Dv;
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t item_work = std::min(kBq, g.Tq) * g.Tk * (D + Dv);
  const Visibility vis = visibility(g);
  const bool native = native_scores<T, In>(D);  // outside the threads: may read ATTOGRAD_GEMM (and throw)
  parallel_for(g.BH * nqb, grain_for(item_work), [&](int64_t w0, int64_t w1) {
    const int64_t ldt = transposed_ld<T>(g.Tk);
    std::vector<T> S(size_t(kBq * kBk)), Kt(size_t(native ? 0 : D * ldt)), acc(size_t(kBq * Dv)), m(kBq), l(kBq);
    std::vector<uint32_t> Ktw(size_t(native ? D / 2 * ldt : 0));  // K^T as bf16 pairs (native)
    std::vector<T> Qw, Vw;  // 16-bit q and v widened (rows_as); unused when In is T
    int64_t kt_of = -1;  // the key head whose K^T is in Kt: a thread's work items run head by head
    const T* V = nullptr;  // that head's values, row stride ldv
    int64_t ldv = 0;
    std::vector<KeyRange> range(kBq);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bh = w / nqb, i0 = (w % nqb) * kBq, nq = std::min(kBq, g.Tq - i0), b = bh / g.H;
      const int64_t kvh = kv_head(g, bh);
      const HeadView hq = head_view(g.q, bh, g.H, g.Tq, D), hk = head_view(g.k, kvh, g.H / g.G, g.Tk, D),
                     hv = head_view(g.v, kvh, g.H / g.G, g.Tk, Dv);
      const T* Q = nullptr;
      int64_t ldq = 0;
      if (!native) std::tie(Q, ldq) = rows_as<T>(q + hq.offset + i0 * hq.ld, hq.ld, nq, D, Qw);
      if (kt_of != kvh) {
        if (native)
          transpose_pairs(Ktw.data(), ldt, k + hk.offset, g.Tk, D, hk.ld);  // K^T (D/2, Tk) in pairs
        else
          transpose(Kt.data(), ldt, k + hk.offset, g.Tk, D, hk.ld);  // K^T (D, Tk)
        std::tie(V, ldv) = rows_as<T>(v + hv.offset, hv.ld, g.Tk, Dv, Vw);
        kt_of = kvh;
      }
      // the keys any row of the block sees: no key past the last one is read
      const KeyRange span = key_hull(vis, b, i0, i0 + nq);
      for (int64_t i = 0; i < nq; ++i) {
        range[i] = key_range(vis, b, i0 + i);
        m[i] = ninf, l[i] = 0;
      }
      std::fill(acc.begin(), acc.begin() + nq * Dv, T(0));
      for_each_key_tile(vis, i0, i0 + nq, span, [&](int64_t j0, int64_t nk, bool blocks) {
        // S = scale Q K_j^T   (nq, nk)
        if (native)
          product_native(nq, nk, D / 2, T(g.scale), q + hq.offset + i0 * hq.ld, hq.ld, Ktw.data() + j0, ldt, S.data(), kBk, false);
        else
          tile_product(nq, nk, D, T(g.scale), Q, ldq, 1, Kt.data() + j0, ldt, S.data(), kBk, false);
        for (int64_t i = 0; i < nq; ++i) {
          T* s = S.data() + i * kBk;
          if (g.alibi) add_alibi(s, g, bh, i0 + i, j0, nk);
          hide_keys(s, vis, b, i0 + i, j0, nk, range[i], blocks, ninf);
          T mx = ninf;
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j < nk; ++j) mx = s[j] > mx ? s[j] : mx;
          // snippet-begin: online-softmax
          const T m_new = mx > m[i] ? mx : m[i];
          if (m_new == ninf) {  // nothing visible yet in this row: contributes nothing
            for (int64_t j = 0; j < nk; ++j) s[j] = 0;
            continue;
          }
          const T alpha = vexp(m[i] - m_new);  // rescales what was summed under the old max
          T rs = 0;
#pragma omp simd reduction(+ : rs)
          for (int64_t j = 0; j < nk; ++j) {
            s[j] = vexp(s[j] - m_new);  // masked: e^-inf = 0
            rs += s[j];
          }
          l[i] = l[i] * alpha + rs;
          m[i] = m_new;
          T* a = acc.data() + i * Dv;
#pragma omp simd
          for (int64_t c = 0; c < Dv; ++c) a[c] *= alpha;
          if (g.dropout > 0)  // the normaliser l counts every weight; only the values are dropped
            for (int64_t j = 0; j < nk; ++j) s[j] *= keep_factor<T>(g, bh, i0 + i, j0 + j);
          // snippet-end: online-softmax
        }
        // acc += P V_j   (nq, Dv)
        tile_product(nq, Dv, nk, T(1), S.data(), kBk, 1, V + j0 * ldv, ldv, acc.data(), Dv, true);
      });
      for (int64_t i = 0; i < nq; ++i) {
        T* o = out + (bh * g.Tq + i0 + i) * Dv;
        const T* a = acc.data() + i * Dv;
        // a row with no visible key gives zeros (not NaN) and lse = +inf, which backward reads as P = 0
        const T inv = l[i] > 0 ? T(1) / l[i] : T(0);
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) o[c] = a[c] * inv;
        lse[bh * g.Tq + i0 + i] = l[i] > 0 ? m[i] + std::log(l[i]) : std::numeric_limits<T>::infinity();
      }
    }
  });
}

// Backward (math: autograd/ops.h, scaled_dot_product_attention; derived in docs/math/attention.md,
// "Backward, through both matmuls and the softmax"): for each block of query rows, D_i = dO_i . O_i
// first (Dd), then key tile by key tile dS, dQ, dK and dV, with the tile's P rebuilt from the
// saved lse instead of stored (the ALiBi bias, a constant, added again). Under autocast
// (g.grad_operands) dO comes rounded and dS is rounded before dQ and dK, as every product's
// incoming gradient is (matmul's backward): D_i reads the rounded dO, and P stays f32.
template <class T, class In>
void backward(T* dq, T* dk, T* dv, const T* dout, const In* q, const In* k, const In* v, const T* out, const T* lse,
              const AttentionGeom& g) {
  const int64_t D = g.D, Dv = g.Dv;
  const Visibility vis = visibility(g);
  const bool native = native_scores<T, In>(D);  // as in the forward
  // autocast: dS rounded before dQ and dK (dout came rounded); with bf16 pairs on VDPBF16PS for
  // dO V^T, dS K and dS^T Q where the scores run there and Dv is even too
  const Precision gp = std::is_same_v<T, float> ? g.grad_operands : Precision::fp32;
  const bool native_grads = native && gp == Precision::bf16 && Dv % 2 == 0;
  parallel_for(g.BH, grain_for(2 * g.Tq * g.Tk * (D + Dv)), [&](int64_t w0, int64_t w1) {
    const int64_t ldt = transposed_ld<T>(g.Tk);
    std::vector<T> P(size_t(kBq * kBk)), dP(size_t(kBq * kBk)), Kt(size_t(native ? 0 : D * ldt)),
        Vt(size_t(native_grads ? 0 : Dv * ldt)), Dd(kBq);
    std::vector<uint32_t> Ktw(size_t(native ? D / 2 * ldt : 0));  // K^T as bf16 pairs (native)
    // native_grads: V^T in pairs along Dv; K in pairs of rows from an even (Kp0) and an odd (Kp1)
    // key; a query block's rounded dO and Q^T (D rows of its queries); a tile's rounded dS, as rows
    // (dSb) and in pairs of rows (dSw); the head's dK^T, summed tile by tile (dKt: dK = scale
    // dS^T Q runs as dK^T = scale Q^T dS, whose pairs, two rows of dS, are contiguous)
    const int64_t kpr = native_grads ? (g.Tk + 1) / 2 : 0;
    std::vector<uint32_t> Vtw(size_t(native_grads ? Dv / 2 * ldt : 0)), Kp0(size_t(kpr * D)), Kp1(size_t(kpr * D)),
        dSw(size_t(native_grads ? kBq / 2 * kBk : 0));
    std::vector<bf16> dOb(size_t(native_grads ? kBq * Dv : 0)), dSb(size_t(native_grads ? kBq * kBk : 0)),
        Qt(size_t(native_grads ? D * kBq : 0));
    std::vector<T> dKt(size_t(native_grads ? D * ldt : 0));
    std::vector<T> Qw, Kw;  // 16-bit q and k widened (rows_as); unused when In is T
    std::vector<KeyRange> range(kBq);
    for (int64_t bh = w0; bh < w1; ++bh) {
      const int64_t b = bh / g.H;
      const int64_t kvh = kv_head(g, bh);
      const HeadView hq = head_view(g.q, bh, g.H, g.Tq, D), hk = head_view(g.k, kvh, g.H / g.G, g.Tk, D),
                     hv = head_view(g.v, kvh, g.H / g.G, g.Tk, Dv);
      const T *K = nullptr, *Qh = nullptr;
      int64_t ldk = 0, ldq = 0;
      if (!native_grads) {
        std::tie(K, ldk) = rows_as<T>(k + hk.offset, hk.ld, g.Tk, D, Kw);
        std::tie(Qh, ldq) = rows_as<T>(q + hq.offset, hq.ld, g.Tq, D, Qw);
      }
      T *dK = dk + bh * g.Tk * D, *dV = dv + bh * g.Tk * Dv;
      // the head's gradients are written (=): zeroed here, in this thread's cache, and then summed
      // into tile by tile; a separate zero fill of the whole tensors first would write them to
      // memory and read them back (ViT's step: 20 MB each way)
      std::fill_n(dq + bh * g.Tq * D, g.Tq * D, T(0));
      std::fill_n(dK, g.Tk * D, T(0));
      std::fill_n(dV, g.Tk * Dv, T(0));
      if (native)
        transpose_pairs(Ktw.data(), ldt, k + hk.offset, g.Tk, D, hk.ld);  // K^T (D/2, Tk) in pairs
      else
        transpose(Kt.data(), ldt, K, g.Tk, D, ldk);  // K^T (D, Tk)
      if (native_grads) {
        transpose_pairs(Vtw.data(), ldt, v + hv.offset, g.Tk, Dv, hv.ld);  // V^T (Dv/2, Tk) in pairs
        pair_rows_of(Kp0.data(), D, k + hk.offset, hk.ld, g.Tk, D);        // (K_0, K_1), (K_2, K_3), ...
        if (g.Tk > 1) pair_rows_of(Kp1.data(), D, k + hk.offset + hk.ld, hk.ld, g.Tk - 1, D);  // (K_1, K_2), ...
        for (int64_t c = 0; c < D; ++c) std::fill_n(dKt.data() + c * ldt, g.Tk, T(0));
      } else {
        transpose(Vt.data(), ldt, v + hv.offset, g.Tk, Dv, hv.ld);  // V^T (Dv, Tk)
      }
      for (int64_t i0 = 0; i0 < g.Tq; i0 += kBq) {
        const int64_t nq = std::min(kBq, g.Tq - i0), nqp = (nq + 1) / 2 * 2;  // nqp: even, for dS^T's pairs
        const T *dO = dout + (bh * g.Tq + i0) * Dv, *O = out + (bh * g.Tq + i0) * Dv;
        const T* Q = native_grads ? nullptr : Qh + i0 * ldq;
        const T* L = lse + bh * g.Tq + i0;
        T* dQ = dq + (bh * g.Tq + i0) * D;
        const KeyRange span = key_hull(vis, b, i0, i0 + nq);  // as in the forward
        for (int64_t i = 0; i < nq; ++i) {
          range[i] = key_range(vis, b, i0 + i);
          T d = 0;  // a vector reduction: summed in order, it would be a chain of dependent adds
#pragma omp simd reduction(+ : d)
          for (int64_t c = 0; c < Dv; ++c) d += dO[i * Dv + c] * O[i * Dv + c];
          Dd[i] = d;
        }
        if (native_grads) {  // dO (rounded by the caller: exact) and Q^T, an odd last query paired with 0
          for (int64_t e = 0; e < nq * Dv; ++e) dOb[size_t(e)] = bf16(float(dO[e]));
          const In* Qb = q + hq.offset + i0 * hq.ld;
          for (int64_t i = 0; i < nqp; ++i)
            for (int64_t c = 0; c < D; ++c) Qt[size_t(c * kBq + i)] = i < nq ? storage_cast<bf16>(Qb[i * hq.ld + c]) : bf16{};
        }
        for_each_key_tile(vis, i0, i0 + nq, span, [&](int64_t j0, int64_t nk, bool blocks) {
          const int64_t nkp = (nk + 1) / 2 * 2;  // even, for dS's pairs
          if (native)  // S
            product_native(nq, nk, D / 2, T(g.scale), q + hq.offset + i0 * hq.ld, hq.ld, Ktw.data() + j0, ldt, P.data(),
                           kBk, false);
          else
            tile_product(nq, nk, D, T(g.scale), Q, ldq, 1, Kt.data() + j0, ldt, P.data(), kBk, false);
          if (native_grads)  // dO V^T
            product_native(nq, nk, Dv / 2, T(1), dOb.data(), Dv, Vtw.data() + j0, ldt, dP.data(), kBk, false);
          else
            tile_product(nq, nk, Dv, T(1), dO, Dv, 1, Vt.data() + j0, ldt, dP.data(), kBk, false);
          for (int64_t i = 0; i < nq; ++i) {
            T *p = P.data() + i * kBk, *dp = dP.data() + i * kBk;
            // a row that saw no key (lse = +inf) has P = 0: hide all of it
            const bool none = !(L[i] < std::numeric_limits<T>::infinity());
            if (g.alibi) add_alibi(p, g, bh, i0 + i, j0, nk);
            hide_keys(p, vis, b, i0 + i, j0, nk, none ? KeyRange{0, 0} : range[i], blocks && !none,
                      -std::numeric_limits<T>::infinity());
            // snippet-begin: attention-backward-ds
            const T li = none ? T(0) : L[i], di = Dd[i];
            if (g.dropout > 0) {
              for (int64_t j = 0; j < nk; ++j) {
                const T pij = vexp(p[j] - li), mij = keep_factor<T>(g, bh, i0 + i, j0 + j);
                dp[j] = pij * (dp[j] * mij - di);  // dS
                p[j] = pij * mij;                  // the weights V saw
              }
            } else {
#pragma omp simd
              for (int64_t j = 0; j < nk; ++j) {
                const T pij = vexp(p[j] - li);  // hidden keys: e^-inf = 0
                dp[j] = pij * (dp[j] - di);     // dS
                p[j] = pij;
              }
            }
            // snippet-end: attention-backward-ds
            // dS as dQ and dK read it (AttentionGeom::grad_operands)
            if (gp == Precision::bf16) {
#pragma omp simd
              for (int64_t j = 0; j < nk; ++j) dp[j] = T(pw::round_bf16(float(dp[j])));
            } else if (gp == Precision::fp16) {
              for (int64_t j = 0; j < nk; ++j) dp[j] = T(pw::round_fp16(float(dp[j])));
            }
            if (native_grads) {  // dS in bf16 (the top halves of the rounded values), an odd last pair padded with 0
              bf16* ds = dSb.data() + i * kBk;
#pragma omp simd
              for (int64_t j = 0; j < nk; ++j) ds[j].bits = pw::bf16_bits(float(dp[j]));
              if (nk < nkp) ds[nk] = bf16{};
            }
          }
          // dV_j += (P M)^T dO ;  dQ_i += scale dS K_j ;  dK_j += scale dS^T Q_i
          tile_product(nk, Dv, nq, T(1), P.data(), 1, kBk, dO, Dv, dV + j0 * Dv, Dv, true);
          if (native_grads) {
            const uint32_t* Kj = (j0 % 2 == 0 ? Kp0.data() : Kp1.data()) + j0 / 2 * D;  // rows (j0 + 2 jj, + 1)
            product_native(nq, D, nkp / 2, T(g.scale), dSb.data(), kBk, Kj, D, dQ, D, true);
            pair_rows_of(dSw.data(), kBk, dSb.data(), kBk, nq, nk);  // (dS[2 ii][j], dS[2 ii + 1][j])
            product_native(D, nk, nqp / 2, T(g.scale), Qt.data(), kBq, dSw.data(), kBk, dKt.data() + j0, ldt, true);
          } else {
            tile_product(nq, D, nk, T(g.scale), dP.data(), kBk, 1, K + j0 * ldk, ldk, dQ, D, true);
            tile_product(nk, D, nq, T(g.scale), dP.data(), 1, kBk, Q, ldq, dK + j0 * D, D, true);
          }
        });
      }
      if (native_grads)  // dK += (dK^T)^T
        for (int64_t j = 0; j < g.Tk; ++j)
          for (int64_t c = 0; c < D; ++c) dK[j * D + c] += dKt[size_t(c * ldt + j)];
    }
  });
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionGeom& g) {
  forward(out, lse, q, k, v, g);
}
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionGeom& g) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, g);
}
template <class In>
void attention_forward_16(float* out, float* lse, const In* q, const In* k, const In* v, const AttentionGeom& g) {
  forward(out, lse, q, k, v, g);
}
template <class In>
void attention_backward_16(float* dq, float* dk, float* dv, const float* dout, const In* q, const In* k, const In* v,
                           const float* out, const float* lse, const AttentionGeom& g) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, g);
}

// The kernels of core/kernels/attention.h for the dtypes listed there.
AG_INSTANTIATE_ATTENTION_KERNELS
template void attention_forward_16<bf16>(float*, float*, const bf16*, const bf16*, const bf16*, const AttentionGeom&);
template void attention_forward_16<f16>(float*, float*, const f16*, const f16*, const f16*, const AttentionGeom&);
template void attention_backward_16<bf16>(float*, float*, float*, const float*, const bf16*, const bf16*, const bf16*,
                                          const float*, const float*, const AttentionGeom&);
template void attention_backward_16<f16>(float*, float*, float*, const float*, const f16*, const f16*, const f16*,
                                         const float*, const float*, const AttentionGeom&);

}  // namespace ag::cpu
