#pragma once
// The index of kernels. A kernel is a plain function over raw pointers and sizes, outputs first;
// the op front (autograd/ops/) checks shapes and dtypes, then calls it through KERNEL() (core/
// dispatch.h), which picks cpu:: or cuda:: by device. Plain C++ only: nvcc compiles this header.
//
// Each kernel is declared once, for both backends. The family headers core/kernels/<family>.h hold
// the declarations of one op family and have no include guard: this file reads each of them twice,
// inside namespace ag::cpu and inside ag::cuda (the end of this file), so cpu::softmax_forward and
// cuda::softmax_forward come from one line and cannot drift apart. Each family header also lists
// which kernels exist for which dtypes (AG_INSTANTIATE_<FAMILY>_KERNELS), and the family's CPU file
// (core/cpu/<family>.cpp) and CUDA file (cuda/<family>.cu) both end with that one line. The math
// of each op is in autograd/ops.h, and each kernel file points back to it.
#include <cmath>
#include <cstdint>

#include "core/half.h"  // bf16, f16 (the 16-bit storage types)
#include "core/hd.h"    // AG_HD
#include "core/precision.h"

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

// rope (core/kernels/nn.h): the angle of pair k of D at position p, p base^(-2k/D), in f64 (both
// backends take cos and sin of it in f64 and round those to the tensor's dtype)
AG_HD inline double rope_angle(int64_t p, int64_t k, int64_t D, double base) {
  return double(p) * pow(base, -2.0 * double(k) / double(D));
}

// ---- the argument types of the kernels (each explained beside its family's kernels) -----------

// matmul (core/kernels/matmul.h): one batched GEMM as BLAS reads it
struct Gemm {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0;
  const Layout* batch_a = nullptr;  // batch dims of a; nullptr = a single matrix
  const Layout* batch_b = nullptr;  // batch dims of b, same shape as batch_a
  // autocast (autograd/autocast.h; f32 only): bf16 or fp16 reads both operands rounded to that
  // format and sums the products in f32. The backward GEMMs inherit it (dout is rounded too).
  Precision operands = Precision::fp32;
};

// attention (core/kernels/attention.h): element strides of a (B, H, T, D) tensor along B, H and
// T; -1: that of a contiguous one.
struct Strides {
  int64_t b = -1, h = -1, t = -1;
};

// attention: the problem one call solves
struct AttentionGeom {
  int64_t BH = 0, H = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  // query heads per key/value head (grouped-query attention): q has H heads, k and v have H / G,
  // and query head h reads key/value head h / G. 1: as many key/value heads as query heads. The
  // gradients dk and dv are still written per query head, (BH, Tk, D): the caller sums each group.
  int64_t G = 1;
  Strides q, k, v;
  double scale = 1;             // usually 1 / sqrt(D)
  bool causal = false;          // query i sees keys <= i + (Tk - Tq) (bottom-right aligned)
  int64_t window = -1;          // >= 0: only keys j with |i' - j| <= window, i' = i + Tk - Tq
                                //   (with causal: the last window + 1 keys, the query's own included)
  const int64_t* lengths = nullptr;  // (B) valid keys per batch element, or null
  const bool* key_mask = nullptr;    // (B, Tk) true = masked key, or null
  // block-sparse pattern, shared by every batch element and head: (block_rows, block_cols) =
  // (ceil(Tq / block_size), ceil(Tk / block_size)) row-major, true = the block is kept, or null.
  // On the kernel's device (the GPU's also take host memory, copied like lengths and key_mask).
  const bool* block_mask = nullptr;
  int64_t block_rows = 0, block_cols = 0, block_size = 1;
  double dropout = 0;           // probability of dropping an attention weight
  uint64_t seed = 0, offset = 0;  // Philox stream of the dropout mask (as ag::dropout over (BH, Tq, Tk))
  // ALiBi: (H) slopes, head h's scores get alibi_bias(slope[h], ...) (core/kernels/attention_mask.h),
  // or null. On the kernel's device (the GPU's also take host memory, copied like lengths).
  const float* alibi = nullptr;
  // autocast (autograd/autocast.h; f32 only): backward reads the gradients that enter its products
  // rounded to this format, as matmul's backward reads its incoming gradient: dout (rounded by the
  // caller, so D_i = dO_i . O_i reads it rounded too) and dS (rounded by the kernel, before
  // dQ = scale dS K and dK = scale dS^T Q). P stays f32, as the forward's P V reads it.
  Precision grad_operands = Precision::fp32;
};

// optim (core/kernels/optim.h): one parameter of SGD; `first` says its momentum buffer is fresh
// (b <- g); buf is unused (may be null) when momentum == 0.
template <class T>
struct SgdTensor {
  T* param;
  T* buf;
  const T* grad;
  int64_t n;
  bool first;
};
// optim: one parameter of Adam / AdamW, `step` counting this update (1 at its first).
template <class T>
struct AdamTensor {
  T* param;
  T* exp_avg;
  T* exp_avg_sq;
  const T* grad;
  int64_t n;
  int64_t step;
};
// optim: one contiguous buffer (a gradient) of the norm, scale and clamp kernels.
template <class T>
struct TensorSpan {
  T* data;
  int64_t n;
};

}  // namespace ag

// An explicit instantiation of the kernel template specialisation f<T...>, in the namespace of the
// file that defines it. decltype gives the signature, so a list of kernels needs no parameter
// types: AG_INSTANTIATE(softmax_forward<float>) is
//   template decltype(softmax_forward<float>) softmax_forward<float>;
// (variadic only so that a comma between template arguments passes: cast_copy<float, bool>)
#define AG_INSTANTIATE(...) template decltype(__VA_ARGS__) __VA_ARGS__;

// The pointwise functors (namespace ag::pw), shared by both backends, and their instantiation list.
#include "core/kernels/pointwise.h"

// ---- every kernel, declared once and read here for each backend -------------------------------
// AG_KERNELS_CPU is 1 while the family headers are read for ag::cpu, 0 for ag::cuda: what only the
// CPU has (the *_naive references, attograd's own sgemm) sits under #if AG_KERNELS_CPU there.
#define AG_KERNELS_CPU 1
namespace ag::cpu {
#include "core/kernels/core.h"
#include "core/kernels/reduce.h"
#include "core/kernels/nn.h"
#include "core/kernels/matmul.h"
#include "core/kernels/index.h"
#include "core/kernels/attention.h"
#include "core/kernels/optim.h"
}  // namespace ag::cpu
#undef AG_KERNELS_CPU

#define AG_KERNELS_CPU 0
namespace ag::cuda {
#include "core/kernels/core.h"
#include "core/kernels/reduce.h"
#include "core/kernels/nn.h"
#include "core/kernels/matmul.h"
#include "core/kernels/index.h"
#include "core/kernels/attention.h"
#include "core/kernels/optim.h"
}  // namespace ag::cuda
#undef AG_KERNELS_CPU
