#pragma once
// Normalisation layers.
//
// LayerNorm(shape, eps, elementwise_affine), as torch.nn.LayerNorm: over the last
//   shape.size() dims, y = (x - mean) / sqrt(var_biased + eps) * weight + bias
//   weight = 1, bias = 0 at init (both absent when elementwise_affine = false). Math and
//   gradients: layer_norm in autograd/ops.h.
//
// RMSNorm(dim, eps), as torch.nn.RMSNorm (PyTorch >= 2.4) over the last dim:
//   y = x / sqrt(mean(x^2, -1) + eps) * weight,   weight (dim) = 1 at init
//   composed from ops (mul, mean, rsqrt), so its gradient is theirs. PyTorch's default eps=None
//   means finfo(dtype).eps; we default to 1e-6 (LLaMA's value) so f32 and f64 behave alike.
#include "nn/module.h"

namespace ag::nn {

struct LayerNorm : UnaryModule {
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // normalized_shape each, or undefined without elementwise_affine

  explicit LayerNorm(const Shape& normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     DType dtype = DType::f32);
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true, DType dtype = DType::f32)
      : LayerNorm(Shape{dim}, eps, elementwise_affine, dtype) {}
  Tensor forward(const Tensor& x) override;
};

struct RMSNorm : UnaryModule {
  int64_t dim;
  double eps;
  Tensor weight;  // (dim)

  explicit RMSNorm(int64_t dim, double eps = 1e-6, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) override;
};

// make_norm(kind, dim): LayerNorm(dim) for "layernorm", RMSNorm(dim) for "rmsnorm" (their default
// eps), the choice of TransformerBlock::Options::norm and of the apps' final norms; any other
// kind is an ag::Error naming it.
std::shared_ptr<UnaryModule> make_norm(const std::string& kind, int64_t dim, DType dtype = DType::f32);

}  // namespace ag::nn
