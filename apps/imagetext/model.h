#pragma once
// The image-captioning transformer of apps/imagetext, built from nn/ parts: a ViT encoder of the
// scene and a GPT-style decoder whose blocks cross-attend to the encoder's tokens. Parameter names
// follow the PyTorch twin in bench/torch_models.py (ImageText) one-to-one.
//
// Shapes: B scenes, H x W pixels, patch P, N = (H/P)(W/P) patches, Tk = N + 1 image tokens (the
// class token first), T text positions, V words, d model width, NH heads, hs = d / NH.
//
// encode:                                                   images (B, 1, H, W) -> memory (B, Tk, d)
//   m = [cls | patch(images)] + enc_pos                     PatchEmbedding, enc_pos (1, Tk, d)
//   m = enc_blocks.i(m)                                     pre-LN TransformerBlock, no mask
//   memory = enc_norm(m)
// decode:                                                   idx i64 (B, T), memory -> logits (B, T, V)
//   h = wte(idx) + wpe(positions)
//   h = h + attn(ln1(h))                       causal self-attention over the caption so far
//   h = h + cross_attn(ln_cross(h), memory)    queries from the text, keys and values from the image:
//                                              q (B, NH, T, hs), k, v (B, NH, Tk, hs), weights (B, NH, T, Tk)
//   h = h + mlp(ln2(h))                        (each of dec_blocks.i, pre-LN TransformerBlock, cross)
//   logits = head(ln_f(h))                     head: Linear(d, V), no bias
// The gradient of the loss reaches both encoders: the text side through the queries, the image
// side through the keys and values of every decoder block's cross-attention (docs/math/cross-attention.md).
//
// Generating a caption (apps/imagetext/lib.h greedy_captions) encodes each image once, projects
// each decoder block's keys and values of the memory once (context_kv), and then decodes one token
// at a time through the self-attention's KV caches.
//
// Initialisation: GPT-2's (apps/common/gpt2_style.h), the depth counted as enc_layers + dec_layers.
#include <nlohmann/json.hpp>
#include <vector>

#include "nn/embedding.h"
#include "nn/patch.h"
#include "nn/positional.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace ag::apps {

struct ImageTextConfig {
  int64_t image_h = 28, image_w = 112, channels = 1, patch = 7;
  int64_t vocab = 13, max_len = 5;  // words + <pad> <bos> <eos>; decoder positions
  int64_t d_model = 64, n_heads = 4, enc_layers = 2, dec_layers = 2, mlp_hidden = 256;
  double dropout = 0.0;
  int64_t patches() const { return (image_h / patch) * (image_w / patch); }
};
// to_json / from_json (missing keys keep their defaults): the keyword arguments of the PyTorch twin.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ImageTextConfig, image_h, image_w, channels, patch, vocab, max_len,
                                                d_model, n_heads, enc_layers, dec_layers, mlp_hidden, dropout)

struct ImageText : nn::Module {
  ImageTextConfig cfg;
  std::shared_ptr<nn::PatchEmbedding> patch;  // patch.proj.*, patch.cls_token
  Tensor enc_pos;                             // (1, N + 1, d)
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> enc_blocks;
  std::shared_ptr<nn::LayerNorm> enc_norm;
  std::shared_ptr<nn::Embedding> wte;          // (V, d)
  std::shared_ptr<nn::LearnedPositions> wpe;   // (max_len, d)
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> dec_blocks;  // causal, with cross-attention
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;            // d -> V, no bias

  explicit ImageText(const ImageTextConfig& cfg, Generator* gen = nullptr);

  // images (B, C, H, W) f32 -> memory (B, N + 1, d)
  Tensor encode(const Tensor& images);
  // Each decoder block's cross-attention keys and values of `memory`: (B, NH, N + 1, hs) each.
  std::vector<nn::ContextKV> context_kv(const Tensor& memory);
  // idx (B, T) i64 -> logits (B, T, V), cross-attending to `memory` (B, N + 1, d).
  Tensor decode(const Tensor& idx, const Tensor& memory);
  // The same over keys and values projected beforehand (context_kv). With `caches` (one per decoder
  // block) idx holds the next positions after what the caches hold: one token at a time.
  Tensor decode(const Tensor& idx, const std::vector<nn::ContextKV>& context, std::vector<nn::KVCache>* caches = nullptr);
  // Teacher forcing: decode(idx, encode(images)).
  Tensor forward(const Tensor& images, const Tensor& idx);
};

}  // namespace ag::apps
