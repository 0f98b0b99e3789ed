#include "optim/sgd.h"

#include "autograd/tape.h"

namespace ag::optim {

SGD::SGD(std::vector<Tensor> params, Options options)
    : params_(std::move(params)), momentum_(params_.size()), options_(options) {
  check(options.lr >= 0, "SGD: learning rate must be >= 0, got {}", options.lr);
  check(options.momentum >= 0, "SGD: momentum must be >= 0, got {}", options.momentum);
  check(options.weight_decay >= 0, "SGD: weight_decay must be >= 0, got {}", options.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i)
    check(params_[i].requires_grad() && params_[i].is_leaf(),
          "SGD: parameter {} (shape {}) is not a leaf that requires grad", i, params_[i].shape());
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (options_.weight_decay != 0) {
      g = g.clone();
      g.add_(p, options_.weight_decay);
    }
    if (options_.momentum != 0) {
      if (!momentum_[i].defined()) {
        momentum_[i] = g.contiguous().clone();
      } else {
        momentum_[i].mul_(options_.momentum).add_(g);
      }
      g = momentum_[i];
    }
    p.add_(g, -options_.lr);
  }
}

void SGD::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

}  // namespace ag::optim
