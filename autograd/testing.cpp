#include "autograd/testing.h"

#include <cmath>
#include <ostream>

#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/random.h"
#include "cuda/memory.h"

namespace ag::testing {

namespace {

// The multi-index of row-major element `flat` in `shape`.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape index = shape;
  for (int d = shape.size() - 1; d >= 0; --d) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return index;
}

}  // namespace

// ---- gradcheck ---------------------------------------------------------------------------------
GradcheckResult gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, Tolerances opt) {
  check(opt.eps > 0, "gradcheck: eps must be > 0, got {}", opt.eps);
  // Fresh dense f64 leaves we can perturb in place: the caller's tensors and .grad stay as they are.
  std::vector<Tensor> xs;
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    check(t.defined(), "gradcheck: input {} is an undefined tensor", i);
    if (!t.requires_grad()) {
      xs.push_back(t);
      continue;
    }
    check(t.dtype() == DType::f64,
          "gradcheck: input {} (shape {}) requires grad but is {}: finite differences need f64 "
          "(pass x.to(DType::f64))", i, t.shape(), t.dtype());
    check(t.device().is_cpu(), "gradcheck: input {} (shape {}) is on {}: gradcheck runs on the cpu", i,
          t.shape(), t.device().str());
    xs.push_back(t.detach().clone().set_requires_grad(true));
    any = true;
  }
  check(any, "gradcheck: none of the {} inputs requires grad, so nothing would be checked "
             "(call set_requires_grad(true) on the inputs to check)", inputs.size());

  Tensor y0 = fn(xs);
  check(y0.defined(), "gradcheck: the function returned an undefined tensor");
  check(y0.dtype() == DType::f64, "gradcheck: the function must return f64, got {}", y0.dtype());
  check(y0.requires_grad(),
        "gradcheck: the function's output (shape {}) does not depend on any input that requires grad "
        "(computed under NoGradGuard, or from detached tensors?)", y0.shape());
  Generator gen(opt.seed);
  Tensor r = randn(y0.shape(), DType::f64, &gen);
  sum(mul(y0, r)).backward();

  auto loss = [&]() {
    NoGradGuard no_grad;
    return sum(mul(fn(xs), r)).item<double>();
  };
  GradcheckResult res;
  double worst = -1;  // of (err - tol) while failing, of err while passing
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].requires_grad()) continue;
    Tensor analytic = xs[i].grad();  // undefined when no gradient reached this input: all zero
    std::vector<double> a = analytic.defined() ? analytic.to_vector<double>()
                                               : std::vector<double>(size_t(xs[i].numel()), 0.0);
    double* x = xs[i].data<double>();  // a fresh clone: contiguous, row-major
    for (int64_t j = 0; j < xs[i].numel(); ++j) {
      const double orig = x[j];
      x[j] = orig + opt.eps;
      const double lp = loss();
      x[j] = orig - opt.eps;
      const double lm = loss();
      x[j] = orig;
      const double numeric = (lp - lm) / (2 * opt.eps);
      const double err = std::abs(a[j] - numeric), tol = opt.atol + opt.rtol * std::abs(numeric);
      const bool bad = !(err <= tol);  // also catches NaN
      ++res.checked;
      res.max_abs_err = std::max(res.max_abs_err, err);
      if (numeric != 0) res.max_rel_err = std::max(res.max_rel_err, err / std::abs(numeric));
      if (std::isnan(err)) res.max_abs_err = res.max_rel_err = err;
      if (bad) ++res.failed;
      // While everything passes, track the largest error; the first failure resets the search
      // to the element furthest beyond its tolerance.
      const double score = bad ? (std::isnan(err) ? INFINITY : err - tol) : err;
      const bool take = bad ? (res.passed || score > worst) : (res.passed && score > worst);
      if (take) {
        res.passed = res.passed && !bad;
        worst = score;
        res.input = int(i);
        res.element = j;
        res.analytic = a[j];
        res.numeric = numeric;
      }
    }
  }
  if (res.input >= 0) res.index = unravel(res.element, xs[size_t(res.input)].shape());
  if (res.passed) {
    res.message = fmt::format("gradcheck passed: {} elements, max |analytic - numeric| {:.3g} "
                              "(atol {}, rtol {}, eps {})", res.checked, res.max_abs_err, opt.atol, opt.rtol, opt.eps);
  } else {
    const Tensor& x = xs[size_t(res.input)];
    const double err = std::abs(res.analytic - res.numeric), tol = opt.atol + opt.rtol * std::abs(res.numeric);
    res.message = fmt::format(
        "gradcheck failed: input {} (shape {}) element {} (index {}): analytic {:.10g} vs numeric {:.10g} "
        "(|diff| {:.3g} > tol {:.3g}); {} of {} elements fail (atol {}, rtol {}, eps {})",
        res.input, x.shape(), res.element, res.index, res.analytic, res.numeric, err, tol, res.failed,
        res.checked, opt.atol, opt.rtol, opt.eps);
  }
  return res;
}

void assert_gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, Tolerances tolerances) {
  GradcheckResult r = testing::gradcheck(fn, inputs, tolerances);  // qualified: ADL also finds ag::gradcheck
  if (!r.passed) throw Error(r.message);
}

std::ostream& operator<<(std::ostream& os, const GradcheckResult& r) { return os << r.message; }

// ---- compare_devices ---------------------------------------------------------------------------
namespace {

// Compares `got` (any device) with `want` (cpu) elementwise and folds the worst value into `res`.
// Returns false on a shape or dtype mismatch, with the message set.
bool compare_into(CompareResult& res, double& worst, const std::string& where, const Tensor& want,
                  const Tensor& got, const CompareOptions& opt) {
  if (want.shape() != got.shape() || want.dtype() != got.dtype()) {
    res.passed = false;
    res.where = where;
    res.message = fmt::format("compare_devices: {}: cpu gives shape {} {}, {} gives shape {} {}", where,
                              want.shape(), want.dtype(), opt.device.str(), got.shape(), got.dtype());
    return false;
  }
  const std::vector<double> w = want.to_vector<double>(), g = got.to_vector<double>();
  for (size_t k = 0; k < w.size(); ++k) {
    const bool same = (w[k] == g[k]) || (std::isnan(w[k]) && std::isnan(g[k]));  // also equal infinities
    const double err = same ? 0.0 : std::abs(g[k] - w[k]), tol = opt.atol + opt.rtol * std::abs(w[k]);
    const bool bad = !same && !(err <= tol);
    const double score = bad ? (std::isnan(err) ? INFINITY : 1.0 + err - tol) : -1.0 / (1.0 + err);
    if (!same && !std::isnan(err)) res.max_abs_err = std::max(res.max_abs_err, err);
    if (bad) res.passed = false;
    if (score > worst) {
      worst = score;
      res.where = where;
      res.element = int64_t(k);
      res.index = unravel(int64_t(k), want.shape());
      res.cpu_value = w[k];
      res.device_value = g[k];
    }
  }
  return true;
}

// The inputs as fresh tensors on `device`, requiring grad where the originals do.
std::vector<Tensor> copies_on(const std::vector<Tensor>& inputs, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor c = t.detach().to(device).detach();  // a new leaf even when no copy was needed
    if (t.requires_grad()) c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

}  // namespace

CompareResult compare_devices(const Fn& fn, const std::vector<Tensor>& inputs, CompareOptions opt) {
  CompareResult res;
  for (size_t i = 0; i < inputs.size(); ++i)
    check(inputs[i].defined(), "compare_devices: input {} is an undefined tensor", i);
  const std::string dev = opt.device.str();
  if (opt.device.is_cuda() && opt.device.index >= cuda::device_count()) {
    res.skipped = true;
    res.message = ATTOGRAD_WITH_CUDA
                      ? fmt::format("skipped: no CUDA device ({} not visible, {} GPU(s) found)", dev, cuda::device_count())
                      : fmt::format("skipped: no CUDA device (this build of attograd has no CUDA backend)");
    return res;
  }
  std::vector<Tensor> on_cpu = copies_on(inputs, Device::cpu()), on_dev;
  try {
    on_dev = copies_on(inputs, opt.device);
  } catch (const Error& e) {  // the device is listed but cannot take a tensor
    res.skipped = true;
    res.message = fmt::format("skipped: no CUDA device ({})", e.what());
    return res;
  }

  Tensor y_cpu = fn(on_cpu), y_dev;
  check(y_cpu.defined(), "compare_devices: the function returned an undefined tensor");
  try {
    y_dev = fn(on_dev);
  } catch (const Error& e) {
    res.message = fmt::format("compare_devices: on {} the function raised: {}", dev, e.what());
    return res;
  }
  check(y_dev.defined(), "compare_devices: the function returned an undefined tensor on {}", dev);

  res.passed = true;
  double worst = -INFINITY;
  if (!compare_into(res, worst, "output", y_cpu, y_dev.detach().cpu(), opt)) return res;

  // The same gradient r of the output through both graphs, then each input's gradient.
  if (y_cpu.requires_grad() && is_floating(y_cpu.dtype())) {
    Generator gen(opt.seed);
    Tensor r = randn(y_cpu.shape(), y_cpu.dtype(), &gen);
    y_cpu.backward(r);
    try {
      check(y_dev.requires_grad(), "the output on {} has no gradient history", dev);
      y_dev.backward(r.to(opt.device));
    } catch (const Error& e) {
      res.passed = false;
      res.message = fmt::format("compare_devices: backward on {} raised: {}", dev, e.what());
      return res;
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].requires_grad()) continue;
      Tensor gc = on_cpu[i].grad(), gd = on_dev[i].grad();
      if (!gc.defined()) gc = zeros_like(on_cpu[i]);  // no gradient reached it: zero
      gd = gd.defined() ? gd.cpu() : zeros_like(on_cpu[i]);
      if (!compare_into(res, worst, fmt::format("grad of input {}", i), gc, gd, opt)) return res;
    }
  }

  if (res.passed) {
    res.message = fmt::format("compare_devices passed: cpu and {} agree, max |diff| {:.3g} (atol {}, rtol {})",
                              dev, res.max_abs_err, opt.atol, opt.rtol);
  } else {
    const double err = std::abs(res.device_value - res.cpu_value), tol = opt.atol + opt.rtol * std::abs(res.cpu_value);
    res.message = fmt::format(
        "compare_devices failed: {} element {} (index {}): cpu {:.10g} vs {} {:.10g} (|diff| {:.3g} > tol {:.3g})",
        res.where, res.element, res.index, res.cpu_value, dev, res.device_value, err, tol);
  }
  return res;
}

std::ostream& operator<<(std::ostream& os, const CompareResult& r) { return os << r.message; }

}  // namespace ag::testing
