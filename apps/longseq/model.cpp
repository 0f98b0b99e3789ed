#include "apps/longseq/model.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "apps/common/gpt2_style.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "nn/init.h"

namespace ag::apps::longseq {

const std::vector<std::string>& attention_methods() {
  static const std::vector<std::string> names = {"full", "window", "sparse", "linformer", "compressed", "axial"};
  return names;
}

void check_config(const LongSeqConfig& c) {
  check(c.vocab >= 2 && c.max_len >= 1 && c.classes >= 2,
        "longseq: vocab {} (>= 2), max_len {} (>= 1) and classes {} (>= 2) are out of range", c.vocab, c.max_len,
        c.classes);
  check(c.d_model >= 1 && c.n_heads >= 1 && c.n_layers >= 1 && c.mlp_hidden >= 1,
        "longseq: d_model {}, n_heads {}, n_layers {}, mlp_hidden {}: every size must be at least 1", c.d_model,
        c.n_heads, c.n_layers, c.mlp_hidden);
  check(c.d_model % c.n_heads == 0, "longseq: n_heads {} does not divide d_model {}", c.n_heads, c.d_model);
  check(c.dropout >= 0 && c.dropout < 1, "longseq: dropout {} is outside [0, 1)", c.dropout);
  const auto& m = attention_methods();
  check(std::find(m.begin(), m.end(), c.attention) != m.end(), "longseq: unknown attention method '{}' (expected {})",
        c.attention, fmt::join(m, ", "));
  check(c.window >= 0, "longseq: window {} must be >= 0", c.window);
  check(c.sparse == "local-global" || c.sparse == "strided",
        "longseq: unknown sparse pattern '{}' (expected local-global or strided)", c.sparse);
  check(c.block >= 1 && c.stride_blocks >= 1 && c.window_blocks >= 0 && c.global_blocks >= 0,
        "longseq: sparse block {} and stride_blocks {} must be >= 1, window_blocks {} and global_blocks {} >= 0",
        c.block, c.stride_blocks, c.window_blocks, c.global_blocks);
  check(c.k >= 1 && c.stride >= 1, "longseq: k {} and stride {} must be at least 1", c.k, c.stride);
  check(!c.materialise || c.attention == "full" || c.attention == "window" || c.attention == "sparse",
        "longseq: materialise applies to full, window and sparse attention, not to '{}'", c.attention);
  if (c.attention == "axial")
    check(c.grid_h >= 1 && c.grid_w >= 1 && c.grid_h * c.grid_w == c.max_len,
          "longseq: axial attention needs a grid of max_len = {} tokens, got grid_h {} x grid_w {}", c.max_len,
          c.grid_h, c.grid_w);
}

LongSeqBlock::LongSeqBlock(const LongSeqConfig& c, Generator* gen) : cfg(c) {
  const std::string& method = c.attention;
  ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(c.d_model));
  if (method == "linformer")
    linformer = register_module(
        "attn", std::make_shared<nn::LinformerAttention>(c.d_model, c.n_heads, c.max_len, c.k,
                                                         nn::LinformerAttention::Options{.dropout = c.dropout,
                                                                                         .generator = gen}));
  else if (method == "compressed")
    compressed = register_module(
        "attn", std::make_shared<nn::MemoryCompressedAttention>(
                    c.d_model, c.n_heads, c.stride,
                    nn::MemoryCompressedAttention::Options{.dropout = c.dropout, .generator = gen}));
  else if (method == "axial")
    axial = register_module("attn", std::make_shared<nn::AxialAttention>(
                                        c.d_model, c.n_heads, c.grid_h, c.grid_w,
                                        nn::AxialAttention::Options{.dropout = c.dropout, .generator = gen}));
  else
    attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(
                                       c.d_model, c.n_heads,
                                       nn::MultiHeadAttention::Options{.dropout = c.dropout, .generator = gen}));
  ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(c.d_model));
  mlp = register_module("mlp", std::make_shared<nn::MLP>(c.d_model, c.mlp_hidden,
                                                         nn::MLP::Options{.dropout = c.dropout, .generator = gen}));
}

const Tensor& LongSeqBlock::block_mask(int64_t T, Device device) {
  const int64_t n = (T + cfg.block - 1) / cfg.block;
  if (!mask_.defined() || mask_.size(0) != n || mask_.device() != device)
    mask_ = cfg.sparse == "strided" ? nn::strided_block_mask(T, cfg.block, cfg.stride_blocks, device)
                                    : nn::local_global_block_mask(T, cfg.block, cfg.window_blocks,
                                                                  cfg.global_blocks, device);
  return mask_;
}

Tensor LongSeqBlock::forward(const Tensor& x, const Tensor& lengths) {
  nn::ModuleScope scope(this);
  nn::AttentionOptions o;
  o.key_padding_lengths = lengths;
  o.need_weights = need_weights || cfg.materialise;  // the composed path, weights and all
  if (cfg.attention == "window") o.window = cfg.window;
  if (cfg.attention == "sparse") o.block_mask = block_mask(x.size(1), x.device()), o.block_size = cfg.block;
  const Tensor xn = ln1->forward(x);
  nn::AttentionResult a;
  if (axial) {  // the classifier checked that no token is padding
    a.out = axial->forward(xn);
  } else {
    a = linformer ? linformer->forward(xn, o) : compressed ? compressed->forward(xn, o) : attn->forward(xn, o);
  }
  attn_weights = need_weights ? a.weights : Tensor();
  const Tensor h = x + a.out;
  return h + mlp->forward(ln2->forward(h));
}

LongSeqClassifier::LongSeqClassifier(const LongSeqConfig& c, Generator* gen) : cfg(c), dropout_gen(gen) {
  check_config(c);
  embed = register_module("embed", std::make_shared<nn::Embedding>(c.vocab, c.d_model, 0, DType::f32, gen));
  pos_embed = register_parameter("pos_embed", zeros({1, c.max_len, c.d_model}));
  blocks = register_module("blocks", std::make_shared<nn::ModuleList<LongSeqBlock>>());
  for (int64_t i = 0; i < c.n_layers; ++i) blocks->push_back(std::make_shared<LongSeqBlock>(c, gen));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(c.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, DType::f32, gen));
  // every weight N(0, 0.02), pos_embed with them (it is 3-D), the residual projections scaled
  init_gpt2_style(*this, c.n_layers, gen);
  // then q, k and v N(0, 1 / d): scores of variance 1 at init (model.h, "Initialisation")
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters())
    if (name.ends_with("qkv.weight"))
      p.copy_(nn::init::normal(p.shape(), 0.0, 1.0 / std::sqrt(double(c.d_model)), p.dtype(), gen));
}

Tensor LongSeqClassifier::forward(const Tensor& tokens_in, const Tensor& lengths_in) {
  nn::ModuleScope scope(this);
  check(tokens_in.ndim() == 2 && tokens_in.size(1) >= 1 && tokens_in.size(1) <= cfg.max_len,
        "LongSeqClassifier: expected tokens (B, T) with 1 <= T <= {}, got {}", cfg.max_len, tokens_in.shape());
  const int64_t B = tokens_in.size(0), T = tokens_in.size(1);
  const Tensor tokens = tokens_in.to(device());
  Tensor lengths;
  if (lengths_in.defined()) {
    check(lengths_in.ndim() == 1 && lengths_in.size(0) == B, "LongSeqClassifier: expected lengths ({}), got {}", B,
          lengths_in.shape());
    lengths = lengths_in.to(device());
  }
  if (cfg.attention == "axial") {
    bool full = T == cfg.max_len;
    if (lengths_in.defined())
      for (int64_t n : lengths_in.to(Device::cpu()).to_vector<int64_t>()) full = full && n == T;
    check(full, "LongSeqClassifier: axial attention takes no padding: every sequence must fill the {} x {} grid ({} "
          "tokens)", cfg.grid_h, cfg.grid_w, cfg.max_len);
  }
  Tensor h = embed->forward(tokens) + pos_embed.narrow(1, 0, T);  // (B, T, d)
  for (const auto& block : *blocks)
    h = block_forward(*block, [b = block.get(), lengths](const Tensor& t) { return b->forward(t, lengths); }, h,
                      grad_checkpointing, dropout_gen);
  // mean over the valid tokens of each sequence
  Tensor pooled;
  if (lengths.defined()) {
    const Tensor valid = lt(arange(0, T, 1, DType::i64).to(device()).reshape({1, T}), lengths.reshape({B, 1}));
    const Tensor w = valid.to(DType::f32).reshape({B, T, 1});
    pooled = sum(h * w, {1}) / lengths.to(DType::f32).reshape({B, 1});
  } else {
    pooled = mean(h, {1});
  }
  return head->forward(norm->forward(pooled));
}

}  // namespace ag::apps::longseq
