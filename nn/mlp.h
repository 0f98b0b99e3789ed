#pragma once
// MLP: the transformer's feed-forward block.           x (..., d) -> y (..., d)
//   y = drop(fc2(gelu(fc1(x)))),   fc1: Linear(d, hidden),  fc2: Linear(hidden, d)
// Children "fc1", "act", "fc2", "drop"; the parameters are named as in timm's Mlp:
// fc1.weight, fc1.bias, fc2.weight, fc2.bias.
//
// SwiGLU: the gated feed-forward of LLaMA and most current language models (Shazeer 2020, "GLU
// Variants Improve Transformer").                      x (..., d) -> y (..., d)
//   y = drop(w2(silu(w1(x)) * w3(x))),   w1, w3: Linear(d, hidden),  w2: Linear(hidden, d)
// silu(a) = a sigmoid(a) gates the linear branch w3(x) element by element. No biases unless asked
// for (LLaMA has none). Children "w1", "w2", "w3", "drop", named as LLaMA's FeedForward. With three
// matrices instead of two, hidden = 2/3 of an MLP's keeps the parameter count (LLaMA: 8d/3 for 4d).
// Its backward is that of linear, silu and mul.
#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/linear.h"

namespace ag::nn {

struct MLP : UnaryModule {
  struct Options {
    double dropout = 0.0;  // on the output, in training only
    DType dtype = DType::f32;
    Generator* generator = nullptr;  // init and dropout (null: the default generator)
  };

  Options options;
  std::shared_ptr<Linear> fc1;
  std::shared_ptr<GELU> act;
  std::shared_ptr<Linear> fc2;
  std::shared_ptr<Dropout> drop;

  MLP(int64_t d, int64_t hidden, const Options& options) : options(options) {
    fc1 = register_module("fc1", std::make_shared<Linear>(d, hidden, /*bias=*/true, options.dtype, options.generator));
    act = register_module("act", std::make_shared<GELU>());
    fc2 = register_module("fc2", std::make_shared<Linear>(hidden, d, /*bias=*/true, options.dtype, options.generator));
    drop = register_module("drop", std::make_shared<Dropout>(options.dropout, options.generator));
  }
  MLP(int64_t d, int64_t hidden) : MLP(d, hidden, Options{}) {}
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return drop->forward(fc2->forward(act->forward(fc1->forward(x))));
  }
};

struct SwiGLU : UnaryModule {
  struct Options {
    double dropout = 0.0;  // on the output, in training only
    bool bias = false;     // w1, w2, w3 have biases (LLaMA's have none)
    DType dtype = DType::f32;
    Generator* generator = nullptr;  // init and dropout (null: the default generator)
  };

  Options options;
  std::shared_ptr<Linear> w1, w2, w3;
  std::shared_ptr<Dropout> drop;

  SwiGLU(int64_t d, int64_t hidden, const Options& options) : options(options) {
    const bool bias = options.bias;
    w1 = register_module("w1", std::make_shared<Linear>(d, hidden, bias, options.dtype, options.generator));
    w2 = register_module("w2", std::make_shared<Linear>(hidden, d, bias, options.dtype, options.generator));
    w3 = register_module("w3", std::make_shared<Linear>(d, hidden, bias, options.dtype, options.generator));
    drop = register_module("drop", std::make_shared<Dropout>(options.dropout, options.generator));
  }
  SwiGLU(int64_t d, int64_t hidden) : SwiGLU(d, hidden, Options{}) {}
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return drop->forward(w2->forward(silu(w1->forward(x)) * w3->forward(x)));
  }
};

}  // namespace ag::nn
