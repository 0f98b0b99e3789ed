#pragma once
// Adam and AdamW, as torch.optim.Adam / torch.optim.AdamW 1.13 (amsgrad off), for each parameter p
// with gradient g, its own step count t (1 at its first update), learning rate lr, weight decay wd:
//   p <- p * (1 - lr * wd)                          AdamW: decoupled weight decay
//   g <- g + wd * p                                 Adam: L2 weight decay, through the moments
//   m <- beta1 * m + (1 - beta1) * g                "exp_avg"
//   v <- beta2 * v + (1 - beta2) * g^2              "exp_avg_sq"
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The two bias corrections undo the pull of m and v towards their zero start. One fused
// multi-tensor kernel over all the parameters of a device and dtype, each with its own t:
// cpu::adam_update (core/cpu/optim.cpp). State: "step" (0-dim), "exp_avg",
// "exp_avg_sq". Parameters without a gradient are skipped and keep their step count.
// Derived step by step (the moments, the bias corrections): docs/math/adam.md
#include <vector>

#include "optim/optimizer.h"

namespace ag::optim {

class Adam : public Optimizer {
 public:
  struct Options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
  };
  Adam(std::vector<Tensor> params, Options options) : Adam("Adam", std::move(params), options, false) {}

  void step() override;
  Options options() const;  // lr as now set (set_lr)

 protected:
  Adam(const char* name, std::vector<Tensor> params, Options options, bool decoupled);
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameters(const std::vector<double>& values) override;

 private:
  Options options_;  // lr lives in Optimizer
  bool decoupled_;   // AdamW's weight decay
};

// Adam with decoupled weight decay (Loshchilov & Hutter): the decay shrinks p directly instead of
// entering g, so it is not rescaled by 1 / sqrt(v). PyTorch's default weight_decay is 0.01.
class AdamW : public Adam {
 public:
  struct Options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 1e-2;
  };
  AdamW(std::vector<Tensor> params, Options o)
      : Adam("AdamW", std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, true) {}
};

}  // namespace ag::optim
