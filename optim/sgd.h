#pragma once
// Stochastic gradient descent with momentum and weight decay, as torch.optim.SGD:
//   g <- g + wd * p                                (weight decay, L2)
//   b <- g at the first step, then b <- mu * b + g (momentum buffer, when mu > 0)
//   p <- p - lr * b                                (b = g without momentum)
// Parameters without a gradient are skipped. Updates run under NoGradGuard, in place.
#include <vector>

#include "core/tensor.h"

namespace ag::optim {

class SGD {
 public:
  struct Options {
    double lr = 0.01;
    double momentum = 0.0;
    double weight_decay = 0.0;
  };
  SGD(std::vector<Tensor> params, Options options);

  void step();
  // Drops every gradient (PyTorch's set_to_none), so the next backward writes fresh ones.
  void zero_grad();
  const Options& options() const { return options_; }
  void set_lr(double lr) { options_.lr = lr; }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> momentum_;  // one buffer per parameter, created at its first update
  Options options_;
};

}  // namespace ag::optim
