#pragma once
// Multi-head attention, as torch.nn.MultiheadAttention(batch_first=True).
//
//   x (B, Tq, d) [, context (B, Tk, d)]  ->  y (B, Tq, d),   H heads of size hs = d / H
//   [q | k | v] = x Wqkv^T + bqkv         qkv:  Linear(d, 3d), one fused projection
//   q, k, v     -> (B, H, T, hs)          a reshape (B, T, 3, H, hs) and a permute: views
//   o_h         = softmax(q_h k_h^T / sqrt(hs) + mask) v_h    scaled_dot_product_attention
//   y           = concat_h(o_h) Wproj^T + bproj                 proj: Linear(d, d)
// qkv.weight is PyTorch's in_proj_weight (rows 0..d-1 make q, d..2d-1 k, 2d..3d-1 v) and
// proj is out_proj, so a state_dict maps one-to-one. Cross-attention takes q from x with the
// first d rows and k, v from the context with the last 2d rows of that same weight.
// Dropout (p) acts on the attention weights, in training only.
//
// KVCache: for autoregressive decoding. Each step appends the new positions' k, v (B, H, Tnew, hs)
// and attends over everything cached; causal masking is bottom-right aligned (query i of the new
// block sees keys 0 .. Tcached + i), so decoding one token (or a chunk) at a time gives the
// same outputs as one causal forward over the whole sequence. Meant for inference (NoGradGuard).
#include "nn/linear.h"

namespace ag::nn {

struct KVCache {
  Tensor k, v;  // (B, H, T, hs): every position cached so far; undefined while empty

  int64_t length() const { return k.defined() ? k.size(2) : 0; }
  // Appends k_new, v_new (B, H, Tnew, hs) along T and returns all cached keys and values.
  std::pair<Tensor, Tensor> append(const Tensor& k_new, const Tensor& v_new);
  void clear() { k = Tensor(), v = Tensor(); }
};

struct AttentionOptions {
  bool causal = false;
  Tensor key_padding_lengths;  // i64 (B): valid keys per sequence
  Tensor key_padding_mask;     // b8 (B, Tk): true = ignore that key (PyTorch's convention)
  int64_t window = -1;         // >= 0: local attention (see SdpaOptions)
  bool need_weights = false;   // also return the per-head weights (B, H, Tq, Tk)
  KVCache* cache = nullptr;    // self-attention only: append this call's k, v and attend over all
  Generator* generator = nullptr;  // for dropout; null: the default generator
};

struct AttentionResult {
  Tensor out;      // (B, Tq, d)
  Tensor weights;  // (B, H, Tq, Tk), only with need_weights
};

struct MultiHeadAttention : Module {
  int64_t d_model, n_heads, head_size;
  double dropout;
  std::shared_ptr<Linear> qkv;   // d -> 3d
  std::shared_ptr<Linear> proj;  // d -> d

  MultiHeadAttention(int64_t d_model, int64_t n_heads, double dropout = 0.0, bool bias = true,
                     DType dtype = DType::f32, Generator* gen = nullptr);

  // Self-attention: queries, keys and values all from x (B, T, d).
  AttentionResult forward(const Tensor& x, const AttentionOptions& options = {});
  // Cross-attention: queries from x (B, Tq, d), keys and values from context (B, Tk, d).
  AttentionResult forward(const Tensor& x, const Tensor& context, const AttentionOptions& options = {});

 private:
  // (B, T, d) -> (B, H, T, hs), a view
  Tensor split_heads(const Tensor& t) const;
  AttentionResult attend(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options);
};

}  // namespace ag::nn
