#include "optim/adam.h"

#include <cmath>

#include "autograd/tape.h"
#include "core/dispatch.h"

namespace ag::optim {

namespace {
void check_options(const char* name, const Adam::Options& o) {
  check(std::isfinite(o.eps) && o.eps >= 0, "{}: eps must be finite and >= 0, got {}", name, o.eps);
  check(o.beta1 >= 0 && o.beta1 < 1, "{}: beta1 must be in [0, 1), got {}", name, o.beta1);
  check(o.beta2 >= 0 && o.beta2 < 1, "{}: beta2 must be in [0, 1), got {}", name, o.beta2);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "{}: weight_decay must be finite and >= 0, got {}",
        name, o.weight_decay);
}
}  // namespace

Adam::Adam(const char* name, std::vector<Tensor> params, Options options, bool decoupled)
    : Optimizer(name, std::move(params), options.lr, {{"step", true}, {"exp_avg", false}, {"exp_avg_sq", false}}),
      options_(options),
      decoupled_(decoupled) {
  check_options(name, options);
}

Adam::Options Adam::options() const {
  Options o = options_;
  o.lr = lr();
  return o;
}

void Adam::step() {
  NoGradGuard no_grad;
  const Options& o = options_;
  std::vector<Tensor> grads(params().size()), with_grad(params().size());
  for (size_t i = 0; i < params().size(); ++i)
    if ((grads[i] = contiguous_grad(i)).defined()) with_grad[i] = params()[i];
  for (const std::vector<size_t>& group : group_by_device_and_dtype(with_grad)) {
    const Tensor& p0 = params()[group[0]];
    visit_floating(name_, p0.dtype(), [&]<class T>() {
      std::vector<AdamTensor<T>> ts;
      for (size_t i : group) {
        const Tensor& p = params()[i];
        std::vector<Tensor>& s = has_state(i) ? state(i) : init_state(i);
        ts.push_back({p.data<T>(), s[1].data<T>(), s[2].data<T>(), grads[i].data<T>(), p.numel(), next_step(i, 0)});
      }
      KERNEL(p0.device(), adam_update, ts.data(), int64_t(ts.size()), lr(), o.beta1, o.beta2, o.eps, o.weight_decay,
             decoupled_);
    });
    for (size_t i : group) mark_modified(params()[i]);
  }
}

std::vector<std::pair<std::string, double>> Adam::hyper_parameters() const {
  return {{"betas.0", options_.beta1}, {"betas.1", options_.beta2}, {"eps", options_.eps},
          {"weight_decay", options_.weight_decay}};
}

void Adam::set_hyper_parameters(const std::vector<double>& v) {
  Options o{.lr = lr(), .beta1 = v[0], .beta2 = v[1], .eps = v[2], .weight_decay = v[3]};
  check_options(name_, o);
  options_ = o;
}

}  // namespace ag::optim
