#include "apps/vit/model.h"

#include "apps/common/gpt2_style.h"
#include "autograd/ops.h"

namespace ag::apps {

ViT::ViT(const ViTConfig& c, Generator* gen) : cfg(c) {
  check(c.patch > 0 && c.image_size % c.patch == 0, "ViT: image size {} is not a multiple of the patch size {}",
        c.image_size, c.patch);
  patch = register_module("patch",
                          std::make_shared<nn::PatchEmbedding>(c.channels, c.patch, c.image_size, c.d_model, DType::f32,
                                                               gen));
  pos_embed = register_parameter("pos_embed", zeros({1, patch->num_patches + 1, c.d_model}));
  blocks = register_module(
      "blocks", make_blocks(c.n_layers, c.d_model, c.n_heads,
                            {.mlp_hidden = c.mlp_hidden, .dropout = c.dropout, .generator = gen}));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(c.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, DType::f32, gen));
  init_gpt2_style(*this, c.n_layers, gen);
}

Tensor ViT::forward(const Tensor& images) {
  check(images.ndim() == 4 && images.size(1) == cfg.channels && images.size(2) == cfg.image_size &&
            images.size(3) == cfg.image_size,
        "ViT: expected images [B, {}, {}, {}], got {}", cfg.channels, cfg.image_size, cfg.image_size, images.shape());
  // the images may come from the host: they go where the weights are
  Tensor h = patch->with_cls_token(patch->forward(images.to(device()))) + pos_embed;  // (B, N + 1, d)
  nn::AttentionOptions o;
  o.need_weights = need_weights;
  for (const auto& block : *blocks) h = block->forward(h, o);
  return head->forward(norm->forward(h.select(1, 0)));  // the class token
}

}  // namespace ag::apps
