// Reductions: sum, mean, max, var, argmax. The front brings the input into the [outer, R, inner]
// form the kernels take (core/kernels/reduce.h); math in autograd/ops.h.
#include <algorithm>

#include "autograd/ops.h"
#include "core/dispatch.h"

namespace ag {

namespace {

struct ReducePlan {
  std::vector<int> dims;  // sorted, unique, wrapped
  Shape keep_shape;       // output shape with keepdim
  Shape out_shape;        // output shape as asked
  int64_t count = 1;      // elements reduced per output
};

ReducePlan plan_reduce(const char* op, const Tensor& x, const std::vector<int>& dims_in, bool keepdim) {
  ReducePlan p;
  bool reduce[kMaxDims] = {};
  if (dims_in.empty()) {
    for (int i = 0; i < x.ndim(); ++i) reduce[i] = true;
  } else {
    for (int d : dims_in) {
      int w = wrap_dim(op, d, x.ndim());
      check(!reduce[w], "{}: dim {} appears twice in the reduced dims", op, d);
      reduce[w] = true;
    }
  }
  for (int i = 0; i < x.ndim(); ++i) {
    if (reduce[i]) {
      p.dims.push_back(i);
      p.count *= x.shape()[i];
      p.keep_shape.push_back(1);
      if (keepdim) p.out_shape.push_back(1);
    } else {
      p.keep_shape.push_back(x.shape()[i]);
      p.out_shape.push_back(x.shape()[i]);
    }
  }
  return p;
}

// Brings x into [outer, R, inner] contiguous form for the reduced dims of p.
struct Canonical {
  Tensor x;
  int64_t outer, R, inner;
};
Canonical canonicalize(const Tensor& x, const ReducePlan& p) {
  const int nd = x.ndim();
  bool run = !p.dims.empty() && p.dims.back() - p.dims.front() + 1 == int(p.dims.size());
  if (x.is_contiguous() && (run || p.dims.empty())) {
    int a = p.dims.empty() ? nd : p.dims.front(), b = p.dims.empty() ? nd - 1 : p.dims.back();
    int64_t outer = 1, R = 1, inner = 1;
    for (int i = 0; i < a; ++i) outer *= x.shape()[i];
    for (int i = a; i <= b; ++i) R *= x.shape()[i];
    for (int i = b + 1; i < nd; ++i) inner *= x.shape()[i];
    return {x, outer, R, inner};
  }
  // kept dims first, reduced last, then a dense copy: [outer, R, 1]
  Shape perm;
  int64_t outer = 1;
  for (int i = 0; i < nd; ++i)
    if (std::find(p.dims.begin(), p.dims.end(), i) == p.dims.end()) perm.push_back(i), outer *= x.shape()[i];
  for (int d : p.dims) perm.push_back(d);
  Tensor xc;
  {
    NoGradGuard no_grad;
    xc = x.detach().permute(perm).contiguous();
  }
  return {xc, outer, p.count, 1};
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim, Site site) {
  const CallSite at("sum", site);
  if (x.dtype() == DType::b8) return sum(x.to(DType::i64), dims, keepdim);  // counts, as PyTorch
  ReducePlan p = plan_reduce("sum", x, dims, keepdim);
  Canonical c = canonicalize(x, p);
  Tensor y = empty(p.out_shape, x.dtype(), x.device());
  visit_numeric("sum", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), sum_forward<T>, y.data<T>(), c.x.data<T>(), c.outer, c.R, c.inner);
  });
  record("sum", {x}, y, [keep = p.keep_shape, in = x.shape()](const Tensor& g) {
    return std::vector{g.reshape(keep).expand(in)};
  });
  return y;
}

Tensor mean(const Tensor& x, const std::vector<int>& dims, bool keepdim, Site site) {
  const CallSite at("mean", site);
  check(is_floating(x.dtype()), "mean: expected a floating dtype, got {}", x.dtype());
  ReducePlan p = plan_reduce("mean", x, dims, keepdim);
  return div(sum(x, dims, keepdim), double(p.count));
}

Tensor max(const Tensor& x, const std::vector<int>& dims, bool keepdim, Site site) {
  const CallSite at("max", site);
  ReducePlan p = plan_reduce("max", x, dims, keepdim);
  check(p.count > 0, "max: reduction over an empty dim (input shape {})", x.shape());
  Canonical c = canonicalize(x, p);
  Tensor y = empty(p.out_shape, x.dtype(), x.device());
  visit_numeric("max", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), max_forward<T>, y.data<T>(), c.x.data<T>(), c.outer, c.R, c.inner);
  });
  // dx = g / k at the k positions equal to the max (ties share), 0 elsewhere
  record("max", {x}, y, [x = x.detach(), y = y.detach(), keep = p.keep_shape, dims = p.dims](const Tensor& g) {
    Tensor hit = eq(x, y.reshape(keep));
    Tensor k = sum(hit.to(g.dtype()), std::vector<int>(dims.begin(), dims.end()), true);
    return std::vector{where(hit, div(g.reshape(keep), k), zeros({}, g.dtype(), g.device()))};
  });
  return y;
}

Tensor var(const Tensor& x, const std::vector<int>& dims, int64_t correction, bool keepdim, Site site) {
  const CallSite at("var", site);
  check(is_floating(x.dtype()), "var: expected a floating dtype, got {}", x.dtype());
  ReducePlan p = plan_reduce("var", x, dims, keepdim);
  const double denom = double(p.count - correction);
  Tensor y, centered;
  {
    NoGradGuard no_grad;  // forward composed of ops; one node with the closed-form backward below
    Tensor xd = x.detach();
    centered = sub(xd, mean(xd, p.dims, true));
    y = div(sum(mul(centered, centered), p.dims, keepdim), std::max(denom, 0.0));
  }
  // dx = g * 2 (x - mean) / (N - c)
  record("var", {x}, y, [centered, keep = p.keep_shape, denom](const Tensor& g) {
    return std::vector{mul(centered, mul(g.reshape(keep), 2.0 / denom))};
  });
  return y;
}

Tensor argmax(const Tensor& x, int dim, bool keepdim, Site site) {
  const CallSite at("argmax", site);
  int d = wrap_dim("argmax", dim, x.ndim());
  ReducePlan p = plan_reduce("argmax", x, {d}, keepdim);
  check(p.count > 0, "argmax: reduction over an empty dim (input shape {})", x.shape());
  Canonical c = canonicalize(x, p);
  Tensor y = empty(p.out_shape, DType::i64, x.device());
  visit_numeric("argmax", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), argmax_forward<T>, y.data<int64_t>(), c.x.data<T>(), c.outer, c.R, c.inner);
  });
  return y;
}

}  // namespace ag
