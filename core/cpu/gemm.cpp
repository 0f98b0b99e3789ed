// attograd's own single-precision GEMM, used by matmul for f32. Shapes and contract:
// core/kernels/matmul.h, sgemm (c (M, N) = alpha op(a) op(b) + beta c, row-major).
//
// The algorithm is Goto's (as in BLIS), five loops around a small register-blocked product:
//   jc: columns of C in blocks of nc         the B block (kc x nc) lives in L2/L3
//    pc: the inner dim in blocks of kc       pack op(b)[pc:+kc, jc:+nc] into NR-wide column panels
//     ic: rows of C in blocks of mc          pack op(a)[ic:+mc, pc:+kc] into MR-tall row panels
//      jr: one B panel (kc x NR) at a time   it stays close (L1/L2) while ...
//       ir: ... every A panel (MR x kc) runs past it: the micro-kernel adds a whole MR x NR tile of
//           C, held in registers for all kc steps (per step: NR/W vector loads of B, MR broadcasts
//           of A, MR*NR/W fused multiply-adds, W = floats per vector), then merges it into C once.
// Packing turns any layout (transposed or not, any leading dim) into the exact order the
// micro-kernel reads, contiguous, and zero-pads the ragged edges, so the kernel never branches; it
// costs O(MK + KN) copies against O(MKN) multiply-adds. Where the layout already suits the kernel
// (a row-major op(a); a row-major op(b) when M is small) it reads the operand in place instead
// (see gemm_packed). Register budgets: AVX-512 6 x 64 = 24 of the 32 zmm for C, 4 for B, 1 for
// the broadcast A; AVX2 6 x 16 = 12 of the 16 ymm, 2 for B, 1 for A; the portable kernel is the
// same loops in plain C++ (6 x 16), the reference for the other two.
//
// Determinism: kc depends on K alone and each tile sums its kc steps in order, then C takes the
// kc blocks in order; edge tiles run the same kernel into a stack buffer and are merged with the
// same formula, and an operand read in place gives the kernel the same numbers as a packed one.
// So every element of C is the same bits whatever M, the row or column range or the thread count
// (matmul splits C over threads, calling this once per piece).
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/kernels.h"
#include "core/kernels/pointwise.h"

#include "core/cpu/avx512.h"

namespace ag::cpu {

namespace {

// ---- blocking ---------------------------------------------------------------------------------
// Zen5 per core: L1D 48 KiB, L2 1 MiB; L3 shared. kc = 256: a packed A panel (MR x kc = 6 KiB) and
// the C tile stay in L1 for the ir step, and the B panel it runs against (kc x NR = 64 KiB for
// NR = 64) comes from L2 at 4 vector loads per 24 multiply-adds, which L2 sustains, so any kc
// from 128 to 384 runs at about the same speed (docs/benchmarks.md, "GEMM"); 256
// halves the passes over C against 128. mc = 480: a packed A block
// (mc x kc = 480 KiB, when op(a) is transposed) keeps to half the L2 across the jr loop. nc = 4096:
// the packed B block kc x nc = 4 MiB in L3. kc is evened out over K (K = 300 runs as 2 x 150, not
// 256 + 44); it depends on K only.
constexpr int64_t kKcMax = 256;
// The bf16 kernel's kc: twice the f32 one, the same bytes. Its panels hold k in pairs of 32-bit
// words, so kc = 512 makes the B panel (kc/2 x NR words) 64 KiB and a packed A block 480 KiB, as
// the f32 blocking's, and halves the passes over C: a product with K = 512 (the dX of a Linear
// from 128 to 512) or 384 runs as one block, not two (docs/benchmarks.md, "bf16 on the CPU").
constexpr int64_t kKcMaxBf16 = 2 * kKcMax;
constexpr int64_t kMcRows = 480;
constexpr int64_t kNcCols = 4096;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A packing buffer per thread, 64-byte aligned, grown when a call needs more and then kept: in
// steady state no call allocates.
// (T: float for the f32 kernels, uint32_t for the bf16 pairs of sbgemm's.)
template <class T>
struct PackBuffer {
  T* p = nullptr;
  size_t n = 0;
  ~PackBuffer() { std::free(p); }
  T* get(size_t need) {
    if (need > n) {
      std::free(p);
      n = size_t(round_up(int64_t(need), 16));  // aligned_alloc wants a multiple of the alignment
      p = static_cast<T*>(std::aligned_alloc(64, n * sizeof(T)));
      if (!p) std::abort();  // out of memory inside a parallel region: nothing sane to throw to
    }
    return p;
  }
};
thread_local PackBuffer<float> t_pack_a, t_pack_b;

// Packs op(a)[i0:i0+mb, p0:p0+kb] into row panels of MR: panel q holds rows q*MR .. q*MR+MR-1 as
// dst[q*kb*MR + p*MR + r] (the MR values of one k step side by side), rows past mb are zeros.
template <int MR>
void pack_a(float* dst, const float* a, int64_t lda, bool ta, int64_t i0, int64_t mb, int64_t p0, int64_t kb) {
  for (int64_t q = 0; q < mb; q += MR, dst += kb * MR) {
    const int64_t m = std::min<int64_t>(MR, mb - q);
    if (ta) {  // element (i, p) at a[p*lda + i]: MR contiguous values per k step
      for (int64_t p = 0; p < kb; ++p) {
        const float* s = a + (p0 + p) * lda + i0 + q;
        for (int64_t r = 0; r < m; ++r) dst[p * MR + r] = s[r];
        for (int64_t r = m; r < MR; ++r) dst[p * MR + r] = 0.f;
      }
    } else {  // element (i, p) at a[i*lda + p]: read each row along k, write every MR-th slot
      for (int64_t r = 0; r < m; ++r) {
        const float* s = a + (i0 + q + r) * lda + p0;
        for (int64_t p = 0; p < kb; ++p) dst[p * MR + r] = s[p];
      }
      for (int64_t r = m; r < MR; ++r)
        for (int64_t p = 0; p < kb; ++p) dst[p * MR + r] = 0.f;
    }
  }
}

// Packs op(b)[p0:p0+kb, j0:j0+nb] into column panels of NR: panel q holds columns q*NR .. +NR-1
// as dst[q*kb*NR + p*NR + j] (one row of the panel per k step), columns past nb are zeros.
template <int NR>
void pack_b(float* dst, const float* b, int64_t ldb, bool tb, int64_t p0, int64_t kb, int64_t j0, int64_t nb) {
  for (int64_t q = 0; q < nb; q += NR, dst += kb * NR) {
    const int64_t n = std::min<int64_t>(NR, nb - q);
    if (!tb) {  // element (p, j) at b[p*ldb + j]: NR contiguous values per k step
      for (int64_t p = 0; p < kb; ++p) {
        const float* s = b + (p0 + p) * ldb + j0 + q;
        float* d = dst + p * NR;
        if (n == NR) {
          std::memcpy(d, s, NR * sizeof(float));
        } else {
          for (int64_t j = 0; j < n; ++j) d[j] = s[j];
          for (int64_t j = n; j < NR; ++j) d[j] = 0.f;
        }
      }
    } else {  // element (p, j) at b[j*ldb + p]: a transpose, done 8 k steps at a time, so that the
              // n source rows (ldb apart, often a multiple of 4 KiB: the same L1 set) and the 8
              // rows of dst being written stay in L1 (column by column over all kb, they would not)
      for (int64_t p1 = 0; p1 < kb; p1 += 8) {
        const int64_t pn = std::min<int64_t>(8, kb - p1);
        for (int64_t j = 0; j < n; ++j) {
          const float* s = b + (j0 + q + j) * ldb + p0 + p1;
          for (int64_t p = 0; p < pn; ++p) dst[(p1 + p) * NR + j] = s[p];
        }
        for (int64_t p = 0; p < pn; ++p)
          for (int64_t j = n; j < NR; ++j) dst[(p1 + p) * NR + j] = 0.f;
      }
    }
  }
}

// ---- micro-kernels ----------------------------------------------------------------------------
// c (MR, NR; ldc) = alpha acc + beta c,  acc[r][j] = sum_p A(r, p) b[p*ldb + j] over p < kc, summed
// in order of p from zero. A(r, p) is a[p*MR + r] in a packed panel (kRowsA false), or a[r*lda + p]
// when the kernel reads MR rows of a row-major op(a) in place (kRowsA true); b is a packed panel
// (ldb = NR) or NR columns of a row-major op(b) in place. Either way the same products are summed
// in the same order, so the bits of c do not depend on which was used. beta == 0: c is only
// written (NaN there must not leak). The merge is fma(alpha, acc, beta * c) (alpha * acc when
// beta == 0) in every kernel and in the driver's edge path, then + bias[j] when bias is given (the
// first kc block of a GEMM with a bias: a Linear layer's, added while the tile is in registers).
using MicroKernel = void (*)(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                             int64_t ldc, float alpha, float beta, const float* bias);

// The reference: plain loops the compiler vectorises over j (one vector row per r).
template <int MR, int NR, bool kRowsA>
void kernel_portable(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                     float alpha, float beta, const float* bias) {
  float acc[MR][NR] = {};
  for (int64_t p = 0; p < kc; ++p) {
    const float* bp = b + p * ldb;
    for (int r = 0; r < MR; ++r) {
      const float ar = kRowsA ? a[r * lda + p] : a[p * MR + r];
#pragma omp simd
      for (int j = 0; j < NR; ++j) acc[r][j] += ar * bp[j];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) {
      const float y = beta == 0.f ? alpha * acc[r][j] : std::fma(alpha, acc[r][j], beta * c[r * ldc + j]);
      c[r * ldc + j] = bias ? y + bias[j] : y;
    }
}

#if defined(__x86_64__)
// AVX2: MR rows x NV ymm vectors of 8 columns. With MR = 6, NV = 2: 12 accumulators + 2 B loads
// + 1 broadcast = 15 of the 16 ymm registers.
template <int MR, int NV, bool kRowsA>
__attribute__((target("avx2,fma"))) void kernel_avx2(int64_t kc, const float* a, int64_t lda, const float* b,
                                                     int64_t ldb, float* c, int64_t ldc, float alpha, float beta,
                                                     const float* bias) {
  __m256 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + p * ldb + 8 * v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(kRowsA ? a + r * lda + p : a + p * MR + r);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cr = c + r * ldc + 8 * v;
      __m256 y = beta == 0.f ? _mm256_mul_ps(va, acc[r][v])
                             : _mm256_fmadd_ps(va, acc[r][v], _mm256_mul_ps(vb, _mm256_loadu_ps(cr)));
      if (bias) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + 8 * v));
      _mm256_storeu_ps(cr, y);
    }
}

// The AVX-512 kernels' merge of their MR x NV accumulators into c (the rule above), shared by the
// f32 and the bf16 kernel; always inlined, so the accumulators stay in registers.
template <int MR, int NV>
__attribute__((target("avx512f,avx512vl,fma"), always_inline)) inline void merge_avx512(const __m512 (&acc)[MR][NV],
                                                                                        float* c, int64_t ldc,
                                                                                        float alpha, float beta,
                                                                                        const float* bias) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cr = c + r * ldc + 16 * v;
      __m512 y = beta == 0.f ? _mm512_mul_ps(va, acc[r][v])
                             : _mm512_fmadd_ps(va, acc[r][v], _mm512_mul_ps(vb, _mm512_loadu_ps(cr)));
      if (bias) y = _mm512_add_ps(y, _mm512_loadu_ps(bias + 16 * v));
      _mm512_storeu_ps(cr, y);
    }
}

// AVX-512: MR rows x NV zmm vectors of 16 columns. With MR = 6, NV = 4: 24 accumulators + 4 B
// loads + 1 broadcast = 29 of the 32 zmm registers. 6 x 64 rather than 12 x 32 (the same 24
// accumulators): per k step 4 loads + 6 broadcasts against 2 + 12, and on the short TN products,
// where M = 64 or 128, less of the last row panel is wasted (66 rows computed for 64, not 72)
// (docs/benchmarks.md, "GEMM").
template <int MR, int NV, bool kRowsA>
__attribute__((target("avx512f,avx512vl,fma"))) void kernel_avx512(int64_t kc, const float* a, int64_t lda,
                                                                   const float* b, int64_t ldb, float* c,
                                                                   int64_t ldc, float alpha, float beta,
                                                                   const float* bias) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + p * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(kRowsA ? a[r * lda + p] : a[p * MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  merge_avx512<MR, NV>(acc, c, ldc, alpha, beta, bias);
}
#endif

// An edge tile's exact sums (tile, m x n valid of row stride ldt) merged into c with the kernels'
// rule: the drivers' path for the ragged last rows and columns.
void merge_tile(const float* tile, int64_t ldt, float* c, int64_t ldc, int64_t m, int64_t n, float alpha, float beta,
                const float* bias) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float& y = c[i * ldc + j];
      y = beta == 0.f ? alpha * tile[i * ldt + j] : std::fma(alpha, tile[i * ldt + j], beta * y);
      if (bias) y += bias[j];
    }
}

// c = beta c (+ bias[j]), c not read when beta == 0: what a GEMM with K == 0 or alpha == 0
// computes, sgemm's and sbgemm's alike.
void scale_c(int64_t M, int64_t N, float beta, float* c, int64_t ldc, const float* bias) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float& y = c[i * ldc + j];
      y = beta == 0.f ? 0.f : beta * y;
      if (bias) y += bias[j];
    }
}

// ---- the blocking driver ----------------------------------------------------------------------
// When packing is skipped (the kernel reads op(a) or op(b) in place; only a ragged last panel is
// packed, zero-padded): packing op(b) pays off over the M/MR row panels that reuse each B panel
// from L1/L2, so a row-major op(b) is read in place only when M <= kDirectBMaxM. A row-major op(a)
// is always read in place: its MR rows stream from L2 as well as a packed panel does (the kernel
// is as fast either way at 1024^3), and for small N (the (6400,256) @ (256,64) products) the
// strided copy into MR-interleaved panels costs a large share of the product, which each panel
// serves for few columns (docs/benchmarks.md, "GEMM").
constexpr int64_t kDirectBMaxM = 256;
struct KernelPair {
  MicroKernel packed_a, rows_a;  // A from a packed panel / straight from a row-major op(a)
};

template <int MR, int NR>
void gemm_packed(KernelPair kernel, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  constexpr int64_t mc = kMcRows / MR * MR, nc = kNcCols / NR * NR;
  const int64_t kblocks = (K + kKcMax - 1) / kKcMax, kc = (K + kblocks - 1) / kblocks;
  const bool direct_a = !ta, direct_b = !tb && M <= kDirectBMaxM;
  float* bp = t_pack_b.get(size_t(kc * (direct_b ? NR : std::min(nc, round_up(N, NR)))));
  float* ap = t_pack_a.get(size_t(kc * (direct_a ? MR : std::min(mc, round_up(M, MR)))));
  alignas(64) float tile[MR * NR];  // edge tiles: the kernel writes here, then the valid part is merged
  for (int64_t jc = 0; jc < N; jc += nc) {
    const int64_t nb = std::min(nc, N - jc), nfull = nb / NR * NR;
    for (int64_t pc = 0; pc < K; pc += kc) {
      const int64_t kb = std::min(kc, K - pc);
      const float bt = pc == 0 ? beta : 1.f;  // later kc blocks add to what the first one wrote
      if (!direct_b)
        pack_b<NR>(bp, b, ldb, tb, pc, kb, jc, nb);
      else if (nfull < nb)  // only the ragged last panel, zero-padded
        pack_b<NR>(bp, b, ldb, tb, pc, kb, jc + nfull, nb - nfull);
      for (int64_t ic = 0; ic < M; ic += mc) {
        const int64_t mb = std::min(mc, M - ic), mfull = mb / MR * MR;
        if (!direct_a)
          pack_a<MR>(ap, a, lda, ta, ic, mb, pc, kb);
        else if (mfull < mb)
          pack_a<MR>(ap, a, lda, ta, ic + mfull, mb - mfull, pc, kb);
        for (int64_t jr = 0; jr < nb; jr += NR) {
          const int64_t n = std::min<int64_t>(NR, nb - jr);
          const bool b_in_place = direct_b && n == NR;
          const float* bq = b_in_place ? b + pc * ldb + jc + jr : bp + (direct_b ? 0 : jr * kb);
          const int64_t bs = b_in_place ? ldb : NR;
          for (int64_t ir = 0; ir < mb; ir += MR) {
            const int64_t m = std::min<int64_t>(MR, mb - ir);
            float* cq = c + (ic + ir) * ldc + jc + jr;
            const float* bias_q = bias && pc == 0 ? bias + jc + jr : nullptr;  // once, in the first kc block
            auto product = [&](float* out, int64_t ldo, float al, float be, const float* bi) {
              if (direct_a && m == MR)
                kernel.rows_a(kb, a + (ic + ir) * lda + pc, lda, bq, bs, out, ldo, al, be, bi);
              else
                kernel.packed_a(kb, ap + (direct_a ? 0 : ir * kb), MR, bq, bs, out, ldo, al, be, bi);
            };
            if (m == MR && n == NR) {
              product(cq, ldc, alpha, bt, bias_q);
            } else {  // tile = acc exactly (alpha 1, beta 0), then the kernels' merge on m x n
              product(tile, NR, 1.f, 0.f, nullptr);
              merge_tile(tile, NR, cq, ldc, m, n, alpha, bt, bias_q);
            }
          }
        }
      }
    }
  }
}

// ---- bf16 operands: AVX512-BF16 ---------------------------------------------------------------
// sbgemm: c = alpha op(a) op(b) + beta c (+ bias) with both operands rounded to bf16 (pw::round_bf16:
// to nearest, ties to even, as autocast rounds them) and the products summed in f32, by
// VDPBF16PS: per 32-bit lane, two bf16 products added into an f32 sum (each product is exact in
// f32: 8 x 8 significant bits). One instruction does 32 multiply-adds where an f32 FMA does 16.
// The rounding happens in the packing, which stores k in pairs of 32-bit words (row r's bf16
// values at k = 2pp and 2pp + 1, low half first): A as rows of such words, or as panels of MR
// words per pair (pack_a_bf16), B as panels of NR words per pair (column j's values at the same
// two k). An odd last step pairs with a zero. The packing is vectorised (16 values rounded per
// instruction sequence, the same bits as pw::round_bf16): it is the one pass over the operands
// that the emulation's rounded copies make too. The kernel broadcasts A's word of row r and
// multiplies it against NR/16 vectors of B words: MR x NR sums in 24 zmm registers, as the f32
// kernel.
// Against the f32 GEMM on rounded copies (the emulation), the same products are summed, but two
// by two: the sums differ by f32 rounding only. VDPBF16PS also treats bf16 subnormal inputs
// (|x| < 2^-126) as zero and flushes subnormal sums to zero. Determinism as the f32 kernels: kc
// depends on K alone, each tile sums its pairs in order, so results do not depend on the thread
// count.
#if defined(__x86_64__)

// Each 32-bit lane shifted right by 16. (The maskz form with every lane kept: GCC 12 warns
// maybe-uninitialized on the plain _mm512_srli_epi32, whose pass-through operand is undefined.)
AG_BF16_TARGET inline __m512i srl16(__m512i u) { return _mm512_maskz_srli_epi32(__mmask16(0xffff), u, 16); }

// 16 floats rounded to bf16 exactly as pw::round_bf16 rounds them (ties to even, NaN made quiet),
// each left in the top half of its 32-bit lane; the low halves are garbage.
AG_BF16_TARGET inline __m512i round_bf16_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(srl16(u), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
}

// Lane i of lo and of hi rounded and paired into one word: lo's bf16 in the low half.
AG_BF16_TARGET inline __m512i pair_lanes(__m512 lo, __m512 hi) {
  return _mm512_mask_blend_epi16(0xAAAAAAAAu, srl16(round_bf16_hi(lo)), round_bf16_hi(hi));
}

// n <= 32 consecutive floats x[0, n) (zeros past n) rounded and paired: word i = (x[2i], x[2i+1]).
AG_BF16_TARGET inline __m512i pair_run(const float* x, int64_t n) {
  const __m512i r0 = round_bf16_hi(_mm512_maskz_loadu_ps(first_lanes(n), x)),
                r1 = round_bf16_hi(_mm512_maskz_loadu_ps(first_lanes(n - 16), x + 16));
  // the top halves of the 32 lanes in order: 16-bit elements 1, 3, ..., 63 of (r0, r1)
  const __m512i odd16 = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(r0, odd16, r1);
}

// A row of kb floats as kp = ceil(kb / 2) words of pairs, the odd last one paired with a zero.
AG_BF16_TARGET inline void pack_row_bf16(uint32_t* dst, const float* x, int64_t kb) {
  const int64_t kp = (kb + 1) / 2;
  for (int64_t pp = 0; pp < kp; pp += 16) {
    const __m512i w = pair_run(x + 2 * pp, std::min<int64_t>(32, kb - 2 * pp));
    _mm512_mask_storeu_epi32(dst + pp, first_lanes(kp - pp), w);
  }
}

// Lanes i < 16 of the pairs (lo[i], hi[i]) as words, for the lanes in mask (zeros elsewhere; hi
// null: zeros). An f32 source is rounded (pair_lanes); a bf16 one holds bf16 values already (a
// 16-bit tensor: what linear keeps of its input under bf16 autocast), so its values are only
// paired: zero-extended to 32 bits, hi's shifted into the high halves. Both give the words of the
// same bf16 values, so the products are the same bits. (The maskz forms keep every lane: GCC 12
// warns maybe-uninitialized on the plain widening and shift.)
AG_BF16_TARGET inline __m512i pair_vectors(const float* lo, const float* hi, __mmask16 mask) {
  return pair_lanes(_mm512_maskz_loadu_ps(mask, lo), hi ? _mm512_maskz_loadu_ps(mask, hi) : _mm512_setzero_ps());
}
AG_BF16_TARGET inline __m512i pair_vectors(const bf16* lo, const bf16* hi, __mmask16 mask) {
  const __mmask16 all = 0xffff;
  const __m512i l = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(mask, lo));
  if (!hi) return l;
  const __m512i h = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(mask, hi));
  return _mm512_or_si512(l, _mm512_maskz_slli_epi32(all, h, 16));
}

// A row of kb values as kp = ceil(kb / 2) words of pairs, the odd last one paired with a zero.
AG_BF16_TARGET inline void pack_row_words(uint32_t* dst, const float* x, int64_t kb) { pack_row_bf16(dst, x, kb); }
inline void pack_row_words(uint32_t* dst, const bf16* x, int64_t kb) {
  // the words of a row of bf16 values are its bytes (x86 is little-endian: x[2 pp] in the low half)
  std::memcpy(dst, x, size_t(kb / 2) * sizeof(uint32_t));
  if (kb % 2) dst[kb / 2] = uint32_t(x[kb - 1].bits);
}

// op(a)[i0:+mb, p0:+kb] in the layout the bf16 kernel reads, kp = ceil(kb / 2) words per row:
//   a stored as is (ta false): row by row, row i at dst[i*kp + pp] (the kernel's kRowsA: each
//     row's pairs are adjacent floats of the source);
//   a stored transposed: panels of MR rows, dst[q*kp*MR + pp*MR + r] (a row's pair lies in two
//     source rows lda apart, each giving MR adjacent values).
// Rows past mb, up to a multiple of MR, are zeros.
template <int MR, class Src>
AG_BF16_TARGET void pack_a_bf16(uint32_t* dst, const Src* a, int64_t lda, bool ta, int64_t i0, int64_t mb,
                                int64_t p0, int64_t kb) {
  const int64_t kp = (kb + 1) / 2, rows = round_up(mb, MR);
  if (!ta) {
    for (int64_t i = 0; i < mb; ++i) pack_row_words(dst + i * kp, a + (i0 + i) * lda + p0, kb);
    std::memset(dst + mb * kp, 0, size_t((rows - mb) * kp) * sizeof(uint32_t));
    return;
  }
  // 8 panels (48 rows) at a time: per pair of k steps, 3 vectors of 16 rows from each of the two
  // source rows (whole cache lines), paired, then each panel's MR words stored from the vector
  // lanes that hold them (one masked store, or two where a panel straddles two vectors)
  static_assert(MR == 6, "the 48-row groups hold 8 panels of 6");
  for (int64_t q0 = 0; q0 < mb; q0 += 48) {
    const int64_t rows = std::min<int64_t>(48, mb - q0), panels = (rows + MR - 1) / MR;
    const __mmask16 mask[3] = {first_lanes(rows), first_lanes(rows - 16), first_lanes(rows - 32)};
    const Src* s = a + p0 * lda + i0 + q0;
    uint32_t* d0 = dst + q0 * kp;  // panel q0 / MR
    for (int64_t pp = 0; pp < kp; ++pp, s += 2 * lda) {
      const bool has_hi = 2 * pp + 1 < kb;
      __m512i w[3];
#pragma GCC unroll 3
      for (int v = 0; v < 3; ++v) w[v] = pair_vectors(s + 16 * v, has_hi ? s + lda + 16 * v : nullptr, mask[v]);
      for (int64_t t = 0; t < panels; ++t) {
        // rows MR t .. MR t + 5 of the group: lanes off .. off + 5 of vector v (and on into v + 1)
        const int v = int(MR * t / 16), off = int(MR * t % 16), first = std::min(MR, 16 - off);
        uint32_t* d = d0 + t * kp * MR + pp * MR;  // the panel's MR words for this pair
        _mm512_mask_storeu_epi32(d - off, __mmask16(((1u << first) - 1) << off), w[v]);
        if (first < MR) _mm512_mask_storeu_epi32(d + first, __mmask16((1u << (MR - first)) - 1), w[v + 1]);
      }
    }
  }
}

// op(b)[p0:+kb, j0:+nb] into panels of NR columns, dst[q*kp*NR + pp*NR + j], columns past nb zeros,
// from f32 values (rounded) or bf16 ones (pair_vectors):
//   b stored as is (tb false): a pair lies in two source rows, each giving NR adjacent values;
//   b stored transposed: a column's pairs are adjacent values of one source row, paired into a
//     row of words and then written down the panel's column (a transpose of 32-bit words).
template <int NR, class Src>
AG_BF16_TARGET void pack_b_bf16(uint32_t* dst, const Src* b, int64_t ldb, bool tb, int64_t p0, int64_t kb,
                                int64_t j0, int64_t nb) {
  const int64_t kp = (kb + 1) / 2;
  alignas(64) uint32_t row[kKcMaxBf16 / 2 + 16];
  for (int64_t q = 0; q < nb; q += NR, dst += kp * NR) {
    const int64_t n = std::min<int64_t>(NR, nb - q);
    if (!tb) {
      const Src* s = b + p0 * ldb + j0 + q;
      for (int64_t pp = 0; pp < kp; ++pp, s += 2 * ldb) {
        const bool has_hi = 2 * pp + 1 < kb;
#pragma GCC unroll 4
        for (int64_t v = 0; v < NR / 16; ++v)
          _mm512_storeu_si512(dst + pp * NR + 16 * v,
                              pair_vectors(s + 16 * v, has_hi ? s + ldb + 16 * v : nullptr, first_lanes(n - 16 * v)));
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        pack_row_words(row, b + (j0 + q + j) * ldb + p0, kb);
        for (int64_t pp = 0; pp < kp; ++pp) dst[pp * NR + j] = row[pp];
      }
      for (int64_t pp = 0; pp < kp && n < NR; ++pp) std::fill(dst + pp * NR + n, dst + pp * NR + NR, 0u);
    }
  }
}
#endif

thread_local PackBuffer<uint32_t> t_pack_a16, t_pack_b16;

#if defined(__x86_64__)
// A 32-bit word that may alias other types: the pairs of a row of bf16 values read in place.
typedef uint32_t word_alias __attribute__((may_alias));

// c (MR, NR; ldc) = alpha acc + beta c (+ bias), acc = the sums over the kp pairs of A's words
// (A(r, pp) = a[pp*MR + r] in a panel, a[r*lda + pp] with kRowsA: packed rows, lda = kp, or the
// rows of a bf16 source as they are) and the packed B panel b (NR words per pair), merged as the
// f32 kernels merge.
template <int MR, int NV, bool kRowsA>
AG_BF16_TARGET void kernel_avx512_bf16(int64_t kp, const word_alias* a, int64_t lda, const uint32_t* b, float* c,
                                       int64_t ldc, float alpha, float beta, const float* bias) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t pp = 0; pp < kp; ++pp) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + pp * NV * 16 + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(int(kRowsA ? a[r * lda + pp] : a[pp * MR + r]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
    }
  }
  merge_avx512<MR, NV>(acc, c, ldc, alpha, beta, bias);
}

// The five loops of gemm_packed, both operands packed (the packing is the rounding): each is f32
// (rounded while packed) or bf16 (paired as it is). A bf16 A stored as is, with an even K, kc and
// lda and 4-byte aligned, is not packed at all: its rows are already rows of words (pack_row_words
// would copy them), so the kernel reads them in place; only a last tile of fewer than MR rows is
// copied, into zero-padded rows (the kernel reads MR).
template <class TA, class TB>
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const TA* a, int64_t lda,
               const TB* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  constexpr int MR = 6, NV = 4, NR = 16 * NV;
  constexpr int64_t mc = kMcRows / MR * MR, nc = kNcCols / NR * NR;
  const int64_t kblocks = (K + kKcMaxBf16 - 1) / kKcMaxBf16, kc = (K + kblocks - 1) / kblocks, kpmax = (kc + 1) / 2;
  const bool in_place = std::is_same_v<TA, bf16> && !ta && K % 2 == 0 && kc % 2 == 0 && lda % 2 == 0 &&
                        reinterpret_cast<uintptr_t>(a) % sizeof(uint32_t) == 0;
  uint32_t* bp = t_pack_b16.get(size_t(kpmax * std::min(nc, round_up(N, NR))));
  uint32_t* ap = t_pack_a16.get(size_t(kpmax * (in_place ? MR : std::min(mc, round_up(M, MR)))));
  alignas(64) float tile[MR * NR];
  const auto kernel = ta ? kernel_avx512_bf16<MR, NV, false> : kernel_avx512_bf16<MR, NV, true>;
  for (int64_t jc = 0; jc < N; jc += nc) {
    const int64_t nb = std::min(nc, N - jc);
    for (int64_t pc = 0; pc < K; pc += kc) {
      const int64_t kb = std::min(kc, K - pc), kp = (kb + 1) / 2;
      const float bt = pc == 0 ? beta : 1.f;
      pack_b_bf16<NR>(bp, b, ldb, tb, pc, kb, jc, nb);
      for (int64_t ic = 0; ic < M; ic += mc) {
        const int64_t mb = std::min(mc, M - ic), full = mb / MR * MR;
        if (!in_place) pack_a_bf16<MR>(ap, a, lda, ta, ic, mb, pc, kb);
        else if (full < mb) pack_a_bf16<MR>(ap, a, lda, false, ic + full, mb - full, pc, kb);  // the last rows
        for (int64_t jr = 0; jr < nb; jr += NR) {
          const int64_t n = std::min<int64_t>(NR, nb - jr);
          const uint32_t* bq = bp + jr * kp;
          for (int64_t ir = 0; ir < mb; ir += MR) {
            const int64_t m = std::min<int64_t>(MR, mb - ir);
            const word_alias* aq = in_place ? ap : ap + ir * kp;
            int64_t ld = kp;
            if (in_place && ir < full) aq = reinterpret_cast<const word_alias*>(a + (ic + ir) * lda + pc), ld = lda / 2;
            float* cq = c + (ic + ir) * ldc + jc + jr;
            const float* bias_q = bias && pc == 0 ? bias + jc + jr : nullptr;
            if (m == MR && n == NR) {
              kernel(kp, aq, ld, bq, cq, ldc, alpha, bt, bias_q);
            } else {  // as gemm_packed: the exact sums into a tile, then the merge on m x n
              kernel(kp, aq, ld, bq, tile, NR, 1.f, 0.f, nullptr);
              merge_tile(tile, NR, cq, ldc, m, n, alpha, bt, bias_q);
            }
          }
        }
      }
    }
  }
}
#endif

bool cpu_has_bf16() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// Native bf16 products: -1 until the first use (then whether the CPU has AVX512-BF16), or what
// set_sbgemm_native chose.
std::atomic<int> g_bf16_native{-1};

constexpr const char* kKernelNames[] = {"avx512", "avx2", "portable", "openblas"};

bool cpu_has(GemmKernel k) {
#if defined(__x86_64__)
  if (k == GemmKernel::avx512) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  if (k == GemmKernel::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  if (k == GemmKernel::avx512 || k == GemmKernel::avx2) return false;
#endif
  return true;
}

// The kernel at first use: ATTOGRAD_GEMM when set, else the widest this CPU runs.
GemmKernel kernel_from_env() {
  const char* env = std::getenv("ATTOGRAD_GEMM");
  if (env && *env) return gemm_kernel_named(env);
  if (cpu_has(GemmKernel::avx512)) return GemmKernel::avx512;
  if (cpu_has(GemmKernel::avx2)) return GemmKernel::avx2;
  return GemmKernel::portable;
}

std::atomic<int> g_kernel{-1};  // -1 until the first use reads the environment

}  // namespace

bool sgemm_kernel_supported(GemmKernel k) { return cpu_has(k); }

GemmKernel gemm_kernel_named(const char* name) {
  for (int i = 0; i < 4; ++i)
    if (std::string_view(name) == kKernelNames[i]) {
      check(cpu_has(GemmKernel(i)), "sgemm: ATTOGRAD_GEMM={}: this CPU does not support that kernel", name);
      return GemmKernel(i);
    }
  fail("sgemm: ATTOGRAD_GEMM={}: unknown kernel (expected avx512, avx2, portable or openblas)", name);
}

const char* gemm_kernel_name(GemmKernel k) { return kKernelNames[int(k)]; }

GemmKernel sgemm_kernel() {
  int k = g_kernel.load(std::memory_order_relaxed);
  if (k < 0) {  // a bad ATTOGRAD_GEMM throws here, and again at every call until it is fixed
    k = int(kernel_from_env());
    g_kernel.store(k, std::memory_order_relaxed);
  }
  return GemmKernel(k);
}

void set_sgemm_kernel(GemmKernel k) {
  check(cpu_has(k), "set_sgemm_kernel: this CPU does not support the {} kernel", gemm_kernel_name(k));
  g_kernel.store(int(k), std::memory_order_relaxed);
}

const char* sgemm_kernel_name() { return gemm_kernel_name(sgemm_kernel()); }

void sgemm_with(GemmKernel k, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  if (M <= 0 || N <= 0) return;
  auto add_bias = [&] {
    if (bias)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) c[i * ldc + j] += bias[j];
  };
  if (k == GemmKernel::openblas) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M),
                blasint(N), blasint(K), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
    add_bias();
    return;
  }
  if (K <= 0 || alpha == 0.f) {  // without reading a or b
    scale_c(M, N, beta, c, ldc, bias);
    return;
  }
  switch (k) {
#if defined(__x86_64__)
    case GemmKernel::avx512:
      gemm_packed<6, 64>({kernel_avx512<6, 4, false>, kernel_avx512<6, 4, true>}, ta, tb, M, N, K, alpha, a, lda, b,
                         ldb, beta, c, ldc, bias);
      return;
    case GemmKernel::avx2:
      gemm_packed<6, 16>({kernel_avx2<6, 2, false>, kernel_avx2<6, 2, true>}, ta, tb, M, N, K, alpha, a, lda, b, ldb,
                         beta, c, ldc, bias);
      return;
#endif
    default:
      gemm_packed<6, 16>({kernel_portable<6, 16, false>, kernel_portable<6, 16, true>}, ta, tb, M, N, K, alpha, a,
                         lda, b, ldb, beta, c, ldc, bias);
      return;
  }
}

bool sbgemm_supported() { return cpu_has_bf16(); }

bool sbgemm_native() {
  int on = g_bf16_native.load(std::memory_order_relaxed);
  if (on < 0) {
    on = int(cpu_has_bf16());
    g_bf16_native.store(on, std::memory_order_relaxed);
  }
  return on && sgemm_kernel() == GemmKernel::avx512;
}

void set_sbgemm_native(bool on) {
  check(!on || cpu_has_bf16(), "set_sbgemm_native: this CPU has no AVX512-BF16 (avx512_bf16)");
  g_bf16_native.store(int(on), std::memory_order_relaxed);
}

namespace {
// sbgemm and its 16-bit operand forms: the checks and the K == 0 case, then gemm_bf16.
template <class TA, class TB>
void sbgemm_of(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const TA* a, int64_t lda, const TB* b,
               int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  check(cpu_has_bf16(), "sbgemm: this CPU has no AVX512-BF16 (avx512_bf16)");
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.f) {  // without reading a or b, as sgemm_with
    scale_c(M, N, beta, c, ldc, bias);
    return;
  }
#if defined(__x86_64__)
  gemm_bf16(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, bias);
#endif
}
}  // namespace

void sbgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  sbgemm_of(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, bias);
}
void sbgemm_b16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  sbgemm_of(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, bias);
}
void sbgemm_a16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  sbgemm_of(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, bias);
}

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  sgemm_with(sgemm_kernel(), ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, bias);
}

namespace {

struct Identity {
  AG_HD float operator()(float x) const { return x; }
};
struct Widen {  // a bf16 value as the f32 it is (exact)
  float operator()(bf16 x) const { return float(x); }
};

// sgemm_small_m with each element of a read through `round_a` (an identity, pw::RoundBf16 or
// pw::RoundFp16) and each of b through `read_b` (the same rounding for an f32 b, Widen for a bf16 one).
template <class TB, class RoundA, class ReadB>
void small_m(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const TB* b,
             int64_t ldb, float* c, int64_t ldc, const float* bias, RoundA round_a, ReadB read_b) {
  // the rows of op(a) made contiguous (and rounded) once when they are strided or rounded
  thread_local std::vector<float> rows;
  const float* A = a;
  int64_t ars = lda;
  if (ta || !std::is_same_v<RoundA, Identity>) {
    rows.resize(size_t(M * K));
    for (int64_t k = 0; k < K; ++k)
      for (int64_t i = 0; i < M; ++i) rows[size_t(i * K + k)] = round_a(ta ? a[k * lda + i] : a[i * lda + k]);
    A = rows.data(), ars = K;
  }
  if (tb) {  // c[i, j] = sum_k A[i, k] b[j * ldb + k]: a dot product of two contiguous rows
    // in 16 partial sums (sum l takes k = l, l + 16, ...), then those in a fixed tree: an order
    // set here, not by how the compiler vectorises a reduction, so an f32 b rounded as it is read
    // and the bf16 b of the same values give the same bits
    constexpr int L = 16;
    for (int64_t j = 0; j < N; ++j) {
      const TB* bj = b + j * ldb;
      for (int64_t i = 0; i < M; ++i) {
        const float* ai = A + i * ars;
        float part[L] = {};
        int64_t k = 0;
        for (; k + L <= K; k += L)
#pragma omp simd
          for (int l = 0; l < L; ++l) part[l] += ai[k + l] * read_b(bj[k + l]);
        for (int l = 0; k + l < K; ++l) part[l] += ai[k + l] * read_b(bj[k + l]);
        for (int w = L / 2; w >= 1; w /= 2)
          for (int l = 0; l < w; ++l) part[l] += part[l + w];
        c[i * ldc + j] = bias ? part[0] + bias[j] : part[0];
      }
    }
    return;
  }
  for (int64_t i = 0; i < M; ++i) {  // c[i, :] = sum_k A[i, k] b[k, :], k in order
    float* ci = c + i * ldc;
    if (bias) std::copy(bias, bias + N, ci);  // bias first, then the products in order of k
    else std::fill(ci, ci + N, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float aik = A[i * ars + k];
      const TB* bk = b + k * ldb;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) ci[j] += aik * read_b(bk[j]);
    }
  }
}

#if defined(__x86_64__)
// 32 consecutive values of one row of op(b)^T as 16 words of pairs (k = 2pp, 2pp + 1; zeros past
// n values): an f32 row rounded as it is read (pair_run), a bf16 row as it is stored, which is
// already that layout (the value at the even k in the low half of each word).
AG_BF16_TARGET inline __m512i pair_row(const float* x, int64_t n) { return pair_run(x, n); }
AG_BF16_TARGET inline __m512i pair_row(const bf16* x, int64_t n) {
  const __mmask32 mask = n >= 32 ? ~__mmask32(0) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1);
  return _mm512_maskz_loadu_epi16(mask, x);
}

// The sum of v's 16 lanes as a fixed tree: halves, then quarters, pairs and neighbours. (The
// maskz forms with every lane kept: GCC 12 warns maybe-uninitialized on the plain ones.)
AG_BF16_TARGET inline float lane_sum(__m512 v) {
  const __mmask16 all = 0xffff;
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}

// sgemm_small_m's dot products (b stored transposed: column j of op(b) is b's row j) on
// VDPBF16PS: op(a)'s MM rows rounded and paired once (A: kp words each), then column by column of
// op(b) its pairs (rounded as read, or bf16 as stored), 16 words per step. Element (i, j) sums
// lane l's pairs pp = l, l + 16, ... in order, then the 16 lanes by lane_sum, then adds bias[j]:
// an order that depends on K alone, so any split of the columns gives the same bits. One column
// at a time reads the weight as one sequential stream, which matters where the weights come from
// memory: 4 or 8 columns at a time (rows ldb apart, each short) read it more slowly.
template <int MM, class TB>
AG_BF16_TARGET inline void dot_column(const uint32_t* A, int64_t kp, int64_t K, const TB* bj, float* c, int64_t ldc,
                                      const float* bias) {
  __m512 acc[MM];
#pragma GCC unroll 4
  for (int i = 0; i < MM; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t pp = 0; pp < kp; pp += 16) {
    const __m512bh bw = (__m512bh)pair_row(bj + 2 * pp, K - 2 * pp);
#pragma GCC unroll 4
    for (int i = 0; i < MM; ++i)
      acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_maskz_loadu_epi32(first_lanes(kp - pp), A + i * kp + pp), bw);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MM; ++i) {
    const float s = lane_sum(acc[i]);
    c[i * ldc] = bias ? s + *bias : s;
  }
}

template <int MM, class TB>
AG_BF16_TARGET void small_m_dot_bf16(bool ta, int64_t N, int64_t K, const float* a, int64_t lda, const TB* b,
                                     int64_t ldb, float* c, int64_t ldc, const float* bias) {
  const int64_t kp = (K + 1) / 2;
  thread_local std::vector<uint32_t> words;  // op(a)'s rows as pairs, kp words each
  thread_local std::vector<float> column;    // a stored transposed: one row of op(a) gathered
  words.resize(size_t(MM * kp));
  for (int i = 0; i < MM; ++i) {
    const float* row = a + i * lda;
    if (ta) {
      column.resize(size_t(K));
      for (int64_t k = 0; k < K; ++k) column[size_t(k)] = a[k * lda + i];
      row = column.data();
    }
    pack_row_bf16(words.data() + i * kp, row, K);
  }
  const uint32_t* A = words.data();  // (thread_local: read once, not in the loop)
  for (int64_t j = 0; j < N; ++j) dot_column<MM>(A, kp, K, b + j * ldb, c + j, ldc, bias ? bias + j : nullptr);
}

template <class TB>
void small_m_dot_bf16(bool ta, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const TB* b,
                      int64_t ldb, float* c, int64_t ldc, const float* bias) {
  static_assert(kSmallRows == 4, "one instance per row count up to kSmallRows");
  switch (M) {
    case 1: return small_m_dot_bf16<1>(ta, N, K, a, lda, b, ldb, c, ldc, bias);
    case 2: return small_m_dot_bf16<2>(ta, N, K, a, lda, b, ldb, c, ldc, bias);
    case 3: return small_m_dot_bf16<3>(ta, N, K, a, lda, b, ldb, c, ldc, bias);
    default: return small_m_dot_bf16<4>(ta, N, K, a, lda, b, ldb, c, ldc, bias);
  }
}
#endif

// Whether a bf16 product of few rows runs small_m_dot_bf16: b stored transposed (a Linear's
// weight) where bf16 products are native; else the loops of small_m.
bool small_m_native(bool tb) { return tb && sbgemm_native(); }

}  // namespace

void sgemm_small_m(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, const float* bias, Precision operands) {
  if (M <= 0 || N <= 0) return;
#if defined(__x86_64__)
  if (operands == Precision::bf16 && M <= kSmallRows && small_m_native(tb))
    return small_m_dot_bf16(ta, M, N, K, a, lda, b, ldb, c, ldc, bias);
#endif
  if (operands == Precision::bf16)
    small_m(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, bias, pw::RoundBf16{}, pw::RoundBf16{});
  else if (operands == Precision::fp16)
    small_m(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, bias, pw::RoundFp16{}, pw::RoundFp16{});
  else
    small_m(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, bias, Identity{}, Identity{});
}

void sgemm_small_m_b16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const bf16* b,
                       int64_t ldb, float* c, int64_t ldc, const float* bias) {
  if (M <= 0 || N <= 0) return;
#if defined(__x86_64__)
  if (M <= kSmallRows && small_m_native(tb)) return small_m_dot_bf16(ta, M, N, K, a, lda, b, ldb, c, ldc, bias);
#endif
  small_m(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, bias, pw::RoundBf16{}, Widen{});
}

}  // namespace ag::cpu
