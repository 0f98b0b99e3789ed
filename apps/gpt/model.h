#pragma once
// The char-level GPT of apps/gpt, built from nn/ parts. Parameter names follow the PyTorch twin in
// bench/torch_models.py one-to-one, so a state_dict moves between the two unchanged.
//
// GPT: a decoder, GPT-2's layout.                                   idx i64 (B, T) -> logits (B, T, V)
//   h = wte(idx) + wpe(positions)                 token + learned position embeddings
//   h = blocks.i(h)  for i < n_layers             pre-LN TransformerBlock, causal
//   logits = head(ln_f(h))                        head: Linear(d, V), no bias
//
// Initialisation: GPT-2's (apps/common/gpt2_style.h init_gpt2_style).
#include <nlohmann/json.hpp>
#include <vector>

#include "nn/embedding.h"
#include "nn/positional.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace ag::apps {

struct GPTConfig {
  int64_t vocab = 96, context = 128, d_model = 128, n_heads = 4, n_layers = 4, mlp_hidden = 512;
  double dropout = 0.0;
};
// to_json / from_json (missing keys keep their defaults): the config saved in checkpoints and the
// keyword arguments of the PyTorch twin.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GPTConfig, vocab, context, d_model, n_heads, n_layers, mlp_hidden,
                                                dropout)

struct GPT : nn::Module {
  GPTConfig cfg;
  std::shared_ptr<nn::Embedding> wte;         // (V, d)
  std::shared_ptr<nn::LearnedPositions> wpe;  // (context, d)
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;  // d -> V, no bias

  explicit GPT(const GPTConfig& cfg, Generator* gen = nullptr);
  // idx (B, T) -> logits (B, T, V). With `caches` (one per block, see nn::KVCache) the tokens are
  // the next positions after what the caches hold: decoding one token at a time.
  Tensor forward(const Tensor& idx, std::vector<nn::KVCache>* caches = nullptr);
  // The attention weights (B, H, T, T) of every block in the last forward, when `need_weights`.
  bool need_weights = false;
};

}  // namespace ag::apps
