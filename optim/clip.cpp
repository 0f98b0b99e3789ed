#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/tape.h"
#include "core/dispatch.h"
#include "optim/optimizer.h"

namespace ag::optim {

namespace {
// The gradient of p, made contiguous in place of a non-contiguous one; undefined when none.
Tensor contiguous_grad(const Tensor& p, const char* op) {
  check(p.defined(), "{}: undefined parameter tensor", op);
  Tensor g = p.grad();
  if (g.defined() && !g.is_contiguous()) {
    g = g.contiguous();
    Tensor(p).set_grad(g);
  }
  return g;
}

std::vector<Tensor> contiguous_grads(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (Tensor g = contiguous_grad(p, op); g.defined()) grads.push_back(g);
  return grads;
}

// fn(device, xs) once per device and dtype of the gradients, xs the TensorSpan<T> list of the
// group's gradients (one multi-tensor kernel call); the gradients of a group are in `group`.
template <class F>
void for_each_group(const char* op, const std::vector<Tensor>& grads, F&& fn) {
  for (const std::vector<size_t>& group : group_by_device_and_dtype(grads)) {
    const Tensor& g0 = grads[group[0]];
    visit_floating(op, g0.dtype(), [&]<class T>() {
      std::vector<TensorSpan<T>> xs;
      for (size_t i : group) xs.push_back({grads[i].data<T>(), grads[i].numel()});
      fn(g0.device(), group, xs);
    });
  }
}

void scale_all(const std::vector<Tensor>& grads, double factor, const char* op) {
  for_each_group(op, grads, [&](Device dev, const std::vector<size_t>& group, auto& xs) {
    KERNEL(dev, scale_inplace, xs.data(), int64_t(xs.size()), factor);
    for (size_t i : group) mark_modified(grads[i]);
  });
}
}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  check(std::isfinite(max_norm) && max_norm >= 0, "clip_grad_norm: max_norm must be finite and >= 0, got {}",
        max_norm);
  check(norm_type > 0 && !std::isnan(norm_type), "clip_grad_norm: norm_type must be > 0 (or inf), got {}", norm_type);
  NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  const std::vector<Tensor> grads = contiguous_grads(params, "clip_grad_norm");
  if (grads.empty()) return 0.0;
  // One partial per gradient, written by one multi-tensor kernel per device and dtype into a
  // buffer on that device: on a GPU they come back in one copy per device after the last kernel,
  // not one round trip per tensor.
  std::vector<double> parts(grads.size());
  for_each_group("clip_grad_norm", grads, [&](Device dev, const std::vector<size_t>& group, auto& xs) {
    Tensor out = empty({int64_t(xs.size())}, DType::f64, dev);
    KERNEL(dev, grad_norm_partial, out.data<double>(), xs.data(), int64_t(xs.size()), norm_type);
    const std::vector<double> got = out.to_vector<double>();
    for (size_t j = 0; j < group.size(); ++j) parts[group[j]] = got[j];
  });
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
    scale_all(grads, clip_coef, "clip_grad_norm");
  return norm;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  check(std::isfinite(clip_value) && clip_value >= 0, "clip_grad_value: clip_value must be finite and >= 0, got {}",
        clip_value);
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = contiguous_grads(params, "clip_grad_value");
  for_each_group("clip_grad_value", grads, [&](Device dev, const std::vector<size_t>& group, auto& xs) {
    KERNEL(dev, clip_value, xs.data(), int64_t(xs.size()), clip_value);
    for (size_t i : group) mark_modified(grads[i]);
  });
}

void scale_grads(const std::vector<Tensor>& params, double factor) {
  check(std::isfinite(factor), "scale_grads: factor must be finite, got {}", factor);
  NoGradGuard no_grad;
  scale_all(contiguous_grads(params, "scale_grads"), factor, "scale_grads");
}

}  // namespace ag::optim
