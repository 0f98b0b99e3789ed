#pragma once
// SwiGLU: a new layer written outside attograd, from attograd's ops only.
#include "nn/linear.h"

namespace ext {

// snippet-begin: swiglu_h
// SwiGLU feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"), as LLaMA's FeedForward:
//   y = w2( silu(w1(x)) * w3(x) )                x (..., dim) -> y (..., dim)
//   w1, w3: Linear(dim, hidden),  w2: Linear(hidden, dim),  no bias unless asked for
//   parameters, named as in PyTorch: w1.weight (hidden, dim), w2.weight (dim, hidden),
//   w3.weight (hidden, dim)  [+ w1.bias, w2.bias, w3.bias]
// silu(a) = a sigmoid(a) gates the linear branch w3(x) elementwise. The backward is that of the
// ops it is made of (linear, silu, mul): nothing to derive, nothing to test beyond gradcheck.
struct SwiGLU : ag::nn::UnaryModule {
  int64_t dim, hidden;
  std::shared_ptr<ag::nn::Linear> w1, w2, w3;

  SwiGLU(int64_t dim, int64_t hidden, bool bias = false, ag::DType dtype = ag::DType::f32,
         ag::Generator* gen = nullptr);
  ag::Tensor forward(const ag::Tensor& x) override;
};
// snippet-end: swiglu_h

}  // namespace ext
