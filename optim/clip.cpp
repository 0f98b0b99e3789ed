#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/tape.h"
#include "core/dispatch.h"

namespace ag::optim {

namespace {
// The gradient of p, made contiguous in place of a non-contiguous one; undefined when none.
Tensor contiguous_grad(const Tensor& p) {
  Tensor g = p.grad();
  if (g.defined() && !g.is_contiguous()) {
    g = g.contiguous();
    Tensor(p).set_grad(g);
  }
  return g;
}
}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  check(std::isfinite(max_norm) && max_norm >= 0, "clip_grad_norm: max_norm must be finite and >= 0, got {}",
        max_norm);
  check(norm_type > 0 && !std::isnan(norm_type), "clip_grad_norm: norm_type must be > 0 (or inf), got {}", norm_type);
  NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    check(p.defined(), "clip_grad_norm: undefined parameter tensor");
    if (Tensor g = contiguous_grad(p); g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return 0.0;
  // One partial per gradient, written by its kernel into a buffer on the gradient's device: on a
  // GPU all the partials come back in one copy after the last kernel, not one round trip each.
  std::vector<double> parts(grads.size());
  std::vector<Device> devices;  // those of the gradients, in order of first appearance
  for (const Tensor& g : grads)
    if (std::find(devices.begin(), devices.end(), g.device()) == devices.end()) devices.push_back(g.device());
  for (const Device& dev : devices) {
    Tensor out = empty({int64_t(grads.size())}, DType::f64, dev);
    for (size_t i = 0; i < grads.size(); ++i) {
      const Tensor& g = grads[i];
      if (g.device() != dev) continue;
      visit_floating("clip_grad_norm", g.dtype(), [&]<class T>() {
        KERNEL(g.device(), grad_norm_partial, out.data<double>() + i, g.data<T>(), g.numel(), norm_type);
      });
    }
    const std::vector<double> got = out.to_vector<double>();
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].device() == dev) parts[i] = got[i];
  }
  double acc = 0;  // sum |g|^p, or max |g|, over the gradients in order
  for (const double part : parts) {
    if (std::isnan(part) || std::isnan(acc))
      acc = std::numeric_limits<double>::quiet_NaN();
    else
      acc = inf ? std::max(acc, part) : acc + part;
  }
  const double norm = inf ? acc : std::pow(acc, 1.0 / norm_type);
  check(!error_if_nonfinite || std::isfinite(norm),
        "clip_grad_norm: the total norm of order {} of the gradients is {}, so they cannot be clipped "
        "(pass error_if_nonfinite = false to clip anyway)",
        norm_type, norm);
  const double clip_coef = max_norm / (norm + 1e-6);
  if (!(clip_coef >= 1.0))  // PyTorch clamps the coefficient to 1 (and a NaN stays NaN)
    for (Tensor& g : grads) g.mul_(clip_coef);
  return norm;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  check(std::isfinite(clip_value) && clip_value >= 0, "clip_grad_value: clip_value must be finite and >= 0, got {}",
        clip_value);
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    check(p.defined(), "clip_grad_value: undefined parameter tensor");
    Tensor g = contiguous_grad(p);
    if (!g.defined()) continue;
    visit_floating("clip_grad_value", g.dtype(), [&]<class T>() {
      KERNEL(g.device(), clip_value, g.data<T>(), g.numel(), clip_value);
    });
    g.impl().storage->version++;
  }
}

}  // namespace ag::optim
