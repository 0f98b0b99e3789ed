#include "nn/init.h"

namespace ag::nn::init {

Fans fans(const Shape& shape) {
  check(shape.size() >= 2, "init: fan in and fan out need a weight of at least 2 dims, got shape {}", shape);
  int64_t receptive = 1;
  for (int i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[1] * receptive, shape[0] * receptive};
}

namespace {
double leaky_relu_gain(double a) { return std::sqrt(2.0 / (1.0 + a * a)); }
double positive_fan(const char* op, int64_t fan, const Shape& shape) {
  check(fan > 0, "{}: zero fan for weight shape {}", op, shape);
  return double(fan);
}
}  // namespace

Tensor uniform(const Shape& shape, double low, double high, DType dtype, Generator* gen) {
  return rand(shape, dtype, gen, low, high);
}

Tensor normal(const Shape& shape, double mean, double std, DType dtype, Generator* gen) {
  return randn(shape, dtype, gen, mean, std);
}

Tensor kaiming_uniform(const Shape& shape, double a, DType dtype, Generator* gen) {
  const double bound = leaky_relu_gain(a) * std::sqrt(3.0 / positive_fan("kaiming_uniform", fans(shape).in, shape));
  return rand(shape, dtype, gen, -bound, bound);
}

Tensor kaiming_normal(const Shape& shape, double a, DType dtype, Generator* gen) {
  const double std = leaky_relu_gain(a) / std::sqrt(positive_fan("kaiming_normal", fans(shape).in, shape));
  return randn(shape, dtype, gen, 0.0, std);
}

Tensor xavier_uniform(const Shape& shape, double gain, DType dtype, Generator* gen) {
  const Fans f = fans(shape);
  const double bound = gain * std::sqrt(6.0 / positive_fan("xavier_uniform", f.in + f.out, shape));
  return rand(shape, dtype, gen, -bound, bound);
}

Tensor xavier_normal(const Shape& shape, double gain, DType dtype, Generator* gen) {
  const Fans f = fans(shape);
  const double std = gain * std::sqrt(2.0 / positive_fan("xavier_normal", f.in + f.out, shape));
  return randn(shape, dtype, gen, 0.0, std);
}

}  // namespace ag::nn::init
