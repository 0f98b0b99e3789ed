#include "optim/sgd.h"

#include <cmath>

#include "autograd/tape.h"
#include "core/dispatch.h"

namespace ag::optim {

namespace {
void check_options(const SGD::Options& o) {
  check(std::isfinite(o.momentum) && o.momentum >= 0, "SGD: momentum must be finite and >= 0, got {}", o.momentum);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "SGD: weight_decay must be finite and >= 0, got {}",
        o.weight_decay);
  check(std::isfinite(o.dampening), "SGD: dampening must be finite, got {}", o.dampening);
  check(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
        "SGD: nesterov momentum requires a momentum > 0 and zero dampening, got momentum {} and dampening {}",
        o.momentum, o.dampening);
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, Options options)
    : Optimizer("SGD", std::move(params), options.lr, {{"momentum_buffer", false}}), options_(options) {
  check_options(options);
}

SGD::Options SGD::options() const {
  Options o = options_;
  o.lr = lr();
  return o;
}

void SGD::step() {
  NoGradGuard no_grad;
  const Options& o = options_;
  std::vector<Tensor> grads(params().size()), with_grad(params().size());
  for (size_t i = 0; i < params().size(); ++i)
    if ((grads[i] = contiguous_grad(i)).defined()) with_grad[i] = params()[i];
  for (const std::vector<size_t>& group : group_by_device_and_dtype(with_grad)) {
    const Tensor& p0 = params()[group[0]];
    visit_floating("SGD", p0.dtype(), [&]<class T>() {
      std::vector<SgdTensor<T>> ts;
      for (size_t i : group) {
        const Tensor& p = params()[i];
        bool first = false;
        T* buf = nullptr;
        if (o.momentum != 0) {
          first = !has_state(i);
          buf = (first ? init_state(i) : state(i))[0].data<T>();
        }
        ts.push_back({p.data<T>(), buf, grads[i].data<T>(), p.numel(), first});
      }
      KERNEL(p0.device(), sgd_update, ts.data(), int64_t(ts.size()), lr(), o.momentum, o.dampening, o.weight_decay,
             o.nesterov);
    });
    for (size_t i : group) mark_modified(params()[i]);
  }
}

std::vector<std::pair<std::string, double>> SGD::hyper_parameters() const {
  return {{"momentum", options_.momentum},
          {"dampening", options_.dampening},
          {"weight_decay", options_.weight_decay},
          {"nesterov", options_.nesterov ? 1.0 : 0.0}};
}

void SGD::set_hyper_parameters(const std::vector<double>& v) {
  check(v[3] == 0 || v[3] == 1, "SGD: nesterov must be 0 or 1, got {}", v[3]);
  Options o{.lr = lr(), .momentum = v[0], .weight_decay = v[2], .dampening = v[1], .nesterov = v[3] == 1};
  check_options(o);
  options_ = o;
}

}  // namespace ag::optim
