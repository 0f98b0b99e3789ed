#pragma once
// Parameter initialisation, as torch.nn.init does it. Each function returns a new leaf tensor
// (not requiring grad: the layer that owns it calls set_requires_grad). Fans follow PyTorch: for a
// weight of shape (out, in, k...), fan_in = in * prod(k) and fan_out = out * prod(k).
//
//   uniform(s, a, b)              U(a, b)
//   normal(s, mean, std)          N(mean, std^2)
//   kaiming_uniform(s, a)         U(-bound, bound),  bound = gain * sqrt(3 / fan_in),
//                                 gain = sqrt(2 / (1 + a^2))  (leaky-ReLU gain; a = sqrt 5 is
//                                 nn.Linear's default, which makes bound = 1 / sqrt(fan_in))
//   kaiming_normal(s, a)          N(0, std^2),  std = gain / sqrt(fan_in)
//   xavier_uniform(s, gain)       U(-bound, bound),  bound = gain * sqrt(6 / (fan_in + fan_out))
//   xavier_normal(s, gain)        N(0, std^2),  std = gain * sqrt(2 / (fan_in + fan_out))
#include <cmath>

#include "core/random.h"

namespace ag::nn::init {

struct Fans {
  int64_t in = 0, out = 0;
};
// PyTorch's fan_in/fan_out of a weight shape; needs at least 2 dims.
Fans fans(const Shape& shape);

Tensor uniform(const Shape& shape, double low, double high, DType dtype = DType::f32, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, DType dtype = DType::f32, Generator* gen = nullptr);
Tensor kaiming_uniform(const Shape& shape, double a = std::sqrt(5.0), DType dtype = DType::f32,
                       Generator* gen = nullptr);
Tensor kaiming_normal(const Shape& shape, double a = 0.0, DType dtype = DType::f32, Generator* gen = nullptr);
Tensor xavier_uniform(const Shape& shape, double gain = 1.0, DType dtype = DType::f32, Generator* gen = nullptr);
Tensor xavier_normal(const Shape& shape, double gain = 1.0, DType dtype = DType::f32, Generator* gen = nullptr);

}  // namespace ag::nn::init
