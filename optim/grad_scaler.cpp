#include "optim/grad_scaler.h"

#include <cmath>
#include <limits>

#include "autograd/ops.h"
#include "autograd/tape.h"
#include "optim/clip.h"

namespace ag::optim {

GradScaler::GradScaler(Options options) : o_(options), scale_(options.init_scale) {
  check(std::isfinite(o_.init_scale) && o_.init_scale > 0, "GradScaler: init_scale must be finite and > 0, got {}",
        o_.init_scale);
  check(std::isfinite(o_.growth_factor) && o_.growth_factor > 1, "GradScaler: growth_factor must be > 1, got {}",
        o_.growth_factor);
  check(o_.backoff_factor > 0 && o_.backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got {}",
        o_.backoff_factor);
  check(o_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got {}", o_.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const { return mul(loss, scale_); }

void GradScaler::unscale(const std::vector<Tensor>& params) const { scale_grads(params, 1.0 / scale_); }

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= o_.backoff_factor;
    tracker_ = 0;
  } else if (++tracker_ >= o_.growth_interval) {
    // a scale that would overflow f32 is not taken: S stays finite
    if (std::isfinite(scale_ * o_.growth_factor)) scale_ *= o_.growth_factor;
    tracker_ = 0;
  }
}

bool GradScaler::step(Optimizer& opt) {
  unscale(opt.params());
  // the global norm, nothing clipped (no finite norm exceeds the largest double): finite iff every
  // gradient element is
  const double norm = clip_grad_norm(opt.params(), std::numeric_limits<double>::max());
  const bool found_inf = !std::isfinite(norm);
  if (found_inf)
    opt.zero_grad();
  else
    opt.step();
  update(found_inf);
  return !found_inf;
}

void GradScaler::load_state(double scale, int64_t tracker) {
  check(std::isfinite(scale) && scale > 0, "GradScaler: a loaded scale must be finite and > 0, got {}", scale);
  check(tracker >= 0, "GradScaler: a loaded growth tracker must be >= 0, got {}", tracker);
  scale_ = scale, tracker_ = tracker;
}

}  // namespace ag::optim
