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
//       block_mask (bs)          block_mask[i / bs][j / bs] is true     (a block-sparse pattern)
//   The block mask, of ceil(Tq / bs) x ceil(Tk / bs) blocks shared by every batch element and head,
//   is indexed by the query's own index i (not a): block row i / bs, block column j / bs.
//   The first three leave one contiguous range of keys per query,
//       lo(i) = max(0, a - w)  (0 without a window)
//       hi(i) = min(Tk, len[b], a + 1 if causal, a + w + 1 if window)      visible: lo(i) <= j < hi(i)
//   (key_range), and the masks then remove single keys from it (key_masked, block_kept);
//   visible(i, j) is all three. A query whose range is empty, or whose every key is masked, sees
//   nothing: its output is 0, not NaN.
//
// Tiles. The kernels cut the (query, key) plane into tiles, rows [i0, i1) x keys [j0, j1), and skip
// the work of a tile no query in it can see. That rests on one fact: lo(i) and hi(i) never decrease
// as i grows (a query further down sees the same keys or later ones). So every key that rows
// [i0, i1) may see lies in
//       key_bounds(i0, i1) = [lo(i0), hi(i1 - 1))              (two rows looked at, O(1))
// and a tile is
//       hidden    when [j0, j1) misses key_bounds: no (i, j) in it is visible (tile_hidden)
//                 or when every block of the block mask it overlaps is dropped (block_cover: none)
//       full      when every row's range covers [j0, j1), i.e. lo(i1 - 1) <= j0 and hi(i0) >= j1,
//                 there is no key_padding_mask and every block it overlaps is kept (block_cover:
//                 all): every (i, j) in it is visible, no masking needed
//       partial   otherwise: decide (i, j) by (i, j)
// (tile_visibility). The GPU kernels walk key_bounds and skip hidden tiles. The CPU kernel walks
// key_hull(i0, i1) instead, the smallest range holding every key its rows see by range (rows that
// see nothing left out; one look at each row): it reads no key past the last one any row sees.
// With a block mask it walks only the runs of block columns that some block row of its query
// tile keeps (kept_run), so its cost grows with the kept blocks, not with Tq x Tk.
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
  // block-sparse pattern: (ceil(Tq / block_size), block_cols) row-major, true = the block is kept,
  // or null. block_cols = ceil(Tk / block_size), its row stride.
  const bool* block_mask = nullptr;
  int64_t block_cols = 0, block_size = 1;
};

// snippet-begin: visible
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
// Whether the block of (i, j) is kept by block_mask (true without one).
AG_HD inline bool block_kept(const Visibility& m, int64_t i, int64_t j) {
  return !m.block_mask || m.block_mask[(i / m.block_size) * m.block_cols + j / m.block_size];
}
// Whether query i of batch element b sees key j, its row range r = key_range(m, b, i) given: the
// element rule (in r, not key_masked, block_kept).
AG_HD inline bool sees(const Visibility& m, int64_t b, int64_t i, KeyRange r, int64_t j) {
  return j >= r.lo && j < r.hi && !key_masked(m, b, j) && block_kept(m, i, j);
}
// The element rule: may query i of batch element b see key j?
AG_HD inline bool visible(const Visibility& m, int64_t b, int64_t i, int64_t j) {
  return sees(m, b, i, key_range(m, b, i), j);
}
// snippet-end: visible

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
// How the blocks of block_mask that rows [i0, i1) x keys [j0, j1) (both non-empty) overlap are
// kept: none of them, some, or all (all without a block mask). Looks at each overlapped block once:
// (i1 - i0) / bs + 1 rows of (j1 - j0) / bs + 1, a few for the usual bs >= 16.
enum class BlockCover { none, some, all };
AG_HD inline BlockCover block_cover(const Visibility& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (!m.block_mask) return BlockCover::all;
  bool any = false, every = true;
  for (int64_t r = i0 / m.block_size; r <= (i1 - 1) / m.block_size; ++r)
    for (int64_t c = j0 / m.block_size; c <= (j1 - 1) / m.block_size; ++c) {
      const bool kept = m.block_mask[r * m.block_cols + c];
      any = any || kept, every = every && kept;
    }
  return every ? BlockCover::all : any ? BlockCover::some : BlockCover::none;
}
// Rows [i0, i1) x keys [j0, j1) (both non-empty): hidden, full or partial, as defined above.
AG_HD inline TileVisibility tile_visibility(const Visibility& m, int64_t b, int64_t i0, int64_t i1, int64_t j0,
                                            int64_t j1) {
  if (tile_hidden(m, b, i0, i1, j0, j1)) return TileVisibility::hidden;
  const BlockCover cover = block_cover(m, i0, i1, j0, j1);
  if (cover == BlockCover::none) return TileVisibility::hidden;
  if (cover == BlockCover::all && !m.key_mask && key_range(m, b, i1 - 1).lo <= j0 && key_range(m, b, i0).hi >= j1)
    return TileVisibility::full;
  return TileVisibility::partial;
}
// The next run of keys, within [j, end), whose block columns some block row of rows [i0, i1)
// keeps: [lo, hi) with lo the first such key >= j and hi the end of the run of kept columns from
// there (clipped to end); empty ({end, end}) when none is left. Without a block mask: [j, end).
// The CPU kernel walks these runs instead of every key tile: keys outside them are hidden from
// every row of the tile by the block mask, so it reads no key of a dropped block column.
AG_HD inline bool block_column_kept(const Visibility& m, int64_t r0, int64_t r1, int64_t c) {  // by rows r0..r1
  for (int64_t r = r0; r <= r1; ++r)
    if (m.block_mask[r * m.block_cols + c]) return true;
  return false;
}
AG_HD inline KeyRange kept_run(const Visibility& m, int64_t i0, int64_t i1, int64_t j, int64_t end) {
  if (!m.block_mask) return j < end ? KeyRange{j, end} : KeyRange{end, end};
  const int64_t bs = m.block_size, r0 = i0 / bs, r1 = (i1 - 1) / bs;
  int64_t c = j / bs;
  while (c * bs < end && !block_column_kept(m, r0, r1, c)) ++c;
  const int64_t lo = c * bs > j ? c * bs : j;
  if (lo >= end) return {end, end};
  while (c * bs < end && block_column_kept(m, r0, r1, c)) ++c;
  return {lo, c * bs < end ? c * bs : end};
}

// ALiBi (Press et al., 2022): the bias added to the scaled score of query i and key j in a head of
// slope m, -m |a - j| with a = i + (Tk - Tq) the query's position on the key axis (bottom-right
// aligned, as the masks; FlashAttention's convention), so causal or not, nearer keys weigh more.
// Not a mask: every key stays visible.
AG_HD inline double alibi_bias(double slope, int64_t Tq, int64_t Tk, int64_t i, int64_t j) {
  const int64_t dist = i + (Tk - Tq) - j;
  return -slope * double(dist < 0 ? -dist : dist);
}

}  // namespace ag
