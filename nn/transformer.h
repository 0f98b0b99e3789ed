#pragma once
// TransformerBlock: a pre-norm transformer layer (GPT-2 / ViT, and LLaMA's with its Options).
//                                                                       x (B, T, d) -> (B, T, d)
//   x = x + attn(ln1(x))                        self-attention (causal for a decoder)
//   x = x + cross_attn(ln_cross(x), context)    only when built with cross = true
//   x = x + mlp(ln2(x))                         MLP: fc1 (d -> mlp_hidden), GELU, fc2
// Each sublayer adds to the residual stream, so the gradient of x reaches every block through
// the identity path of the additions. Children: ln1, attn, [ln_cross, cross_attn,] ln2, mlp.
//
//   nn::TransformerBlock block(64, 4, {.mlp_hidden = 256, .dropout = 0.1, .causal = true});
//
// Options also pick the parts of current small language models: RMSNorm for the norms, SwiGLU
// (nn/mlp.h, hidden = mlp_hidden) for the MLP, and the attention's own options (grouped-query
// heads, rope or alibi positions). The feed-forward may also be a module of your own (x (..., d) ->
// (..., d)): the second constructor registers it as "mlp" in place of the MLP (docs/extending.md).
#include "nn/attention.h"
#include "nn/mlp.h"
#include "nn/norm.h"

namespace ag::nn {

struct TransformerBlock : UnaryModule {
  struct Options {
    int64_t mlp_hidden = 0;  // the MLP's hidden width (0: 4 d_model)
    double dropout = 0.0;    // on the attention weights and the MLP's output, in training only
    bool causal = false;     // each position attends to itself and the positions before it (a decoder)
    bool cross = false;      // adds the cross-attention sublayer, over a context given to forward
    std::string norm = "layernorm";  // or "rmsnorm" (no bias, LLaMA's)
    std::string mlp = "gelu";        // or "swiglu" (nn::SwiGLU(d, mlp_hidden), no biases)
    // kv_heads, bias and rope_* for both attentions, positions for the self-attention only. The
    // block's dropout, dtype and generator are theirs: leave those three at their defaults here.
    // "= {}": without it GCC warns of a missing initializer when a designated list leaves it out.
    MultiHeadAttention::Options attention = {};
    DType dtype = DType::f32;        // of every parameter
    Generator* generator = nullptr;  // init and dropout of every sublayer (null: the default generator)
  };

  Options options;  // as given, with mlp_hidden resolved (0 with a feed-forward of one's own)
  std::shared_ptr<UnaryModule> ln1;                // LayerNorm, or RMSNorm
  std::shared_ptr<MultiHeadAttention> attn;
  std::shared_ptr<UnaryModule> ln_cross;           // only with cross
  std::shared_ptr<MultiHeadAttention> cross_attn;  // only with cross
  std::shared_ptr<UnaryModule> ln2;
  std::shared_ptr<MLP> mlp;                   // the built-in GELU MLP; null with SwiGLU or one's own
  std::shared_ptr<UnaryModule> feed_forward;  // what forward runs: mlp, the SwiGLU, or the module given

  TransformerBlock(int64_t d_model, int64_t n_heads, const Options& options);
  TransformerBlock(int64_t d_model, int64_t n_heads) : TransformerBlock(d_model, n_heads, Options{}) {}
  // With `feed_forward` (non-null, mapping (..., d_model) to (..., d_model)) in place of the MLP:
  // leave mlp_hidden and mlp unset; dropout, dtype and generator go to the attention and norms, as
  // the feed-forward brings its own.
  TransformerBlock(int64_t d_model, int64_t n_heads, std::shared_ptr<UnaryModule> feed_forward,
                   const Options& options);
  TransformerBlock(int64_t d_model, int64_t n_heads, std::shared_ptr<UnaryModule> feed_forward)
      : TransformerBlock(d_model, n_heads, std::move(feed_forward), Options{}) {}

  Tensor attn_weights;  // (B, H, T, Tk) of the last self-attention, kept only when asked (need_weights)

  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }
  // context (B, Tk, d) is required with cross and refused without; cache: the self-attention's
  // KV cache for decoding (see KVCache).
  Tensor forward(const Tensor& x, const Tensor& context, KVCache* cache = nullptr);
  // The general form: `self` configures the self-attention (key padding, window, need_weights,
  // cache, generator); the block's own options.causal is always applied on top.
  Tensor forward(const Tensor& x, const AttentionOptions& self, const Tensor& context = Tensor());
  // With the cross-attention's keys and values projected beforehand (context_kv below): the same
  // result as forward(x, self, context), without projecting the context again. A decoder that
  // generates token by token projects each block's context once and reuses it at every step.
  Tensor forward(const Tensor& x, const AttentionOptions& self, const ContextKV& context);
  // The cross-attention's keys and values of context (B, Tk, d): (B, Hkv, Tk, hs) each.
  ContextKV context_kv(const Tensor& context);

 private:
  // ln1, attn, [ln_cross, cross_attn,] ln2: what both constructors build, in this order (the
  // order in which they draw from the generator and in which their parameters are named)
  void build_attention(int64_t d_model, int64_t n_heads);
  // the three residual sublayers (the cross-attention over `context`'s keys and values with cross)
  Tensor sublayers(const Tensor& x, const AttentionOptions& self, const ContextKV& context);
};

}  // namespace ag::nn
