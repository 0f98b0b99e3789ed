#pragma once
// MLP: the transformer's feed-forward block.           x (..., d) -> y (..., d)
//   y = drop(fc2(gelu(fc1(x)))),   fc1: Linear(d, hidden),  fc2: Linear(hidden, d)
// Children "fc1", "act", "fc2", "drop"; the parameters are named as in timm's Mlp:
// fc1.weight, fc1.bias, fc2.weight, fc2.bias.
#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/linear.h"

namespace ag::nn {

struct MLP : UnaryModule {
  std::shared_ptr<Linear> fc1;
  std::shared_ptr<GELU> act;
  std::shared_ptr<Linear> fc2;
  std::shared_ptr<Dropout> drop;

  MLP(int64_t d, int64_t hidden, double dropout = 0.0, DType dtype = DType::f32, Generator* gen = nullptr) {
    fc1 = register_module("fc1", std::make_shared<Linear>(d, hidden, true, dtype, gen));
    act = register_module("act", std::make_shared<GELU>());
    fc2 = register_module("fc2", std::make_shared<Linear>(hidden, d, true, dtype, gen));
    drop = register_module("drop", std::make_shared<Dropout>(dropout, gen));
  }
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return drop->forward(fc2->forward(act->forward(fc1->forward(x))));
  }
};

}  // namespace ag::nn
