// The attention mask rule (core/kernels/attention_mask.h) and the dropout rule of the fused
// attention (core/kernels/dropout_mask.h), which the CPU kernel, the GPU kernels and the composed
// path all call: the rule against docs/ops.md's formula, its tile classification against the rule
// element by element, and the CPU kernel against a reference built from the rule, for every mask
// (causal, window, key padding by lengths or mask, a KV cache's offset, tiles cut at the edges).
// The same rule on the GPU: tests/cuda/test_cuda_rules.cpp.
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/kernels.h"
#include "core/kernels/attention_mask.h"
#include "core/kernels/dropout_mask.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// docs/ops.md, scaled_dot_product_attention: key j is hidden from query i when
//   causal and j > i + Tk - Tq,  or  window w >= 0 and |i + Tk - Tq - j| > w,
//   or j >= len[b],  or mask[b, j]
// written here from the docs, apart from the header, as the oracle of the rule.
bool docs_visible(const Visibility& m, int64_t b, int64_t i, int64_t j) {
  const int64_t a = i + m.Tk - m.Tq;
  if (m.causal && j > a) return false;
  if (m.window >= 0 && std::abs(a - j) > m.window) return false;
  if (m.lengths && j >= m.lengths[b]) return false;
  if (m.key_mask && m.key_mask[b * m.Tk + j]) return false;
  return true;
}

// Every combination of options over B = 2 batch elements of Tq queries and Tk <= 64 keys: no
// padding, lengths (one of them 0), a scattered key_mask, a key_mask hiding all of element 1.
// Calls f(rule) with lengths and key_mask pointing into storage that lives through the call.
template <class F>
void for_each_mask(int64_t Tq, int64_t Tk, F f) {
  REQUIRE(Tk <= 64);
  const int64_t lens[2] = {Tk, std::max<int64_t>(Tk - 3, 0)};
  const int64_t short_lens[2] = {0, (Tk + 1) / 2};
  bool km[2 * 64] = {}, km_all[2 * 64] = {};  // (B, Tk)
  for (int64_t j = 0; j < Tk; ++j) {
    km[j] = j % 3 == 1, km[Tk + j] = j >= Tk / 2 || j == 0;
    km_all[Tk + j] = true;
  }
  for (bool causal : {false, true}) {
    if (causal && Tq > Tk) continue;  // the op requires Tq <= Tk with causal
    for (int64_t window : {int64_t(-1), int64_t(0), int64_t(1), int64_t(2), int64_t(5), Tk})
      for (int pad = 0; pad < 5; ++pad) {
        Visibility m{Tq, Tk, causal, window, nullptr, nullptr};
        if (pad == 1) m.lengths = lens;
        if (pad == 2) m.lengths = short_lens;
        if (pad == 3) m.key_mask = km;
        if (pad == 4) m.key_mask = km_all;
        f(m);
      }
  }
}

}  // namespace

TEST_CASE("attention mask: known values of the rule") {
  // Tq 2 queries at the end of Tk 5 keys: they stand at positions a = 3 and 4.
  Visibility m{2, 5, true, -1, nullptr, nullptr};
  CHECK(key_range(m, 0, 0).lo == 0);
  CHECK(key_range(m, 0, 0).hi == 4);  // causal: keys 0..3
  CHECK(key_range(m, 0, 1).hi == 5);
  m.window = 1;  // with causal: the last 2 keys up to a
  CHECK(key_range(m, 0, 0).lo == 2);
  CHECK(key_range(m, 0, 0).hi == 4);
  m.causal = false;  // |a - j| <= 1
  CHECK(key_range(m, 0, 0).lo == 2);
  CHECK(key_range(m, 0, 0).hi == 5);
  const int64_t len[1] = {3};
  m.lengths = len;  // j < 3 as well: query 1 (a = 4) sees keys [3, 3): nothing
  CHECK(key_range(m, 0, 0).lo == 2);
  CHECK(key_range(m, 0, 0).hi == 3);
  CHECK(key_range(m, 0, 1).empty());
  const bool mask[5] = {false, false, true, false, false};
  m.key_mask = mask;
  CHECK_FALSE(visible(m, 0, 0, 2));  // in range, masked
  CHECK_FALSE(visible(m, 0, 0, 1));  // not masked, out of the window
  m.lengths = nullptr, m.window = -1;
  CHECK(visible(m, 0, 0, 0));
  CHECK_FALSE(visible(m, 0, 0, 2));
  // a length outside [0, Tk] is clamped: a kernel never reads past Tk
  const int64_t wild[2] = {-4, 99};
  const Visibility w{3, 3, false, -1, wild, nullptr};
  CHECK(key_range(w, 0, 0).empty());
  CHECK(key_range(w, 1, 0).hi == 3);
}

TEST_CASE("attention mask: the rule is docs/ops.md's, for every option and a KV cache's offset") {
  int64_t cases = 0;
  for (int64_t Tq : {1, 3, 7, 12})
    for (int64_t Tk : {1, 4, 7, 12})
      for_each_mask(Tq, Tk, [&](const Visibility& m) {
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t i = 0; i < Tq; ++i) {
            const KeyRange r = key_range(m, b, i);
            CHECK(r.lo <= r.hi);
            CHECK(r.lo >= 0);
            CHECK(r.hi <= Tk);
            for (int64_t j = 0; j < Tk; ++j) {
              ++cases;
              const bool want = docs_visible(m, b, i, j);
              if (visible(m, b, i, j) != want) {
                FAIL_CHECK("Tq ", Tq, " Tk ", Tk, " causal ", m.causal, " window ", m.window, " b ", b, " i ", i,
                           " j ", j, ": rule ", !want, ", docs ", want);
                return;
              }
              // the range is the rule without key_mask
              CHECK(r.contains(j) == docs_visible({m.Tq, m.Tk, m.causal, m.window, m.lengths, nullptr}, b, i, j));
            }
          }
      });
  CHECK(cases > 10000);
}

TEST_CASE("attention mask: tile classification against the element rule") {
  // For every tile of every mask: "hidden" has no visible (i, j), "full" no hidden one; key_bounds
  // and key_hull hold every visible key of their rows, key_hull is the smallest such range, and
  // key_bounds starts where the hull does (the fact the GPU kernels' tile walk rests on).
  int64_t hidden = 0, full = 0, partial = 0;
  for (int64_t Tq : {1, 5, 9})
    for (int64_t Tk : {1, 6, 11})
      for_each_mask(Tq, Tk, [&](const Visibility& m) {
        for (int64_t bq : {1, 2, 4})
          for (int64_t bk : {1, 3, 4})
            for (int64_t b = 0; b < 2; ++b)
              for (int64_t i0 = 0; i0 < Tq; i0 += bq) {
                const int64_t i1 = std::min(i0 + bq, Tq);
                int64_t lo = Tk, hi = 0;  // the hull by brute force, ignoring key_mask
                for (int64_t i = i0; i < i1; ++i)
                  for (int64_t j = 0; j < Tk; ++j)
                    if (key_range(m, b, i).contains(j)) lo = std::min(lo, j), hi = std::max(hi, j + 1);
                const KeyRange hull = key_hull(m, b, i0, i1), bounds = key_bounds(m, b, i0, i1);
                if (lo < hi) {
                  CHECK(hull.lo == lo);
                  CHECK(hull.hi == hi);
                  CHECK(bounds.lo == lo);
                  CHECK(bounds.hi >= hi);
                } else {
                  CHECK(hull.empty());
                }
                for (int64_t j0 = 0; j0 < Tk; j0 += bk) {
                  const int64_t j1 = std::min(j0 + bk, Tk);
                  int64_t seen = 0;
                  for (int64_t i = i0; i < i1; ++i)
                    for (int64_t j = j0; j < j1; ++j) seen += visible(m, b, i, j);
                  const int64_t all = (i1 - i0) * (j1 - j0);
                  const TileVisibility t = tile_visibility(m, b, i0, i1, j0, j1);
                  CHECK(tile_hidden(m, b, i0, i1, j0, j1) == (t == TileVisibility::hidden));
                  INFO("Tq ", Tq, " Tk ", Tk, " causal ", m.causal, " window ", m.window, " tile rows [", i0, ", ",
                       i1, ") keys [", j0, ", ", j1, ")");
                  if (t == TileVisibility::hidden) {
                    CHECK(seen == 0);
                    ++hidden;
                  } else if (t == TileVisibility::full) {
                    CHECK(seen == all);
                    ++full;
                  } else {
                    ++partial;
                  }
                  // without key_mask, when the first and the last row see a key (so every row between
                  // does, and their ranges join up), hidden and full are exact
                  if (!m.key_mask && !key_range(m, b, i0).empty() && !key_range(m, b, i1 - 1).empty()) {
                    CHECK((t == TileVisibility::hidden) == (seen == 0));
                    CHECK((t == TileVisibility::full) == (seen == all));
                  }
                }
              }
      });
  CHECK(hidden > 1000);
  CHECK(full > 1000);
  CHECK(partial > 1000);
}

// ---- the CPU kernel against a reference built from the rule -----------------------------------
namespace {

// One attention call on the CPU kernel, in f64, and the same computed directly from the rule:
//   S_ij = scale q_i . k_j where visible(b, i, j), P = softmax over the visible j, out = (P * M) V,
//   lse_i = log sum_j e^S_ij over the visible j (+inf for a row that sees nothing, out = 0)
// and backward (dout given): dV = (P M)^T dO, dS = P (dO V^T M - rowsum(dO * out)), dQ = scale dS K,
// dK = scale dS^T Q. k and v are read from a KV cache of Tmax >= Tk positions (strided heads).
struct KernelCase {
  int64_t B = 2, H = 2, Tq = 5, Tk = 5, Tmax = 5, D = 4, Dv = 3;
  Visibility m;
  double dropout = 0;
  uint64_t seed = 3, offset = 17;
};

struct Run {
  std::vector<double> out, lse, dq, dk, dv;
};

std::vector<double> randoms(size_t n, uint64_t seed) {
  Generator g(seed);
  return randn({int64_t(n)}, DType::f64, &g).to_vector<double>();
}

// What the kernel computes, with q (B H, Tq, D), the cache k (B H, Tmax, D), v (B H, Tmax, Dv).
Run run_kernel(const KernelCase& c, const std::vector<double>& q, const std::vector<double>& k,
               const std::vector<double>& v, const std::vector<double>& dout) {
  cpu::AttentionGeom g;
  g.BH = c.B * c.H, g.H = c.H, g.Tq = c.Tq, g.Tk = c.Tk, g.D = c.D, g.Dv = c.Dv;
  g.k = {c.H * c.Tmax * c.D, c.Tmax * c.D, c.D};
  g.v = {c.H * c.Tmax * c.Dv, c.Tmax * c.Dv, c.Dv};
  g.scale = 1.0 / std::sqrt(double(c.D));
  g.causal = c.m.causal, g.window = c.m.window, g.lengths = c.m.lengths, g.key_mask = c.m.key_mask;
  g.dropout = c.dropout, g.seed = c.seed, g.offset = c.offset;
  const size_t BH = size_t(c.B * c.H);
  Run r;
  r.out.assign(BH * size_t(c.Tq * c.Dv), 0), r.lse.assign(BH * size_t(c.Tq), 0);
  cpu::attention_forward<double>(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), g);
  // the kernel writes the gradients (core/kernels/attention.h): what they held before must not matter
  const double junk = std::numeric_limits<double>::quiet_NaN();
  r.dq.assign(q.size(), junk), r.dk.assign(BH * size_t(c.Tk * c.D), junk), r.dv.assign(BH * size_t(c.Tk * c.Dv), junk);
  cpu::attention_backward<double>(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                  r.out.data(), r.lse.data(), g);
  return r;
}

Run run_reference(const KernelCase& c, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& dout) {
  const int64_t BH = c.B * c.H, Tq = c.Tq, Tk = c.Tk, D = c.D, Dv = c.Dv;
  const double scale = 1.0 / std::sqrt(double(D)), keep = c.dropout > 0 ? dropout_scale<double>(c.dropout) : 1.0;
  Run r;
  r.out.assign(size_t(BH * Tq * Dv), 0), r.lse.assign(size_t(BH * Tq), 0);
  r.dq.assign(size_t(BH * Tq * D), 0), r.dk.assign(size_t(BH * Tk * D), 0), r.dv.assign(size_t(BH * Tk * Dv), 0);
  std::vector<double> s(static_cast<size_t>(Tk)), p(static_cast<size_t>(Tk)), mk(static_cast<size_t>(Tk));
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / c.H;
    const double* K = k.data() + bh * c.Tmax * D;
    const double* V = v.data() + bh * c.Tmax * Dv;
    for (int64_t i = 0; i < Tq; ++i) {
      const double* Q = q.data() + (bh * Tq + i) * D;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Tk; ++j) {
        double d = 0;
        for (int64_t e = 0; e < D; ++e) d += Q[e] * K[j * D + e];
        s[size_t(j)] = visible(c.m, b, i, j) ? scale * d : -std::numeric_limits<double>::infinity();
        mx = std::max(mx, s[size_t(j)]);
        mk[size_t(j)] = c.dropout > 0 ? (dropout_keep(c.seed, c.offset, attention_dropout_element(bh, i, j, Tq, Tk),
                                                      c.dropout)
                                             ? keep
                                             : 0.0)
                                      : 1.0;
      }
      double* O = r.out.data() + (bh * Tq + i) * Dv;
      if (mx == -std::numeric_limits<double>::infinity()) {  // sees nothing: out 0, lse +inf, no gradient
        r.lse[size_t(bh * Tq + i)] = std::numeric_limits<double>::infinity();
        continue;
      }
      double l = 0;
      for (int64_t j = 0; j < Tk; ++j) l += (p[size_t(j)] = std::exp(s[size_t(j)] - mx));
      for (int64_t j = 0; j < Tk; ++j) p[size_t(j)] /= l;
      r.lse[size_t(bh * Tq + i)] = mx + std::log(l);
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t e = 0; e < Dv; ++e) O[e] += p[size_t(j)] * mk[size_t(j)] * V[j * Dv + e];
      const double* dO = dout.data() + (bh * Tq + i) * Dv;
      double Di = 0;
      for (int64_t e = 0; e < Dv; ++e) Di += dO[e] * O[e];
      for (int64_t j = 0; j < Tk; ++j) {
        double dp = 0;
        for (int64_t e = 0; e < Dv; ++e) dp += dO[e] * V[j * Dv + e];
        const double ds = p[size_t(j)] * (dp * mk[size_t(j)] - Di);
        for (int64_t e = 0; e < Dv; ++e) r.dv[size_t((bh * Tk + j) * Dv + e)] += p[size_t(j)] * mk[size_t(j)] * dO[e];
        for (int64_t e = 0; e < D; ++e) {
          r.dq[size_t((bh * Tq + i) * D + e)] += scale * ds * K[j * D + e];
          r.dk[size_t((bh * Tk + j) * D + e)] += scale * ds * Q[e];
        }
      }
    }
  }
  return r;
}

void expect_kernel_matches_rule(const KernelCase& c) {
  INFO("B ", c.B, " H ", c.H, " Tq ", c.Tq, " Tk ", c.Tk, " Tmax ", c.Tmax, " causal ", c.m.causal, " window ",
       c.m.window, " lengths ", c.m.lengths != nullptr, " key_mask ", c.m.key_mask != nullptr, " dropout ", c.dropout);
  const size_t BH = size_t(c.B * c.H);
  const std::vector<double> q = randoms(BH * size_t(c.Tq * c.D), 1), k = randoms(BH * size_t(c.Tmax * c.D), 2),
                            v = randoms(BH * size_t(c.Tmax * c.Dv), 3), dout = randoms(BH * size_t(c.Tq * c.Dv), 4);
  const Run got = run_kernel(c, q, k, v, dout), want = run_reference(c, q, k, v, dout);
  check_close(got.lse, want.lse, 1e-12, 1e-12);  // +inf exactly where a row sees nothing
  check_close(got.out, want.out, 1e-12, 1e-11);
  check_close(got.dq, want.dq, 1e-12, 1e-10);
  check_close(got.dk, want.dk, 1e-12, 1e-10);
  check_close(got.dv, want.dv, 1e-12, 1e-10);
}

}  // namespace

TEST_CASE("attention: the CPU kernel computes the mask rule's attention, every mask") {
  // small shapes, every combination of options (for_each_mask), queries at the end of the keys
  for (auto [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 5}, {3, 7}, {7, 4}, {12, 12}})
    for_each_mask(Tq, Tk, [&](const Visibility& m) {
      KernelCase c;
      c.Tq = Tq, c.Tk = Tk, c.Tmax = Tk + 2, c.m = m;  // k, v: the first Tk positions of a cache
      expect_kernel_matches_rule(c);
    });
}

TEST_CASE("attention: the CPU kernel computes the mask rule's attention at the edges of its tiles") {
  // The CPU kernel's tiles are 32 queries x 256 keys: query counts around 32 and 64 and key counts
  // around 256, with windows whose edges fall inside, on and across tile boundaries.
  const int64_t lens[2] = {257, 200}, lens0[2] = {0, 31};
  bool mask[2 * 300];
  for (int64_t Tq : {31, 33, 64})
    for (int64_t Tk : {255, 256, 257, 300}) {
      for (size_t j = 0; j < size_t(2 * Tk); ++j) mask[j] = (j * 7) % 11 == 3;
      for (bool causal : {false, true})
        for (int64_t window : {int64_t(-1), int64_t(0), int64_t(31), int64_t(200)})
          for (int pad = 0; pad < 4; ++pad) {
            KernelCase c;
            c.B = 2, c.H = 1, c.Tq = Tq, c.Tk = Tk, c.Tmax = Tk + 3, c.D = 3, c.Dv = 2;
            c.m = {Tq, Tk, causal, window, pad == 1 ? lens : pad == 2 ? lens0 : nullptr, pad == 3 ? mask : nullptr};
            if (pad == 1 && Tk < 257) continue;  // lengths must not exceed Tk
            expect_kernel_matches_rule(c);
          }
    }
}

TEST_CASE("attention: the CPU kernel's dropout keeps dropout_keep's weights") {
  // out_i = sum_j P_ij M_ij V_j with M_ij = 1/(1 - p) where dropout_keep(seed, offset,
  // (bh Tq + i) Tk + j) holds, else 0: the reference above draws M from the rule, element by element.
  const int64_t lens[2] = {9, 4};
  for (double p : {0.1, 0.5, 0.9})
    for (bool causal : {false, true}) {
      KernelCase c;
      c.Tq = 6, c.Tk = 9, c.Tmax = 11, c.dropout = p, c.seed = 77, c.offset = (uint64_t(1) << 32) - 5;
      c.m = {c.Tq, c.Tk, causal, causal ? 3 : -1, lens, nullptr};
      expect_kernel_matches_rule(c);
    }
  // with V = identity (Dv = Tk, v_j = e_j) out_ij = P_ij M_ij: zero exactly where the rule drops
  KernelCase c;
  c.B = 1, c.H = 2, c.Tq = 40, c.Tk = 70, c.Tmax = 70, c.Dv = 70, c.dropout = 0.3, c.seed = 5, c.offset = 9;
  c.m = {c.Tq, c.Tk, false, -1, nullptr, nullptr};
  std::vector<double> q = randoms(size_t(2 * 40 * 4), 1), k = randoms(size_t(2 * 70 * 4), 2), v(size_t(2 * 70 * 70), 0);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 70; ++j) v[size_t((h * 70 + j) * 70 + j)] = 1;
  const Run r = run_kernel(c, q, k, v, std::vector<double>(size_t(2 * 40 * 70), 0.0));
  int64_t dropped = 0;
  for (int64_t bh = 0; bh < 2; ++bh)
    for (int64_t i = 0; i < 40; ++i)
      for (int64_t j = 0; j < 70; ++j) {
        const bool kept = dropout_keep(5, 9, attention_dropout_element(bh, i, j, 40, 70), 0.3);
        const double o = r.out[size_t((bh * 40 + i) * 70 + j)];
        if (kept != (o != 0)) FAIL_CHECK("bh ", bh, " i ", i, " j ", j, ": kept ", kept, ", out ", o);
        dropped += !kept;
      }
  CHECK(dropped > 2 * 40 * 70 / 5);  // about 30% of 5600
  CHECK(dropped < 2 * 40 * 70 * 2 / 5);
}

TEST_CASE("attention: the CPU kernel lets each query see exactly the keys the rule allows") {
  // V = identity (Dv = Tk): out_ij = P_ij, which is > 0 exactly where key j is visible from query i
  // (scores of a few units: e^(s - max) never underflows) and 0 where it is hidden.
  const int64_t lens[2] = {300, 120};
  for (int64_t window : {int64_t(-1), int64_t(40)})
    for (bool causal : {false, true})
      for (bool padded : {false, true}) {
        const int64_t Tq = 70, Tk = 300;
        KernelCase c;
        c.B = 2, c.H = 1, c.Tq = Tq, c.Tk = Tk, c.Tmax = Tk, c.D = 4, c.Dv = Tk;
        c.m = {Tq, Tk, causal, window, padded ? lens : nullptr, nullptr};
        std::vector<double> q = randoms(size_t(2 * Tq * 4), 1), k = randoms(size_t(2 * Tk * 4), 2),
                            v(size_t(2 * Tk * Tk), 0);
        for (int64_t bh = 0; bh < 2; ++bh)
          for (int64_t j = 0; j < Tk; ++j) v[size_t((bh * Tk + j) * Tk + j)] = 1;
        const Run r = run_kernel(c, q, k, v, std::vector<double>(size_t(2 * Tq * Tk), 0.0));
        int64_t wrong = 0;
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t i = 0; i < Tq; ++i)
            for (int64_t j = 0; j < Tk; ++j)
              wrong += (r.out[size_t((b * Tq + i) * Tk + j)] > 0) != visible(c.m, b, i, j);
        INFO("window ", window, " causal ", causal, " padded ", padded);
        CHECK(wrong == 0);
      }
}

TEST_CASE("attention: the composed path's mask is the rule's (return_weights)") {
  // The weights the composed path returns are 0 exactly where the rule hides a key.
  Generator g(4);
  const int64_t B = 2, H = 1, Tq = 4, Tk = 9;
  Tensor q = randn({B, H, Tq, 3}, DType::f64, &g), k = randn({B, H, Tk, 3}, DType::f64, &g),
         v = randn({B, H, Tk, 2}, DType::f64, &g);
  const bool km[2 * 9] = {false, true, false, false, false, false, false, true, false,
                          true,  true, true,  false, false, false, true,  true, true};
  for (bool causal : {false, true})
    for (int64_t window : {int64_t(-1), int64_t(2)})
      for (bool masked : {false, true}) {
        SdpaOptions o;
        o.causal = causal, o.window = window, o.return_weights = true;
        if (masked) o.key_padding_mask = from_vector<bool>(std::span<const bool>(km, 18), {B, Tk});
        else o.key_padding_lengths = tensor<int64_t>({9, 5});
        const std::vector<double> w = scaled_dot_product_attention(q, k, v, o).weights.to_vector<double>();
        const int64_t lens[2] = {9, 5};
        const Visibility m{Tq, Tk, causal, window, masked ? nullptr : lens, masked ? km : nullptr};
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < Tq; ++i)
            for (int64_t j = 0; j < Tk; ++j) CHECK((w[size_t((b * Tq + i) * Tk + j)] > 0) == visible(m, b, i, j));
      }
}
