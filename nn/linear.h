#pragma once
// Linear: y = x W^T + b, as torch.nn.Linear.        x (..., in) -> y (..., out)
//   weight (out, in) ~ kaiming_uniform(a = sqrt 5) = U(-1/sqrt(in), 1/sqrt(in))
//   bias   (out)     ~ U(-1/sqrt(in), 1/sqrt(in))
// forward is ag::linear: one GEMM reading W transposed (a flag, not a copy) with the bias added in
// its epilogue; the gradients come from linear's backward (autograd/ops.h: linear; dW = g^T x and
// db = g summed over rows).
#include "nn/module.h"

namespace ag::nn {

struct Linear : UnaryModule {
  int64_t in_features, out_features;
  Tensor weight, bias;  // (out, in), (out) or undefined when bias = false

  Linear(int64_t in, int64_t out, bool bias = true, DType dtype = DType::f32, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
};

}  // namespace ag::nn
