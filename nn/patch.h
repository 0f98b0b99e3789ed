#pragma once
// PatchEmbedding: an image cut into non-overlapping p x p patches, each flattened and projected
// to d (ViT's patch embedding).          image (B, C, H, W) -> tokens (B, N, d),  N = (H/p)(W/p)
//   patches: (B, C, H/p, p, W/p, p) -> permute -> (B, H/p, W/p, C, p, p) -> (B, N, C p p)
//            views, and one contiguous() copy for the permute
//   tokens = patches W^T + b            proj: Linear(C p p, d)
// Patches are numbered row-major (n = row * W/p + col), and each is flattened in (c, i, j)
// order. That is exactly torch's Conv2d(C, d, kernel_size=p, stride=p) followed by
// .flatten(2).transpose(1, 2), with proj.weight = conv.weight.reshape(d, -1) and the same bias:
// a stride-p convolution with a p x p kernel is a matmul over non-overlapping patches.
//
// image_size fixes num_patches (for a position table); forward takes any H, W divisible by p.
// cls_token (1, 1, d), learnable (zeros at init, as timm): with_cls_token(tokens) prepends it to
// every sequence, giving (B, N + 1, d).
#include "nn/linear.h"

namespace ag::nn {

struct PatchEmbedding : Module {
  int64_t in_channels, patch, image_size, d_model, num_patches;
  std::shared_ptr<Linear> proj;  // C p p -> d
  Tensor cls_token;              // (1, 1, d)

  PatchEmbedding(int64_t in_channels, int64_t patch, int64_t image_size, int64_t d_model, DType dtype = DType::f32,
                 Generator* gen = nullptr);

  // (B, C, H, W) -> (B, N, C p p): the patches, row-major, as a (contiguous) copy
  Tensor patchify(const Tensor& image) const;
  // (B, C, H, W) -> (B, N, d)
  Tensor forward(const Tensor& image);
  // (B, N, d) -> (B, N + 1, d): cls_token first
  Tensor with_cls_token(const Tensor& tokens) const;
};

}  // namespace ag::nn
