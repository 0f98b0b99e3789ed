#include "nn/transformer.h"

namespace ag::nn {

TransformerBlock::TransformerBlock(int64_t d_model, int64_t n_heads, int64_t mlp_hidden, double dropout,
                                   bool causal, bool cross, DType dtype, Generator* gen, const BlockConfig& config)
    : causal(causal), cross(cross) {
  check(config.mlp == "gelu" || config.mlp == "swiglu", "TransformerBlock: mlp '{}': expected gelu or swiglu",
        config.mlp);
  build_attention(d_model, n_heads, dropout, dtype, gen, config);
  if (config.mlp == "gelu") {
    mlp = register_module("mlp", std::make_shared<MLP>(d_model, mlp_hidden, dropout, dtype, gen));
    feed_forward = mlp;
  } else {
    feed_forward = register_module("mlp", std::make_shared<SwiGLU>(d_model, mlp_hidden, dropout, false, dtype, gen));
  }
}

TransformerBlock::TransformerBlock(int64_t d_model, int64_t n_heads, std::shared_ptr<UnaryModule> ffn, double dropout,
                                   bool causal, bool cross, DType dtype, Generator* gen, const BlockConfig& config)
    : causal(causal), cross(cross) {
  check(ffn != nullptr, "TransformerBlock: the feed-forward module is null");
  build_attention(d_model, n_heads, dropout, dtype, gen, config);
  feed_forward = register_module("mlp", std::move(ffn));
}

void TransformerBlock::build_attention(int64_t d_model, int64_t n_heads, double dropout, DType dtype,
                                       Generator* gen, const BlockConfig& config) {
  ln1 = register_module("ln1", make_norm(config.norm, d_model, dtype));
  attn = register_module(
      "attn", std::make_shared<MultiHeadAttention>(d_model, n_heads, dropout, true, dtype, gen, config.attention));
  if (cross) {
    ln_cross = register_module("ln_cross", make_norm(config.norm, d_model, dtype));
    AttentionConfig cross_config = config.attention;  // positions belong to the self-attention's sequence
    cross_config.positions = "none";
    cross_attn = register_module(
        "cross_attn", std::make_shared<MultiHeadAttention>(d_model, n_heads, dropout, true, dtype, gen, cross_config));
  }
  ln2 = register_module("ln2", make_norm(config.norm, d_model, dtype));
}
Tensor TransformerBlock::forward(const Tensor& x, const Tensor& context, KVCache* cache) {
  AttentionOptions self;
  self.cache = cache;
  return forward(x, self, context);
}

Tensor TransformerBlock::forward(const Tensor& x, const AttentionOptions& self_options, const Tensor& context) {
  ModuleScope scope(this);
  check(cross == context.defined(), "TransformerBlock: {}",
        cross ? "a cross-attention block needs a context" : "a context was given to a block without cross-attention");
  return sublayers(x, self_options, cross ? cross_attn->context_kv(context) : ContextKV{});
}

Tensor TransformerBlock::forward(const Tensor& x, const AttentionOptions& self_options, const ContextKV& context) {
  ModuleScope scope(this);
  check(cross, "TransformerBlock: context keys and values were given to a block without cross-attention");
  return sublayers(x, self_options, context);
}

Tensor TransformerBlock::sublayers(const Tensor& x, const AttentionOptions& self_options, const ContextKV& context) {
  AttentionOptions self = self_options;
  self.causal = self.causal || causal;
  AttentionResult a = attn->forward(ln1->forward(x), self);
  attn_weights = self.need_weights ? a.weights.detach() : Tensor();
  Tensor h = x + a.out;
  if (cross) h = h + cross_attn->forward(ln_cross->forward(h), context).out;
  return h + feed_forward->forward(ln2->forward(h));
}

ContextKV TransformerBlock::context_kv(const Tensor& context) {
  check(cross, "TransformerBlock: context_kv of a block without cross-attention");
  return cross_attn->context_kv(context);
}

}  // namespace ag::nn
