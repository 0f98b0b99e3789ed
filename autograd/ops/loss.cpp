// Losses: mse_loss, binary_cross_entropy_with_logits. Math: the "losses" section of
// autograd/ops.h. Both are built from existing ops; binary_cross_entropy_with_logits records one
// node of its own so that its gradient is the short, exact (sigmoid(x) - t) g.
#include <string_view>

#include "autograd/ops.h"

namespace ag {

namespace {

void check_pair(const char* op, const Tensor& input, const char* input_name, const Tensor& target) {
  check(input.shape() == target.shape(), "{}: {} shape {} and target shape {} differ", op, input_name,
        input.shape(), target.shape());
  check(is_floating(input.dtype()) && input.dtype() == target.dtype(),
        "{}: expected {} and target of one floating dtype, got {} and {}", op, input_name, input.dtype(),
        target.dtype());
  check(input.device() == target.device(), "{}: {} is on {} but target is on {}", op, input_name, input.device(),
        target.device());
}

void check_reduction(const char* op, std::string_view reduction) {
  check(reduction == "mean" || reduction == "sum" || reduction == "none",
        "{}: reduction must be 'mean', 'sum' or 'none', got '{}'", op, reduction);
}

Tensor reduce(const Tensor& l, std::string_view reduction) {
  if (reduction == "mean") return mean(l);
  if (reduction == "sum") return sum(l);
  return l;
}

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, const char* reduction, Site site) {
  const CallSite at("mse_loss", site);
  check_reduction("mse_loss", reduction);
  check_pair("mse_loss", input, "input", target);
  Tensor d = sub(input, target);
  return reduce(mul(d, d), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& t, const char* reduction, Site site) {
  const CallSite at("binary_cross_entropy_with_logits", site);
  const char* op = "binary_cross_entropy_with_logits";
  check_reduction(op, reduction);
  check_pair(op, x, "logits", t);
  Tensor l;
  {
    NoGradGuard no_grad;  // the forward's intermediates need no history: the node below has the gradient
    Tensor softplus_neg_abs = log(add(exp(neg(abs(x))), 1.0));  // log(1 + e^-|x|)
    l = add(sub(relu(x), mul(x, t)), softplus_neg_abs);          // max(x, 0) - x t + log(1 + e^-|x|)
  }
  const bool need_dt = t.requires_grad();
  record(op, {x, t}, l, [x = x.detach(), t = t.detach(), need_dt](const Tensor& g) {
    // in the forward pass this was l = -t log s - (1 - t) log(1 - s), s = sigmoid(x);
    // ds/dx = s (1 - s), so dl/dx = -t (1 - s) + (1 - t) s = s - t, and dl/dt = log(1 - s) - log s = -x
    return std::vector{mul(sub(sigmoid(x), t), g), need_dt ? mul(neg(x), g) : Tensor()};
  });
  return reduce(l, reduction);
}

}  // namespace ag
