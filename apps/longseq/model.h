#pragma once
// The model of apps/longseq: one small transformer classifier whose attention is chosen by name,
// everything else equal, so the methods can be compared on the same task (Long Range Arena's
// protocol).
//
// LongSeqClassifier:                                       tokens (B, T), lengths (B) -> logits (B, K)
//   h = embed(tokens) + pos_embed[:T]          Embedding(vocab, d, padding 0); pos_embed (1, max_len, d)
//   h = blocks.i(h)                            pre-LN: h += attn(ln1(h)); h += mlp(ln2(h))
//   logits = head(norm(mean of h over the valid tokens of each sequence))
// The attention of every block (LongSeqConfig::attention):
//   full     nn::MultiHeadAttention over all T keys (the fused kernel: O(T) memory, T^2 time)
//   window   the same with SdpaOptions::window = w: each token sees the tokens within +-w
//            (the fused kernel skips the tiles outside the band: O(T w) time)
// Padding keys are hidden from every query (key_padding_lengths).
#include <nlohmann/json.hpp>

#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/mlp.h"
#include "nn/norm.h"
#include "nn/sequential.h"

namespace ag::apps::longseq {

const std::vector<std::string>& attention_methods();  // {"full", "window"}

struct LongSeqConfig {
  int64_t vocab = 257, max_len = 784, classes = 10;
  int64_t d_model = 64, n_heads = 4, n_layers = 2, mlp_hidden = 128;
  double dropout = 0.0;
  std::string attention = "full";
  int64_t window = 64;  // window: keys within +-window of the query
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LongSeqConfig, vocab, max_len, classes, d_model, n_heads, n_layers,
                                                mlp_hidden, dropout, attention, window)
// The checks of a config: ag::Error naming the field and value (a size below 1, heads not dividing
// d_model, an unknown attention method, window < 0).
void check_config(const LongSeqConfig& c);

struct LongSeqBlock : nn::Module {
  std::string method;
  int64_t window;
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<nn::MLP> mlp;
  bool need_weights = false;
  Tensor attn_weights;  // (B, H, T, T) of the last forward, kept only with need_weights

  LongSeqBlock(const LongSeqConfig& c, Generator* gen);
  Tensor forward(const Tensor& x, const Tensor& lengths);  // x (B, T, d), lengths i64 (B) or undefined
};

struct LongSeqClassifier : nn::Module {
  LongSeqConfig cfg;
  std::shared_ptr<nn::Embedding> embed;
  Tensor pos_embed;  // (1, max_len, d)
  std::shared_ptr<nn::ModuleList<LongSeqBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;

  explicit LongSeqClassifier(const LongSeqConfig& cfg, Generator* gen = nullptr);
  // tokens i64 (B, T <= max_len), lengths i64 (B) in [1, T] (undefined: every sequence is T long)
  Tensor forward(const Tensor& tokens, const Tensor& lengths = Tensor());
};

}  // namespace ag::apps::longseq
