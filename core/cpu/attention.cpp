// Fused attention on the CPU (core/kernels/attention.h). Math: autograd/ops.h.
//
//   q (BH, Tq, D), k (BH, Tk, D), v (BH, Tk, Dv), out/dout (BH, Tq, Dv), lse (BH, Tq)
//
// Forward, FlashAttention-style: for a block of kBq query rows, walk the keys in blocks of kBk,
// S = scale Q K^T for that tile (one small GEMM), mask it, and fold it into a running softmax:
//   m' = max(m, rowmax S),  l' = l e^(m - m') + rowsum e^(S - m'),  acc' = acc e^(m - m') + e^(S - m') V
// After the last key block out = acc / l, and lse = m + log l is saved. Memory: O(kBq kBk) scratch
// per thread, nothing of size Tq x Tk.
// Backward recomputes each tile's P = e^(S - lse) from the saved lse (see attention_backward).
// Threads: forward splits over (BH, query block), backward over BH; each output element is
// produced by one thread in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/vecmath.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ag::cpu {

namespace {

// Tile sizes, measured on B 32, H 4, T 256, d 32 (bench_attention): 64 x 128 beat 64 x 64,
// 128 x 64, 128 x 128 and 256 x 128 by 5-15%: big enough that each BLAS call has work, small
// enough that causal tiles above the diagonal are skipped.
constexpr int64_t kBq = 64;   // query rows per tile
constexpr int64_t kBk = 128;  // keys per tile

// Which keys query row i (0-based within Tq) of batch element b may see.
struct KeyRange {
  int64_t lo, hi;  // [lo, hi): the contiguous range allowed by causal, window and lengths
};
KeyRange key_range(const AttentionGeom& g, int64_t b, int64_t i) {
  const int64_t qa = i + (g.Tk - g.Tq);  // the query's position on the key axis
  int64_t lo = 0, hi = g.lengths ? std::min(g.Tk, std::max<int64_t>(g.lengths[b], 0)) : g.Tk;
  if (g.causal) hi = std::min(hi, qa + 1);
  if (g.window >= 0) {  // |qa - j| <= window; with causal only the left half remains
    lo = std::max<int64_t>(lo, qa - g.window);
    hi = std::min(hi, qa + g.window + 1);
  }
  return {lo, std::max(lo, hi)};
}
// Sets s[j] = hidden for the keys j0 + j (j < nk) a row may not see: outside its range r, or
// masked by key_mask. Range first, as two plain fills, so the loops that follow stay vectorised.
template <class T>
void hide_keys(T* s, const AttentionGeom& g, int64_t b, int64_t j0, int64_t nk, KeyRange r, T hidden) {
  const int64_t lo = std::clamp<int64_t>(r.lo - j0, 0, nk), hi = std::clamp<int64_t>(r.hi - j0, lo, nk);
  for (int64_t j = 0; j < lo; ++j) s[j] = hidden;
  for (int64_t j = hi; j < nk; ++j) s[j] = hidden;
  if (g.key_mask)
    for (int64_t j = lo; j < hi; ++j)
      if (g.key_mask[b * g.Tk + j0 + j]) s[j] = hidden;
}

// Dropout keep factor of weight (bh, i, j): the same Philox element as ag::dropout over a
// contiguous (BH, Tq, Tk) tensor, so the fused and the composed paths drop the same weights.
template <class T>
T keep_factor(const AttentionGeom& g, int64_t bh, int64_t i, int64_t j) {
  const uint64_t idx = uint64_t((bh * g.Tq + i) * g.Tk + j);
  const Philox4 r = philox4x32_10(g.seed, g.offset + idx / 4);
  return double(uniform01(r.v[idx % 4])) >= g.dropout ? T(1.0 / (1.0 - g.dropout)) : T(0);
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionGeom& g) {
  const int64_t nqb = (g.Tq + kBq - 1) / kBq, D = g.D, Dv = g.Dv;
  const T ninf = -std::numeric_limits<T>::infinity();
  parallel_for(g.BH * nqb, 1, [&](int64_t w0, int64_t w1) {
    std::vector<T> S(size_t(kBq * kBk)), acc(size_t(kBq * Dv)), m(kBq), l(kBq);
    std::vector<KeyRange> range(kBq);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bh = w / nqb, i0 = (w % nqb) * kBq, nq = std::min(kBq, g.Tq - i0), b = bh / g.H;
      const T* Q = q + (bh * g.Tq + i0) * D;
      const T* K = k + bh * g.Tk * D;
      const T* V = v + bh * g.Tk * Dv;
      int64_t jlo = g.Tk, jhi = 0;  // keys any row of the block may see
      for (int64_t i = 0; i < nq; ++i) {
        range[i] = key_range(g, b, i0 + i);
        if (range[i].lo < range[i].hi) jlo = std::min(jlo, range[i].lo), jhi = std::max(jhi, range[i].hi);
        m[i] = ninf, l[i] = 0;
      }
      std::fill(acc.begin(), acc.begin() + nq * Dv, T(0));
      for (int64_t j0 = jlo; j0 < jhi; j0 += kBk) {
        const int64_t nk = std::min(kBk, jhi - j0);
        // S = scale Q K_j^T   (nq, nk)
        gemm_blas(false, true, nq, nk, D, T(g.scale), Q, D, K + j0 * D, D, T(0), S.data(), kBk);
        for (int64_t i = 0; i < nq; ++i) {
          T* s = S.data() + i * kBk;
          hide_keys(s, g, b, j0, nk, range[i], ninf);
          T mx = ninf;
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j < nk; ++j) mx = s[j] > mx ? s[j] : mx;
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
        }
        // acc += P V_j   (nq, Dv)
        gemm_blas(false, false, nq, Dv, nk, T(1), S.data(), kBk, V + j0 * Dv, Dv, T(1), acc.data(), Dv);
      }
      for (int64_t i = 0; i < nq; ++i) {
        T* o = out + (bh * g.Tq + i0 + i) * Dv;
        const T* a = acc.data() + i * Dv;
        // a row with no visible key gives zeros (not NaN) and lse = +inf, which backward reads as P = 0
        const T inv = l[i] > 0 ? T(1) / l[i] : T(0);
        for (int64_t c = 0; c < Dv; ++c) o[c] = a[c] * inv;
        lse[bh * g.Tq + i0 + i] = l[i] > 0 ? m[i] + std::log(l[i]) : std::numeric_limits<T>::infinity();
      }
    }
  });
}

// In the forward pass this was, per row i:  P_ij = e^(S_ij - lse_i),  O_i = sum_j P_ij M_ij V_j
// (M the dropout keep factors, 1 without dropout),  S = scale Q K^T.  So now we have
//   dV_j  = sum_i P_ij M_ij dO_i
//   dP_ij = (dO_i . V_j) M_ij
//   dS_ij = P_ij (dP_ij - D_i),   D_i = sum_j P_ij dP_ij = dO_i . O_i   (the softmax backward)
//   dQ_i  = scale sum_j dS_ij K_j,   dK_j = scale sum_i dS_ij Q_i
// with each tile's P rebuilt from the saved lse instead of stored.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionGeom& g) {
  const int64_t D = g.D, Dv = g.Dv;
  parallel_for(g.BH, 1, [&](int64_t w0, int64_t w1) {
    std::vector<T> P(size_t(kBq * kBk)), dP(size_t(kBq * kBk)), Dd(kBq);
    std::vector<KeyRange> range(kBq);
    for (int64_t bh = w0; bh < w1; ++bh) {
      const int64_t b = bh / g.H;
      const T *K = k + bh * g.Tk * D, *V = v + bh * g.Tk * Dv;
      T *dK = dk + bh * g.Tk * D, *dV = dv + bh * g.Tk * Dv;
      for (int64_t i0 = 0; i0 < g.Tq; i0 += kBq) {
        const int64_t nq = std::min(kBq, g.Tq - i0);
        const T *Q = q + (bh * g.Tq + i0) * D, *dO = dout + (bh * g.Tq + i0) * Dv, *O = out + (bh * g.Tq + i0) * Dv;
        const T* L = lse + bh * g.Tq + i0;
        T* dQ = dq + (bh * g.Tq + i0) * D;
        int64_t jlo = g.Tk, jhi = 0;
        for (int64_t i = 0; i < nq; ++i) {
          range[i] = key_range(g, b, i0 + i);
          if (range[i].lo < range[i].hi) jlo = std::min(jlo, range[i].lo), jhi = std::max(jhi, range[i].hi);
          T d = 0;
          for (int64_t c = 0; c < Dv; ++c) d += dO[i * Dv + c] * O[i * Dv + c];
          Dd[i] = d;
        }
        for (int64_t j0 = jlo; j0 < jhi; j0 += kBk) {
          const int64_t nk = std::min(kBk, jhi - j0);
          gemm_blas(false, true, nq, nk, D, T(g.scale), Q, D, K + j0 * D, D, T(0), P.data(), kBk);  // S
          gemm_blas(false, true, nq, nk, Dv, T(1), dO, Dv, V + j0 * Dv, Dv, T(0), dP.data(), kBk);  // dO V^T
          for (int64_t i = 0; i < nq; ++i) {
            T *p = P.data() + i * kBk, *dp = dP.data() + i * kBk;
            // a row that saw no key (lse = +inf) has P = 0: hide all of it
            const bool none = !(L[i] < std::numeric_limits<T>::infinity());
            hide_keys(p, g, b, j0, nk, none ? KeyRange{0, 0} : range[i], -std::numeric_limits<T>::infinity());
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
          }
          // dV_j += (P M)^T dO ;  dQ_i += scale dS K_j ;  dK_j += scale dS^T Q_i
          gemm_blas(true, false, nk, Dv, nq, T(1), P.data(), kBk, dO, Dv, T(1), dV + j0 * Dv, Dv);
          gemm_blas(false, false, nq, D, nk, T(g.scale), dP.data(), kBk, K + j0 * D, D, T(1), dQ, D);
          gemm_blas(true, false, nk, D, nq, T(g.scale), dP.data(), kBk, Q, D, T(1), dK + j0 * D, D);
        }
      }
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionGeom&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionGeom&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionGeom&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const AttentionGeom&);

}  // namespace ag::cpu
