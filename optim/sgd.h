#pragma once
// Stochastic gradient descent, as torch.optim.SGD (momentum mu, dampening tau, weight decay wd):
//   g <- g + wd * p                                (weight decay, L2)
//   b <- g at the first step, then b <- mu * b + (1 - tau) * g   (momentum buffer, when mu > 0)
//   g <- g + mu * b  with nesterov, else g <- b   (g unchanged without momentum)
//   p <- p - lr * g
// Nesterov needs mu > 0 and tau = 0, as in PyTorch. One fused multi-tensor kernel over all the
// parameters of a device and dtype: cpu::sgd_update (core/cpu/optim.cpp). State: "momentum_buffer" (PyTorch's name), only with mu > 0.
#include <vector>

#include "optim/optimizer.h"

namespace ag::optim {

class SGD : public Optimizer {
 public:
  struct Options {
    double lr = 0.01;
    double momentum = 0.0;
    double weight_decay = 0.0;
    double dampening = 0.0;
    bool nesterov = false;
  };
  SGD(std::vector<Tensor> params, Options options);

  void step() override;
  Options options() const;  // lr as now set (set_lr)

 protected:
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameters(const std::vector<double>& values) override;

 private:
  Options options_;  // lr lives in Optimizer
};

}  // namespace ag::optim
