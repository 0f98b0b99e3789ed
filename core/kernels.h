#pragma once
// The index of kernels. A kernel is a plain function over raw pointers and sizes, outputs first;
// the op front (autograd/ops/) checks shapes and dtypes, then calls it through KERNEL() (core/
// dispatch.h), which picks cpu:: or cuda:: by device. Plain C++ only: nvcc compiles this header.
//
// Each op family declares its kernels in core/kernels/<family>.h (included below); the math of
// each op is in autograd/ops.h, and each kernel file points back to it.
#include <cstdint>

// AG_HD marks the per-element math (core/kernels/pointwise.h) callable from host and device code.
// On the CPU it is also forced inline: it runs inside loops that must vectorise, and GCC's
// heuristics sometimes left a functor (or the fast_exp under it) as a call in one copy of a loop,
// which stops vectorisation (measured: the one-thread branch of parallel_for ran GELU 3x slower).
#if defined(__CUDACC__)
#define AG_HD __host__ __device__
#elif defined(__GNUC__)
#define AG_HD __attribute__((always_inline))
#else
#define AG_HD
#endif

namespace ag {

inline constexpr int kLayoutMaxDims = 8;

// A strided view as a kernel sees it: element strides, the base pointer passed separately.
// A stride of 0 is a broadcast dimension.
struct Layout {
  int ndim = 0;
  int64_t shape[kLayoutMaxDims] = {};
  int64_t strides[kLayoutMaxDims] = {};

  AG_HD int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  AG_HD bool is_contiguous() const {
    if (numel() == 0) return true;
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
};

// ---- Philox4x32-10: the counter-based generator behind rand/randn/randint/dropout ---------
// Element i of a random tensor is a pure function of (seed, offset + i/4, lane i%4), so the same
// seed gives the same numbers on any thread count and, later, on the GPU.
struct Philox4 {
  uint32_t v[4];
};
AG_HD inline Philox4 philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}
// uniform in [0, 1) from the top 24 bits (exactly representable in f32)
AG_HD inline float uniform01(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

}  // namespace ag

#include "core/kernels/core.h"
#include "core/kernels/reduce.h"
#include "core/kernels/nn.h"
#include "core/kernels/matmul.h"
#include "core/kernels/index.h"
#include "core/kernels/attention.h"
#include "core/kernels/optim.h"
