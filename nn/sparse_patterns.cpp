#include "nn/sparse_patterns.h"

#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

namespace ag::nn {

namespace {

// The (n, n) b8 mask of kept(a, c), n = ceil(T / block_size), on device.
template <class Kept>
Tensor block_mask_of(int64_t T, int64_t block_size, Device device, Kept kept) {
  const int64_t n = (T + block_size - 1) / block_size;
  std::unique_ptr<bool[]> m(new bool[size_t(n * n)]);
  for (int64_t a = 0; a < n; ++a)
    for (int64_t c = 0; c < n; ++c) m[size_t(a * n + c)] = kept(a, c);
  return from_vector<bool>(std::span<const bool>(m.get(), size_t(n * n)), {n, n}, device);
}

}  // namespace

Tensor local_global_block_mask(int64_t T, int64_t block_size, int64_t window_blocks, int64_t global_blocks,
                               Device device) {
  check(T >= 0 && block_size >= 1 && window_blocks >= 0 && global_blocks >= 0,
        "local_global_block_mask: expected T >= 0, block_size >= 1, window_blocks >= 0 and global_blocks >= 0, got "
        "T {}, block_size {}, window_blocks {}, global_blocks {}",
        T, block_size, window_blocks, global_blocks);
  return block_mask_of(T, block_size, device, [&](int64_t a, int64_t c) {
    return std::abs(a - c) <= window_blocks || a < global_blocks || c < global_blocks;
  });
}

Tensor strided_block_mask(int64_t T, int64_t block_size, int64_t stride_blocks, Device device) {
  check(T >= 0 && block_size >= 1 && stride_blocks >= 1,
        "strided_block_mask: expected T >= 0, block_size >= 1 and stride_blocks >= 1, got T {}, block_size {}, "
        "stride_blocks {}",
        T, block_size, stride_blocks);
  return block_mask_of(T, block_size, device, [&](int64_t a, int64_t c) {
    return std::abs(a - c) < stride_blocks || (a - c) % stride_blocks == 0;
  });
}

}  // namespace ag::nn
