#pragma once
// Dynamic loss scaling for fp16 autocast, as torch.cuda.amp.GradScaler.
//
// Why. Under fp16 autocast (autograd/autocast.h) the backward GEMMs read the incoming gradient
// rounded to IEEE half, whose smallest subnormal is 2^-24 ~ 6e-8: the small gradients of a
// typical loss (1e-8 and below) become 0. Scaling the loss by S scales every gradient by S (the
// chain rule is linear in the output gradient), lifting them into half's range; dividing the
// parameter gradients by S before the step undoes it exactly (S is a power of two). Too large an S
// overflows instead (past 65504: inf), so S is adjusted as training goes:
//   a step whose unscaled gradients hold an inf or NaN:  skipped,  S <- S * backoff_factor
//   growth_interval finite steps in a row:               S <- S * growth_factor
// bf16 needs none of this (f32's range); with fp32 or bf16 the apps never scale.
//
//   optim::GradScaler scaler;
//   scaler.scale(loss).backward();      // dL/dw * S in every .grad
//   if (scaler.step(opt)) ...           // unscale, check, opt.step() or skip; then update S
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace ag::optim {

class GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, PyTorch's default
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };
  GradScaler() : GradScaler(Options{}) {}
  // ag::Error unless init_scale > 0 and finite, growth_factor > 1, 0 < backoff_factor < 1 and
  // growth_interval >= 1.
  explicit GradScaler(Options options);

  // loss * S (a differentiable op: backward starts from S instead of 1).
  Tensor scale(const Tensor& loss) const;
  // Every gradient of `params` divided by S, in place (exact: S is a power of two unless the
  // options made it otherwise). Parameters without a gradient are skipped.
  void unscale(const std::vector<Tensor>& params) const;
  // After an optimizer step (found_inf false) or a skipped one (true): the schedule above.
  void update(bool found_inf);
  // unscale, then opt.step() when every gradient is finite, else opt.zero_grad() (nothing
  // changes); then update(). Returns whether the optimizer stepped.
  bool step(Optimizer& opt);

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }  // finite steps in a row since S last changed
  // The state a checkpoint stores; ag::Error unless scale > 0 and finite, 0 <= tracker.
  void load_state(double scale, int64_t tracker);

 private:
  Options o_;
  double scale_;
  int64_t tracker_ = 0;
};

}  // namespace ag::optim
