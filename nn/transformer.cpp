#include "nn/transformer.h"

namespace ag::nn {

TransformerBlock::TransformerBlock(int64_t d_model, int64_t n_heads, const Options& options) : options(options) {
  check(options.mlp_hidden >= 0, "TransformerBlock: mlp_hidden must be >= 0 (0: 4 d_model), got {}",
        options.mlp_hidden);
  check(options.mlp == "gelu" || options.mlp == "swiglu", "TransformerBlock: mlp '{}': expected gelu or swiglu",
        options.mlp);
  const int64_t hidden = options.mlp_hidden == 0 ? 4 * d_model : options.mlp_hidden;
  this->options.mlp_hidden = hidden;
  build_attention(d_model, n_heads);
  if (options.mlp == "gelu") {
    const MLP::Options ffn{.dropout = options.dropout, .dtype = options.dtype, .generator = options.generator};
    mlp = register_module("mlp", std::make_shared<MLP>(d_model, hidden, ffn));
    feed_forward = mlp;
  } else {  // no biases, as LLaMA's
    const SwiGLU::Options ffn{.dropout = options.dropout, .dtype = options.dtype, .generator = options.generator};
    feed_forward = register_module("mlp", std::make_shared<SwiGLU>(d_model, hidden, ffn));
  }
}

TransformerBlock::TransformerBlock(int64_t d_model, int64_t n_heads, std::shared_ptr<UnaryModule> ffn,
                                   const Options& options)
    : options(options) {
  check(ffn != nullptr, "TransformerBlock: the feed-forward module is null");
  check(options.mlp_hidden == 0 && options.mlp == "gelu",
        "TransformerBlock: mlp_hidden {} and mlp '{}' describe the built-in MLP; a block given its own feed-forward "
        "takes neither",
        options.mlp_hidden, options.mlp);
  build_attention(d_model, n_heads);
  feed_forward = register_module("mlp", std::move(ffn));
}

void TransformerBlock::build_attention(int64_t d_model, int64_t n_heads) {
  const Options& o = options;
  // the block's dropout, dtype and generator are those of its attentions too: one place to set them
  const MultiHeadAttention::Options& a = o.attention;
  check((a.dropout == 0.0 || a.dropout == o.dropout) && (a.dtype == DType::f32 || a.dtype == o.dtype) &&
            (a.generator == nullptr || a.generator == o.generator),
        "TransformerBlock: attention dropout {}, dtype {} or generator differ from the block's (dropout {}, dtype "
        "{}): set them on the block, which gives them to every sublayer",
        a.dropout, a.dtype, o.dropout, o.dtype);
  MultiHeadAttention::Options self = a;
  self.dropout = o.dropout, self.dtype = o.dtype, self.generator = o.generator;
  ln1 = register_module("ln1", make_norm(o.norm, d_model, o.dtype));
  attn = register_module("attn", std::make_shared<MultiHeadAttention>(d_model, n_heads, self));
  if (o.cross) {
    ln_cross = register_module("ln_cross", make_norm(o.norm, d_model, o.dtype));
    MultiHeadAttention::Options cross = self;  // positions belong to the self-attention's sequence
    cross.positions = "none";
    cross_attn = register_module("cross_attn", std::make_shared<MultiHeadAttention>(d_model, n_heads, cross));
  }
  ln2 = register_module("ln2", make_norm(o.norm, d_model, o.dtype));
}

Tensor TransformerBlock::forward(const Tensor& x, const Tensor& context, KVCache* cache) {
  AttentionOptions self;
  self.cache = cache;
  return forward(x, self, context);
}

Tensor TransformerBlock::forward(const Tensor& x, const AttentionOptions& self_options, const Tensor& context) {
  ModuleScope scope(this);
  const bool cross = options.cross;
  check(cross == context.defined(), "TransformerBlock: {}",
        cross ? "a cross-attention block needs a context" : "a context was given to a block without cross-attention");
  return sublayers(x, self_options, cross ? cross_attn->context_kv(context) : ContextKV{});
}

Tensor TransformerBlock::forward(const Tensor& x, const AttentionOptions& self_options, const ContextKV& context) {
  ModuleScope scope(this);
  check(options.cross, "TransformerBlock: context keys and values were given to a block without cross-attention");
  return sublayers(x, self_options, context);
}

Tensor TransformerBlock::sublayers(const Tensor& x, const AttentionOptions& self_options, const ContextKV& context) {
  AttentionOptions self = self_options;
  self.causal = self.causal || options.causal;
  AttentionResult a = attn->forward(ln1->forward(x), self);
  attn_weights = self.need_weights ? a.weights.detach() : Tensor();
  Tensor h = x + a.out;
  if (options.cross) h = h + cross_attn->forward(ln_cross->forward(h), context).out;
  return h + feed_forward->forward(ln2->forward(h));
}

ContextKV TransformerBlock::context_kv(const Tensor& context) {
  check(options.cross, "TransformerBlock: context_kv of a block without cross-attention");
  return cross_attn->context_kv(context);
}

}  // namespace ag::nn
