#pragma once
// The char-level GPT of apps/gpt, built from nn/ parts. Parameter names follow the PyTorch twin in
// bench/torch_models.py one-to-one, so a state_dict moves between the two unchanged.
//
// GPT: a decoder, GPT-2's layout, or with the parts of current small models (GPTConfig).
//                                                                   idx i64 (B, T) -> logits (B, T, V)
//   h = wte(idx) [+ wpe(positions)]               token embeddings, + learned positions (wpe, pos
//                                                 "learned"); pos "sinusoidal": wte(idx) sqrt(d) + PE,
//                                                 the Transformer paper's scaling (with GPT-2's 0.02
//                                                 initialisation, unscaled embeddings would be ~35x
//                                                 smaller than PE and drown in it)
//   h = blocks.i(h)  for i < n_layers             pre-norm TransformerBlock, causal; pos "rope" and
//                                                 "alibi" act inside its attention instead
//   logits = head(ln_f(h))                        head: Linear(d, V), no bias
// kv_heads: grouped-query attention (0: n_heads); mlp_kind gelu | swiglu; norm layernorm | rmsnorm
// (every norm of the model, ln_f included). Only learned positions stop at `context`: the others
// are functions of the position (sinusoidal) or of distances (rope, alibi), so the model runs on
// longer sequences than it was trained on (how well: docs/math/positional.md).
//
// Initialisation: GPT-2's (apps/common/gpt2_style.h init_gpt2_style).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/embedding.h"
#include "nn/positional.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace ag::apps {

struct GPTConfig {
  int64_t vocab = 96, context = 128, d_model = 128, n_heads = 4, n_layers = 4, mlp_hidden = 512;
  double dropout = 0.0;
  std::string pos = "learned";      // gpt_choices("pos"): learned | sinusoidal | rope | alibi
  int64_t kv_heads = 0;             // key/value heads dividing n_heads; 0: n_heads
  std::string mlp_kind = "gelu";    // gpt_choices("mlp_kind"): gelu | swiglu
  std::string norm = "layernorm";   // gpt_choices("norm"): layernorm | rmsnorm

  // Whether the model has positions 0 .. n-1: learned positions stop at the context, the others
  // are functions of the position or of distances and go on.
  bool has_positions(int64_t n) const { return pos != "learned" || n <= context; }
};
// The values GPTConfig's field `pos`, `mlp_kind` or `norm` may take (the CLI's, the checkpoint
// reader's and the constructor's one list each).
const std::vector<std::string>& gpt_choices(const std::string& field);
// to_json / from_json (missing keys keep their defaults): the keyword arguments of the PyTorch twin.
// Checkpoints use gpt_config_to_json (apps/gpt/lib.h), which leaves out the four choices above
// at their defaults, so the configs of runs from before they existed still match.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GPTConfig, vocab, context, d_model, n_heads, n_layers, mlp_hidden,
                                                dropout, pos, kv_heads, mlp_kind, norm)

struct GPT : nn::Module {
  GPTConfig cfg;
  std::shared_ptr<nn::Embedding> wte;         // (V, d)
  std::shared_ptr<nn::LearnedPositions> wpe;  // (context, d); only with pos "learned"
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::UnaryModule> ln_f;      // LayerNorm or RMSNorm
  std::shared_ptr<nn::Linear> head;  // d -> V, no bias

  explicit GPT(const GPTConfig& cfg, Generator* gen = nullptr);
  // idx (B, T) -> logits (B, T, V). With `caches` (one per block, see nn::KVCache) the tokens are
  // the next positions after what the caches hold: decoding one token at a time. With learned
  // positions, positions past `context` are an ag::Error saying so.
  Tensor forward(const Tensor& idx, std::vector<nn::KVCache>* caches = nullptr);
  // The attention weights (B, H, T, T) of every block in the last forward, when `need_weights`.
  bool need_weights = false;
  // --grad-checkpointing: each block's activations are recomputed in backward instead of kept
  // (apps/common/gpt2_style.h block_forward); the same gradients, less memory, one more forward
  // of the blocks per step (docs/math/checkpointing.md).
  bool grad_checkpointing = false;
  Generator* dropout_gen = nullptr;  // the generator given to the constructor, which dropout draws from
};

}  // namespace ag::apps
