#include "optim/schedule.h"

#include <cmath>
#include <numbers>

namespace ag::optim {

namespace {
void check_base(const char* name, double base_lr) {
  check(std::isfinite(base_lr) && base_lr >= 0, "{}: base_lr must be finite and >= 0, got {}", name, base_lr);
}
void check_step(const char* name, int64_t step) { check(step >= 0, "{}: step must be >= 0, got {}", name, step); }
}  // namespace

ConstantLR::ConstantLR(double base_lr) : base_lr_(base_lr) { check_base("ConstantLR", base_lr); }

double ConstantLR::lr_at(int64_t step) const {
  check_step("ConstantLR", step);
  return base_lr_;
}

WarmupCosineLR::WarmupCosineLR(double base_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : base_lr_(base_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  check_base("WarmupCosineLR", base_lr);
  check(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr,
        "WarmupCosineLR: min_lr must be in [0, base_lr = {}], got {}", base_lr, min_lr);
  check(warmup_steps >= 0, "WarmupCosineLR: warmup_steps must be >= 0, got {}", warmup_steps);
  check(total_steps > warmup_steps, "WarmupCosineLR: total_steps ({}) must exceed warmup_steps ({})", total_steps,
        warmup_steps);
}

double WarmupCosineLR::lr_at(int64_t step) const {
  check_step("WarmupCosineLR", step);
  if (step < warmup_steps_) return base_lr_ * double(step) / double(warmup_steps_);
  const double progress = std::min(1.0, double(step - warmup_steps_) / double(total_steps_ - warmup_steps_));
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

StepLR::StepLR(double base_lr, int64_t step_size, double gamma)
    : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {
  check_base("StepLR", base_lr);
  check(step_size > 0, "StepLR: step_size must be > 0, got {}", step_size);
  check(std::isfinite(gamma) && gamma >= 0, "StepLR: gamma must be finite and >= 0, got {}", gamma);
}

double StepLR::lr_at(int64_t step) const {
  check_step("StepLR", step);
  return base_lr_ * std::pow(gamma_, double(step / step_size_));
}

}  // namespace ag::optim
