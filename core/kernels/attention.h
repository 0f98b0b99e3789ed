#pragma once
// Fused scaled dot-product attention (math in autograd/ops.h, scaled_dot_product_attention).
//
//   q (BH, Tq, D), k (BH, Tk, D), v (BH, Tk, Dv), out and dout (BH, Tq, Dv), lse (BH, Tq)
//   BH = batch * heads. out, dout, lse and the gradients are contiguous; q, k and v may be views
//   (the heads of a fused QKV projection, a KV cache's first L positions): each is read through
//   its Strides, with unit stride along D. Default Strides mean contiguous. lse is the log-sum-exp of each row of scaled, masked scores
//   (+inf for a row with no visible key), the one number per row that backward needs to rebuild
//   the softmax: P = exp(S - lse). No Tq x Tk matrix is ever stored.
#include <cstdint>

namespace ag::cpu {

// Element strides of a (B, H, T, D) tensor along B, H and T; -1: that of a contiguous one.
struct Strides {
  int64_t b = -1, h = -1, t = -1;
};

struct AttentionGeom {
  int64_t BH = 0, H = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  Strides q, k, v;
  double scale = 1;             // usually 1 / sqrt(D)
  bool causal = false;          // query i sees keys <= i + (Tk - Tq) (bottom-right aligned)
  int64_t window = -1;          // >= 0: only keys j with |i' - j| <= window, i' = i + Tk - Tq
                                //   (with causal: the last window + 1 keys, the query's own included)
  const int64_t* lengths = nullptr;  // (B) valid keys per batch element, or null
  const bool* key_mask = nullptr;    // (B, Tk) true = masked key, or null
  double dropout = 0;           // probability of dropping an attention weight
  uint64_t seed = 0, offset = 0;  // Philox stream of the dropout mask (as ag::dropout over (BH, Tq, Tk))
};

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionGeom& g);
// dq, dk, dv are added into (+=).
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionGeom& g);

}  // namespace ag::cpu

// ---- the same kernels on the GPU (cuda/attention.cu): fused, FlashAttention-2 style -------------
// Same signatures and results: out, lse as defined above (lse = +inf and out = 0 for a row with no
// visible key), dq, dk, dv added into, the dropout mask from the same Philox elements. lengths and
// key_mask may point to device or host memory (host arrays are copied to the device first).
namespace ag::cuda {

using Strides = cpu::Strides;
using AttentionGeom = cpu::AttentionGeom;

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionGeom& g);
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionGeom& g);

}  // namespace ag::cuda
