#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/ops.h"

namespace ag {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs_in, GradcheckOptions opt) {
  // Dense f64 copies we can perturb in place.
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs_in) {
    if (!t.requires_grad()) {
      xs.push_back(t);
      continue;
    }
    check(t.dtype() == DType::f64, "gradcheck: inputs that require grad must be f64, got {}", t.dtype());
    xs.push_back(t.detach().clone().set_requires_grad(true));
  }
  Tensor y0 = f(xs);
  check(y0.dtype() == DType::f64, "gradcheck: the function must return f64, got {}", y0.dtype());
  Generator gen(opt.seed);
  Tensor r = randn(y0.shape(), DType::f64, &gen);
  sum(mul(y0, r)).backward();

  auto loss = [&]() {
    NoGradGuard no_grad;
    return sum(mul(f(xs), r)).item<double>();
  };
  GradcheckResult res;
  double worst_excess = -1;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].requires_grad()) continue;
    Tensor analytic = xs[i].grad();
    std::vector<double> a = analytic.defined() ? analytic.to_vector<double>()
                                               : std::vector<double>(size_t(xs[i].numel()), 0.0);
    double* x = xs[i].data<double>();
    for (int64_t j = 0; j < xs[i].numel(); ++j) {
      const double orig = x[j];
      x[j] = orig + opt.eps;
      double lp = loss();
      x[j] = orig - opt.eps;
      double lm = loss();
      x[j] = orig;
      double numeric = (lp - lm) / (2 * opt.eps);
      double err = std::abs(a[j] - numeric), tol = opt.atol + opt.rtol * std::abs(numeric);
      res.max_abs_err = std::max(res.max_abs_err, err);
      bool bad = !(err <= tol);  // also catches NaN
      if (bad) res.ok = false;
      if (bad && err - tol > worst_excess) {
        worst_excess = err - tol;
        res.message = fmt::format("input {} (shape {}) element {}: analytic {:.10g} vs numeric {:.10g} (|diff| {:.3g} > tol {:.3g})",
                                  i, xs[i].shape(), j, a[j], numeric, err, tol);
      }
    }
  }
  return res;
}

}  // namespace ag
