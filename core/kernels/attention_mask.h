#pragma once
// Which keys a query of scaled_dot_product_attention may see: the one rule that the CPU kernel
// (core/cpu/attention.cpp), the GPU kernels (cuda/attention.cu) and the composed path that returns
// the weights (autograd/ops/attention.cpp) all call, so they cannot drift apart. The op's entry in
// docs/ops.md ("hidden: ...") and docs/math/attention.md ("Masks") state it; here it is as math.
//
//   Batch element b has Tq queries i = 0 .. Tq-1 and Tk keys j = 0 .. Tk-1. The queries are the
//   LAST Tq positions of the key axis (new tokens at the end of a KV cache), so query i stands at
//       a = i + (Tk - Tq)                   (bottom-right aligned: a = i when Tq == Tk)
//   and key j is visible from query i when every option that is set allows it:
//       causal                   j <= a
//       window w >= 0            a - w <= j <= a + w      (with causal: the last w + 1 keys up to a)
//       key_padding_lengths      j < len[b]
//       key_padding_mask         mask[b, j] is false
//   The first three leave one contiguous range of keys per query,
//       lo(i) = max(0, a - w)  (0 without a window)
//       hi(i) = min(Tk, len[b], a + 1 if causal, a + w + 1 if window)      visible: lo(i) <= j < hi(i)
//   (key_range), and the mask then removes single keys from it (key_masked); visible(i, j) is both.
//   A query whose range is empty, or whose every key is masked, sees nothing: its output is 0, not
//   NaN.
//
// Tiles. The kernels cut the (query, key) plane into tiles, rows [i0, i1) x keys [j0, j1), and skip
// the work of a tile no query in it can see. That rests on one fact: lo(i) and hi(i) never decrease
// as i grows (a query further down sees the same keys or later ones). So every key that rows
// [i0, i1) may see lies in
//       key_bounds(i0, i1) = [lo(i0), hi(i1 - 1))              (two rows looked at, O(1))
// and a tile is
//       hidden    when [j0, j1) misses key_bounds: no (i, j) in it is visible (tile_hidden)
//       full      when every row's range covers [j0, j1), i.e. lo(i1 - 1) <= j0 and hi(i0) >= j1, and
//                 there is no key_padding_mask: every (i, j) in it is visible, no masking needed
//       partial   otherwise: decide (i, j) by (i, j)
// (tile_visibility). The GPU kernels walk key_bounds and skip hidden tiles. The CPU kernel walks
// key_hull(i0, i1) instead, the smallest range holding every key its rows see by range (rows that
// see nothing left out; one look at each row): it reads no key past the last one any row sees.
//
// Plain C++17 and AG_HD: nvcc compiles this header for the device, g++ for the host.
#include <cstdint>

#include "core/kernels.h"

namespace ag {

// [lo, hi): a contiguous range of keys, empty when lo >= hi.
struct KeyRange {
  int64_t lo, hi;
  AG_HD bool empty() const { return lo >= hi; }
  AG_HD bool contains(int64_t j) const { return lo <= j && j < hi; }
};

enum class TileVisibility { hidden, partial, full };

// The masking options of one attention call, as the kernels see them. lengths and key_mask point
// to memory the code calling the functions below can read (device memory in a GPU kernel). The
// GPU kernels' geometry derives from it, so they call these functions on it directly.
//
// The functions are plain functions of it, not members, and written with plain comparisons, in the
// form the GPU kernels' copy of the rule had: ptxas (sm_90) then gives the tiled kernels the same
// registers and no spills, where member functions, std-like min/max helpers or a call to
// key_masked inside sees cost up to 26 more registers or spills (one resident block less per SM).
struct Visibility {
  int64_t Tq = 0, Tk = 0;
  bool causal = false;
  int64_t window = -1;               // < 0: no window
  const int64_t* lengths = nullptr;  // (B) valid keys per batch element, or null
  const bool* key_mask = nullptr;    // (B, Tk) true = the key is hidden, or null
};

// lo(i) <= j < hi(i): the keys query i of batch element b may see before key_mask. Lengths outside
// [0, Tk] are clamped to it (the op front rejects them; a kernel must not read past Tk).
AG_HD inline KeyRange key_range(const Visibility& m, int64_t b, int64_t i) {
  const int64_t a = i + (m.Tk - m.Tq);  // the query's position on the key axis
  int64_t lo = 0, hi = m.Tk;
  if (m.lengths) hi = m.lengths[b] < 0 ? 0 : (m.lengths[b] < m.Tk ? m.lengths[b] : m.Tk);
  if (m.causal && a + 1 < hi) hi = a + 1;
  if (m.window >= 0) {  // |a - j| <= window; with causal the right half is gone already
    if (a - m.window > lo) lo = a - m.window;
    if (a + m.window + 1 < hi) hi = a + m.window + 1;
  }
  return {lo, hi > lo ? hi : lo};  // an empty range as [lo, lo): both ends still grow with i
}
// Whether key j of batch element b is hidden by key_padding_mask.
AG_HD inline bool key_masked(const Visibility& m, int64_t b, int64_t j) {
  return m.key_mask && m.key_mask[b * m.Tk + j];
}
// Whether key j is visible in row range r of batch element b: the element rule, its range given
// (in r, and not key_masked).
AG_HD inline bool sees(const Visibility& m, int64_t b, KeyRange r, int64_t j) {
  return j >= r.lo && j < r.hi && !(m.key_mask && m.key_mask[b * m.Tk + j]);
}
// The element rule: may query i of batch element b see key j?
AG_HD inline bool visible(const Visibility& m, int64_t b, int64_t i, int64_t j) {
  return sees(m, b, key_range(m, b, i), j);
}

// A range holding every key that rows [i0, i1) (i0 < i1) may see, from the first and last rows
// alone: lo and hi only grow with i. It may hold keys no row sees (around rows that see nothing).
AG_HD inline KeyRange key_bounds(const Visibility& m, int64_t b, int64_t i0, int64_t i1) {
  return {key_range(m, b, i0).lo, key_range(m, b, i1 - 1).hi};
}
// The smallest range holding every key that rows [i0, i1) see by range; empty if none sees any.
AG_HD inline KeyRange key_hull(const Visibility& m, int64_t b, int64_t i0, int64_t i1) {
  KeyRange h{m.Tk, 0};
  for (int64_t i = i0; i < i1; ++i) {
    const KeyRange r = key_range(m, b, i);
    if (r.empty()) continue;
    if (r.lo < h.lo) h.lo = r.lo;
    if (r.hi > h.hi) h.hi = r.hi;
  }
  return h.empty() ? KeyRange{0, 0} : h;
}
// Whether rows [i0, i1) x keys [j0, j1) (both non-empty) miss key_bounds, so that no (i, j) in the
// tile is visible: the test of a kernel that only skips work.
AG_HD inline bool tile_hidden(const Visibility& m, int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  return key_range(m, b, i0).lo >= j1 || key_range(m, b, i1 - 1).hi <= j0;
}
// Rows [i0, i1) x keys [j0, j1) (both non-empty): hidden, full or partial, as defined above.
AG_HD inline TileVisibility tile_visibility(const Visibility& m, int64_t b, int64_t i0, int64_t i1, int64_t j0,
                                            int64_t j1) {
  if (tile_hidden(m, b, i0, i1, j0, j1)) return TileVisibility::hidden;
  if (!m.key_mask && key_range(m, b, i1 - 1).lo <= j0 && key_range(m, b, i0).hi >= j1) return TileVisibility::full;
  return TileVisibility::partial;
}

}  // namespace ag
