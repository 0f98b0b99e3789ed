#pragma once
// TransformerBlock: a pre-norm transformer layer (GPT-2 / ViT, and LLaMA's with BlockConfig).
//                                                                       x (B, T, d) -> (B, T, d)
//   x = x + attn(ln1(x))                        self-attention (causal for a decoder)
//   x = x + cross_attn(ln_cross(x), context)    only when built with cross = true
//   x = x + mlp(ln2(x))                         MLP: fc1 (d -> mlp_hidden), GELU, fc2
// Each sublayer adds to the residual stream, so the gradient of x reaches every block through
// the identity path of the additions. Children: ln1, attn, [ln_cross, cross_attn,] ln2, mlp.
// BlockConfig picks the parts of current small language models: RMSNorm for the norms, SwiGLU
// (nn/mlp.h, hidden = mlp_hidden) for the MLP, and the attention's AttentionConfig (grouped-query
// heads, rope or alibi positions). The feed-forward may also be a module of your own (x (..., d) ->
// (..., d)): the second constructor registers it as "mlp" in place of the MLP (docs/extending.md).
#include "nn/attention.h"
#include "nn/mlp.h"
#include "nn/norm.h"

namespace ag::nn {

struct BlockConfig {
  AttentionConfig attention;       // kv_heads for both attentions, positions for the self-attention
  std::string norm = "layernorm";  // or "rmsnorm" (no bias, LLaMA's)
  std::string mlp = "gelu";        // or "swiglu" (nn::SwiGLU(d, mlp_hidden), no biases)
};
// The default of the constructors below: one object, rather than a temporary at every call, whose
// inlined std::string members GCC 12 reports as maybe used uninitialized (a false positive).
inline const BlockConfig default_block_config{};

struct TransformerBlock : UnaryModule {
  bool causal, cross;
  std::shared_ptr<UnaryModule> ln1;                // LayerNorm, or RMSNorm
  std::shared_ptr<MultiHeadAttention> attn;
  std::shared_ptr<UnaryModule> ln_cross;           // only with cross
  std::shared_ptr<MultiHeadAttention> cross_attn;  // only with cross
  std::shared_ptr<UnaryModule> ln2;
  std::shared_ptr<MLP> mlp;                   // the built-in GELU MLP; null with SwiGLU or one's own
  std::shared_ptr<UnaryModule> feed_forward;  // what forward runs: mlp, the SwiGLU, or the module given

  // `config`: the norms, the MLP and the attentions (see BlockConfig).
  TransformerBlock(int64_t d_model, int64_t n_heads, int64_t mlp_hidden, double dropout = 0.0, bool causal = false,
                   bool cross = false, DType dtype = DType::f32, Generator* gen = nullptr,
                   const BlockConfig& config = default_block_config);
  // With `feed_forward` (non-null, mapping (..., d_model) to (..., d_model)) in place of the MLP.
  // dropout, dtype and gen go to the attention and norms; the feed-forward brings its own.
  TransformerBlock(int64_t d_model, int64_t n_heads, std::shared_ptr<UnaryModule> feed_forward, double dropout = 0.0,
                   bool causal = false, bool cross = false, DType dtype = DType::f32, Generator* gen = nullptr,
                   const BlockConfig& config = default_block_config);

  Tensor attn_weights;  // (B, H, T, Tk) of the last self-attention, kept only when asked (need_weights)

  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }
  // context (B, Tk, d) is required with cross and refused without; cache: the self-attention's
  // KV cache for decoding (see KVCache).
  Tensor forward(const Tensor& x, const Tensor& context, KVCache* cache = nullptr);
  // The general form: `self` configures the self-attention (key padding, window, need_weights,
  // cache, generator); the block's own `causal` is always applied on top.
  Tensor forward(const Tensor& x, const AttentionOptions& self, const Tensor& context = Tensor());
  // With the cross-attention's keys and values projected beforehand (context_kv below): the same
  // result as forward(x, self, context), without projecting the context again. A decoder that
  // generates token by token projects each block's context once and reuses it at every step.
  Tensor forward(const Tensor& x, const AttentionOptions& self, const ContextKV& context);
  // The cross-attention's keys and values of context (B, Tk, d): (B, Hkv, Tk, hs) each.
  ContextKV context_kv(const Tensor& context);

 private:
  // ln1, attn, [ln_cross, cross_attn,] ln2: what both constructors build, in this order (the
  // order in which they draw from gen and in which their parameters are named)
  void build_attention(int64_t d_model, int64_t n_heads, double dropout, DType dtype, Generator* gen,
                       const BlockConfig& config);
  // the three residual sublayers (the cross-attention over `context`'s keys and values with cross)
  Tensor sublayers(const Tensor& x, const AttentionOptions& self, const ContextKV& context);
};

}  // namespace ag::nn
