#pragma once
// Block-sparse attention patterns: the block_mask of scaled_dot_product_attention (SdpaOptions,
// nn::AttentionOptions). A pattern over T positions cut into n = ceil(T / bs) blocks of bs
// positions (the last one may be shorter) is a b8 (n, n) tensor, true where block row a (queries
// a bs .. a bs + bs - 1) sees block column c (the keys of block c). Query i sees key j when the
// other masks allow it and mask[i / bs, j / bs] is true. The fused kernels skip every tile whose
// blocks are all dropped, so attention costs O(kept blocks bs^2 d) instead of O(T^2 d): the
// counts below are the cost, in blocks of bs^2 scores.
//
// The tensors are built on `device` (the cpu by default; scaled_dot_product_attention also takes
// a cpu mask for inputs on a GPU and copies it there).
#include "autograd/ops.h"

namespace ag::nn {

// Longformer / BigBird style local + global attention, with w = window_blocks, g = global_blocks:
//   kept(a, c) = |a - c| <= w      a band of 2 w + 1 blocks around the diagonal (local)
//             or a < g or c < g    the first g blocks are global: they see every block and
//                                  every block sees them
// Kept blocks, with m = n - g (the blocks that are not global) and w' = min(w, m - 1):
//   g n + (n - g) g + m (2 w' + 1) - w' (w' + 1)      = O(n (2 w + 1 + 2 g)): linear in T
// (global rows, then global columns of the other rows, then the band among the other blocks; a
// band row loses w' - d of its blocks d from an end). w >= n - 1 or g >= n keeps every block.
// Autoregressive: set causal as well (the band then keeps its left half and the diagonal).
// Raises ag::Error for T < 0, block_size < 1, window_blocks < 0 or global_blocks < 0.
Tensor local_global_block_mask(int64_t T, int64_t block_size, int64_t window_blocks, int64_t global_blocks,
                               Device device = Device::cpu());

// Sparse Transformer (Child et al. 2019) strided attention at block granularity, s = stride_blocks:
//   kept(a, c) = |a - c| < s                 local: the s - 1 blocks on each side and the diagonal
//             or (a - c) mod s == 0          strided: every s-th block, both directions
// Kept blocks, for s <= n:
//   n (2 s - 1) - s (s - 1)  +  2 sum_{k >= 1, k s < n} (n - k s)      ~ n (2 s - 1) + n^2 / s
// (the local band, then the strided diagonals |a - c| = k s, which lie outside it). The total is
// smallest near s = sqrt(n / 2), about 2 sqrt(2) n^1.5 blocks: the paper's O(T sqrt(T)). s = 1 keeps
// every block. With causal (the autoregressive version of the paper) only c <= a remain, about half.
// Raises ag::Error for T < 0, block_size < 1 or stride_blocks < 1.
Tensor strided_block_mask(int64_t T, int64_t block_size, int64_t stride_blocks, Device device = Device::cpu());

}  // namespace ag::nn
