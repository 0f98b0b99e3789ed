#pragma once
// The vision transformer of apps/vit, built from nn/ parts. Parameter names follow the PyTorch twin
// in bench/torch_models.py one-to-one, so a state_dict moves between the two unchanged.
//
// ViT:                                                            image (B, C, H, W) -> logits (B, K)
//   h = [cls | patch(image)] + pos_embed          PatchEmbedding with class token; pos_embed (1, N+1, d)
//   h = blocks.i(h)                               pre-LN TransformerBlock, no mask
//   logits = head(norm(h[:, 0]))                  the class token's final state
//
// Initialisation: GPT-2's (apps/common/gpt2_style.h init_gpt2_style); the class token and
// pos_embed ~ N(0, 0.02).
#include <nlohmann/json.hpp>

#include "nn/patch.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace ag::apps {

struct ViTConfig {
  int64_t image_size = 28, channels = 1, patch = 7, classes = 10;
  int64_t d_model = 64, n_heads = 4, n_layers = 4, mlp_hidden = 256;
  double dropout = 0.0;
};
// to_json / from_json (missing keys keep their defaults): the keyword arguments of the PyTorch twin.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ViTConfig, image_size, channels, patch, classes, d_model, n_heads,
                                                n_layers, mlp_hidden, dropout)

struct ViT : nn::Module {
  ViTConfig cfg;
  std::shared_ptr<nn::PatchEmbedding> patch;  // patch.proj.*, patch.cls_token
  Tensor pos_embed;                           // (1, N + 1, d)
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;  // d -> classes
  bool need_weights = false;         // keep each block's attention weights (blocks[i].attn_weights)

  explicit ViT(const ViTConfig& cfg, Generator* gen = nullptr);
  Tensor forward(const Tensor& images);  // (B, C, H, W) f32 -> (B, classes)
};

}  // namespace ag::apps
