#pragma once
// SwiGLU: a new layer written outside attograd, from attograd's ops only.
#include "nn/linear.h"

namespace ext {

// snippet-begin: swiglu_h
// SwiGLU feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"), as LLaMA's FeedForward,
// with a LayerScale (Touvron et al. 2021, "Going deeper with Image Transformers"):
//   y = gamma * w2( drop( silu(w1(x)) * w3(x) * mask ) )      x (..., dim) -> y (..., dim)
//   w1, w3: Linear(dim, hidden),  w2: Linear(hidden, dim),  no bias unless asked for
//   gamma (dim)   a parameter of the layer itself, every entry initialised to layer_scale
//                 (1: the plain SwiGLU; CaiT starts deep models at 0.1 down to 1e-6)
//   mask (hidden) a buffer, ones at first: 0 prunes that hidden unit. Saved in the state dict and
//                 moved by to() with the parameters, never trained (PyTorch's pruning keeps its
//                 masks as buffers too)
//   drop          dropout with probability `dropout` while training, the identity in eval()
// Parameters, named as in PyTorch: gamma (dim), w1.weight (hidden, dim), w2.weight (dim, hidden),
// w3.weight (hidden, dim) [+ w1.bias, w2.bias, w3.bias]; buffer: mask (hidden).
// silu(a) = a sigmoid(a) gates the linear branch w3(x) elementwise. The backward is that of the
// ops it is made of (linear, silu, mul, dropout): nothing to derive, nothing to test beyond gradcheck.
struct SwiGLUOptions {
  bool bias = false;
  double dropout = 0.0;
  double layer_scale = 1.0;
  ag::DType dtype = ag::DType::f32;
  ag::Generator* gen = nullptr;  // draws the weights and the dropout masks; null: the default one
};

struct SwiGLU : ag::nn::UnaryModule {
  int64_t dim, hidden;
  double dropout;
  ag::Generator* gen;
  std::shared_ptr<ag::nn::Linear> w1, w2, w3;
  ag::Tensor gamma;  // (dim), trained
  ag::Tensor mask;   // (hidden), not trained

  SwiGLU(int64_t dim, int64_t hidden, const SwiGLUOptions& options = {});
  ag::Tensor forward(const ag::Tensor& x) override;
};
// snippet-end: swiglu_h

}  // namespace ext
