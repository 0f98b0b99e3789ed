#include "nn/patch.h"

namespace ag::nn {

PatchEmbedding::PatchEmbedding(int64_t in_channels, int64_t patch, int64_t image_size, int64_t d_model, DType dtype,
                               Generator* gen)
    : in_channels(in_channels), patch(patch), image_size(image_size), d_model(d_model) {
  check(in_channels > 0 && patch > 0 && d_model > 0,
        "PatchEmbedding: in_channels {}, patch {} and d_model {} must be positive", in_channels, patch, d_model);
  check(image_size > 0 && image_size % patch == 0, "PatchEmbedding: image_size {} is not divisible by patch {}",
        image_size, patch);
  num_patches = (image_size / patch) * (image_size / patch);
  proj = register_module("proj", std::make_shared<Linear>(in_channels * patch * patch, d_model, true, dtype, gen));
  cls_token = register_parameter("cls_token", zeros({1, 1, d_model}, dtype));
}

Tensor PatchEmbedding::patchify(const Tensor& image) const {
  check(image.ndim() == 4 && image.size(1) == in_channels,
        "PatchEmbedding: expected an image of shape [B, {}, H, W], got {}", in_channels, image.shape());
  const int64_t B = image.size(0), C = in_channels, H = image.size(2), W = image.size(3), p = patch;
  check(H % p == 0 && W % p == 0, "PatchEmbedding: image {}: H {} and W {} must be divisible by patch {}",
        image.shape(), H, W, p);
  const int64_t Hp = H / p, Wp = W / p;
  // (B, C, Hp, p, Wp, p) -> (B, Hp, Wp, C, p, p): patch (r, c) holds image[:, :, r p + i, c p + j]
  return image.reshape({B, C, Hp, p, Wp, p}).permute({0, 2, 4, 1, 3, 5}).contiguous().reshape({B, Hp * Wp, C * p * p});
}

Tensor PatchEmbedding::forward(const Tensor& image) {
  ModuleScope scope(this);
  return proj->forward(patchify(image));
}

Tensor PatchEmbedding::with_cls_token(const Tensor& tokens) const {
  ModuleScope scope(this);
  check(tokens.ndim() == 3 && tokens.size(2) == d_model, "PatchEmbedding: expected tokens of shape [B, N, {}], got {}",
        d_model, tokens.shape());
  return cat({cls_token.expand({tokens.size(0), 1, d_model}), tokens}, 1);
}

}  // namespace ag::nn
