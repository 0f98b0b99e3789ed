#pragma once
// The base of every optimizer: the parameter list, the learning rate, zero_grad(), per-parameter
// state and its checkpoint form. A subclass (optim/sgd.h, optim/adam.h) names its state tensors,
// lists its hyper-parameters and writes step() as one multi-tensor kernel call per group of
// parameters that share a device and dtype (group_by_device_and_dtype; core/kernels/optim.h).
//
// Checkpoint form (state_dict / load_state_dict), PyTorch's optimizer.state_dict() flattened:
//   "state.<i>.<field>"        per-parameter state of parameter i (in the order given to the
//                              constructor), e.g. "state.3.exp_avg", "state.3.step"; present only
//                              for parameters that were updated at least once
//   "param_groups.0.<name>"    hyper-parameters as 0-dim f64 tensors, e.g. "param_groups.0.lr",
//                              "param_groups.0.betas.0"
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ag::optim {

using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The indices of the defined tensors of `ts`, grouped by device and dtype: one group per pair, in
// the order of first appearance, indices increasing within a group. What a multi-tensor kernel
// takes in one call (optimizers, clip_grad_norm, GradScaler).
std::vector<std::vector<size_t>> group_by_device_and_dtype(const std::vector<Tensor>& ts);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (the others are skipped, their state
  // untouched). Runs under NoGradGuard, in place.
  virtual void step() = 0;
  // Drops every gradient (PyTorch's set_to_none), so the next backward writes fresh ones.
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr);  // what an LR schedule calls (optim/schedule.h)
  const std::vector<Tensor>& params() const { return params_; }

  // The state tensors share storage with the live state, as PyTorch's do: save them (or clone
  // them) before the next step() changes them. Hyper-parameters are fresh 0-dim tensors.
  StateDict state_dict() const;
  // Replaces the state and hyper-parameters with copies of those in `dict`. Every name must be
  // known, every state tensor must have its parameter's shape and dtype (steps: 0-dim), each
  // parameter's state is all there or all absent, and all hyper-parameters must be present and
  // valid; otherwise ag::Error, and nothing is changed.
  void load_state_dict(const StateDict& dict);

 protected:
  // A per-parameter state tensor: the parameter's shape, dtype and device, or, for a step count,
  // a 0-dim i64 tensor on the CPU.
  struct StateField {
    const char* name;
    bool is_step;
  };
  Optimizer(const char* name, std::vector<Tensor> params, double lr, std::vector<StateField> fields);

  // The state of parameter i, one tensor per field in order; empty until init_state(i).
  std::vector<Tensor>& state(size_t i) { return state_[i]; }
  bool has_state(size_t i) const { return !state_[i].empty(); }
  // Zero state tensors for parameter i (steps at 0).
  std::vector<Tensor>& init_state(size_t i);
  // The gradient of parameter i as a contiguous tensor, or undefined when it has none.
  Tensor contiguous_grad(size_t i) const;
  // The step count of parameter i after adding one (its field `k` is a step count).
  int64_t next_step(size_t i, size_t k);

  // Hyper-parameters other than lr, in a fixed order, and their inverse: set_hyper_parameters
  // receives the values in the same order and validates them (ag::Error naming the optimizer).
  virtual std::vector<std::pair<std::string, double>> hyper_parameters() const = 0;
  virtual void set_hyper_parameters(const std::vector<double>& values) = 0;

  const char* name_;  // "SGD", "Adam", "AdamW": starts every error message

 private:
  std::vector<Tensor> params_;
  double lr_;
  std::vector<StateField> fields_;
  std::vector<std::vector<Tensor>> state_;  // [param][field]
};

}  // namespace ag::optim
