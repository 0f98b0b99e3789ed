#pragma once
// Dropout(p), as torch.nn.Dropout: in training, y = x * m / (1 - p) with m ~ Bernoulli(1 - p);
// in eval mode (after eval()), y = x. Math: dropout in autograd/ops.h.
#include "nn/module.h"

namespace ag::nn {

struct Dropout : UnaryModule {
  double p;
  Generator* gen;  // null: the default generator

  explicit Dropout(double p = 0.5, Generator* gen = nullptr) : p(p), gen(gen) {
    check(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got {}", p);
  }
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return dropout(x, p, is_training(), gen);
  }
};

}  // namespace ag::nn
