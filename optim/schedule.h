#pragma once
// Learning-rate schedules: lr as a pure function of the step number (0 at the first update),
// usable with any optimizer. Call sched.set_lr(opt, step) before opt.step() at each step; it sets
// opt.set_lr(sched.lr_at(step)). Nothing is stored between calls, so a resumed run only needs
// its step number.
#include <cstdint>

#include "optim/optimizer.h"

namespace ag::optim {

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual double lr_at(int64_t step) const = 0;
  void set_lr(Optimizer& opt, int64_t step) const { opt.set_lr(lr_at(step)); }
};

// lr = base_lr at every step.
class ConstantLR : public Schedule {
 public:
  explicit ConstantLR(double base_lr);
  double lr_at(int64_t step) const override;

 private:
  double base_lr_;
};

// Linear warmup, then cosine decay to min_lr at total_steps (min_lr after it):
//   lr = base_lr * step / warmup_steps                                       step < warmup_steps
//   lr = min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * progress)),      otherwise, with
//   progress = min(1, (step - warmup_steps) / (total_steps - warmup_steps))
// (the schedule of GPT-2/3 and llm.c; warmup_steps = 0 gives plain cosine annealing, PyTorch's
// CosineAnnealingLR with T_max = total_steps and eta_min = min_lr).
class WarmupCosineLR : public Schedule {
 public:
  WarmupCosineLR(double base_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);
  double lr_at(int64_t step) const override;

 private:
  double base_lr_, min_lr_;
  int64_t warmup_steps_, total_steps_;
};

// Step decay, PyTorch's StepLR: lr = base_lr * gamma^floor(step / step_size).
class StepLR : public Schedule {
 public:
  StepLR(double base_lr, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  double base_lr_;
  int64_t step_size_;
  double gamma_;
};

}  // namespace ag::optim
