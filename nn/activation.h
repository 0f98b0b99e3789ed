#pragma once
// Activations as modules, for Sequential. No parameters; the math is in autograd/ops.h.
//   ReLU   y = max(x, 0)
//   GELU   y = x Phi(x), or its tanh approximation with approximate = "tanh"
//   SiLU   y = x sigmoid(x)
//   Tanh   y = tanh(x)
#include <string>

#include "nn/module.h"

namespace ag::nn {

struct ReLU : UnaryModule {
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return relu(x);
  }
};

struct GELU : UnaryModule {
  std::string approximate;  // "none" or "tanh"
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {
    check(this->approximate == "none" || this->approximate == "tanh",
          "GELU: approximate must be 'none' or 'tanh', got '{}'", this->approximate);
  }
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return gelu(x, approximate.c_str());
  }
};

struct SiLU : UnaryModule {
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return silu(x);
  }
};

struct Tanh : UnaryModule {
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    return tanh(x);
  }
};

}  // namespace ag::nn
