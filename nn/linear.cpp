#include "nn/linear.h"

#include <cmath>

#include "nn/init.h"

namespace ag::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias, DType dtype, Generator* gen)
    : in_features(in), out_features(out) {
  check(in > 0 && out > 0, "Linear: in and out features must be positive, got {} and {}", in, out);
  weight = register_parameter("weight", init::kaiming_uniform({out, in}, std::sqrt(5.0), dtype, gen));
  if (with_bias) {
    const double bound = 1.0 / std::sqrt(double(in));
    bias = register_parameter("bias", init::uniform({out}, -bound, bound, dtype, gen));
  }
}

Tensor Linear::forward(const Tensor& x) {
  ModuleScope scope(this);
  check(x.ndim() >= 1 && x.size(-1) == in_features, "Linear: expected input of shape [..., {}], got {}",
        in_features, x.shape());
  return linear(x, weight, bias);
}

}  // namespace ag::nn
