#include "nn/norm.h"

namespace ag::nn {

LayerNorm::LayerNorm(const Shape& shape, double eps_, bool elementwise_affine, DType dtype)
    : normalized_shape(shape), eps(eps_) {
  check(!shape.empty() && shape.numel() > 0, "LayerNorm: normalized_shape must be non-empty, got {}", shape);
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(shape, dtype));
    bias = register_parameter("bias", zeros(shape, dtype));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  ModuleScope scope(this);
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

RMSNorm::RMSNorm(int64_t dim_, double eps_, DType dtype) : dim(dim_), eps(eps_) {
  check(dim > 0, "RMSNorm: dim must be positive, got {}", dim);
  weight = register_parameter("weight", ones({dim}, dtype));
}

Tensor RMSNorm::forward(const Tensor& x) {
  ModuleScope scope(this);
  check(x.ndim() >= 1 && x.size(-1) == dim, "RMSNorm: expected input of shape [..., {}], got {}", dim, x.shape());
  Tensor rrms = rsqrt(add(mean(mul(x, x), {-1}, true), eps));  // (..., 1) = 1 / sqrt(mean(x^2) + eps)
  return mul(mul(x, rrms), weight);
}

std::shared_ptr<UnaryModule> make_norm(const std::string& kind, int64_t dim, DType dtype) {
  if (kind == "layernorm") return std::make_shared<LayerNorm>(dim, 1e-5, true, dtype);
  check(kind == "rmsnorm", "make_norm: norm '{}': expected layernorm or rmsnorm", kind);
  return std::make_shared<RMSNorm>(dim, 1e-6, dtype);
}

}  // namespace ag::nn
