#pragma once
// Linear: y = x W^T + b, as torch.nn.Linear.        x (..., in) -> y (..., out)
//   weight (out, in) ~ kaiming_uniform(a = sqrt 5) = U(-1/sqrt(in), 1/sqrt(in))
//   bias   (out)     ~ U(-1/sqrt(in), 1/sqrt(in))
// W^T is a view (mT) that matmul hands to BLAS as a transpose flag, not a copy; the gradients
// come from matmul's and add's backward (dW = g^T x summed over rows, db = g summed over rows).
#include "nn/module.h"

namespace ag::nn {

struct Linear : UnaryModule {
  int64_t in_features, out_features;
  Tensor weight, bias;  // (out, in), (out) or undefined when bias = false

  Linear(int64_t in, int64_t out, bool bias = true, DType dtype = DType::f32, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
};

}  // namespace ag::nn
