// Fused scaled dot-product attention (math in autograd/ops.h, scaled_dot_product_attention).
//
//   q (BH, Tq, D), k (B H/G, Tk, D), v (B H/G, Tk, Dv), out and dout (BH, Tq, Dv), lse (BH, Tq)
//   dq (BH, Tq, D), dk (BH, Tk, D), dv (BH, Tk, Dv)
//   BH = batch * heads (row bh is batch element bh / H, head bh % H); query head h reads
//   key/value head h / G (grouped-query attention; G = 1: one each), and dk, dv hold each query
//   head's part, which the caller sums per group. out, dout, lse and the gradients are
//   contiguous; q, k and v may be views (the heads of a fused QKV projection, a KV cache's first
//   L positions): each is read through its Strides, with unit stride along D. Default Strides mean
//   contiguous. lse is the log-sum-exp of each row of scaled, masked scores (+inf for a row with no
//   visible key), the one number per row that backward needs to rebuild the softmax:
//   P = exp(S - lse). No Tq x Tk matrix is stored.
//   The geometry (sizes, strides, scale, masks, dropout) is one AttentionGeom (core/kernels.h),
//   with lengths (B), key_mask (B, Tk) and the other masks' shapes written beside its fields.
//
// No include guard: core/kernels.h reads this file inside namespace ag::cpu (core/cpu/attention.cpp)
// and inside ag::cuda (cuda/attention.cu: fused, FlashAttention-2 style), so each kernel is
// declared once for both backends. The GPU's give the same results: out, lse as defined above
// (lse = +inf and out = 0 for a row with no visible key), dq, dk, dv written, the dropout mask
// from the same Philox elements; there, lengths, key_mask and block_mask may point to device or
// host memory (host arrays are copied to the device first). Both skip the key tiles that a block
// mask hides from every query of a tile (core/kernels/attention_mask.h).
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

using ag::AttentionGeom;  // so that cpu::AttentionGeom and cuda::AttentionGeom name them too
using ag::Strides;

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionGeom& g);
// dq, dk, dv are written (=); a key no query sees gets zeros, as does every row when Tq or Tk is 0.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionGeom& g);

// Instantiated for f32 and f64 by both backends: core/cpu/attention.cpp and cuda/attention.cu end
// with AG_INSTANTIATE_ATTENTION_KERNELS.
#define AG_INSTANTIATE_ATTENTION_KERNELS                                                        \
  AG_INSTANTIATE(attention_forward<float>) AG_INSTANTIATE(attention_forward<double>)           \
  AG_INSTANTIATE(attention_backward<float>) AG_INSTANTIATE(attention_backward<double>)

#if AG_KERNELS_CPU
// ---- CPU only ----------------------------------------------------------------------------------
// The same with q, k and v in 16 bits (In = ag::bf16 or ag::f16): what bf16 or fp16 autocast
// keeps of them for backward, half the memory of f32 rounded copies. They are widened (exactly)
// into each thread's f32 tiles as they are read; everything else is f32, the results the f32
// kernels give on the same values. Where the CPU has AVX512-BF16 and sbgemm_native() holds, bf16
// scores S = scale Q K^T (forward, and rebuilt in backward) multiply the pairs of q and k as they
// are on VDPBF16PS: the same exact products summed two at a time, so f32 rounding apart.
// On the GPU autocast keeps f32 rounded copies.
template <class In>
void attention_forward_16(float* out, float* lse, const In* q, const In* k, const In* v, const AttentionGeom& g);
template <class In>
void attention_backward_16(float* dq, float* dk, float* dv, const float* dout, const In* q, const In* k, const In* v,
                           const float* out, const float* lse, const AttentionGeom& g);
#endif

#endif  // AG_KERNELS_CPU
