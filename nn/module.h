#pragma once
// nn::Module: the thin base every layer derives from, for three things only:
//   1. named parameters, buffers and submodules, in registration order, with PyTorch's dotted
//      names ("blocks.0.attn.qkv.weight"), so a checkpoint maps one-to-one onto torch's state_dict;
//   2. train() / eval(), which layers such as Dropout read through is_training();
//   3. to(device), state_dict() and load_state_dict().
//
// A layer keeps its tensors as plain members and registers them once:
//
//   struct Linear : UnaryModule {
//     Tensor weight, bias;
//     Linear(...) { weight = register_parameter("weight", init::kaiming_uniform(...)); ... }
//     Tensor forward(const Tensor& x) override { return matmul(x, weight.mT()) + bias; }
//   };
//
// The member and the registered entry are two handles to one TensorImpl. That is why to() and
// load_state_dict() work in place (they rebind or overwrite that TensorImpl's storage) instead of
// replacing the tensor: a layer's `weight` member always sees what the module holds.
//
// Modules are not copyable and live behind std::shared_ptr (a submodule is shared between its
// parent and whoever else holds it, as in PyTorch).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"

namespace ag::nn {

// (name, tensor) pairs in registration order: the form of named_parameters() and state_dict().
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Whether load_state_dict copies a `from` tensor into a `to` parameter or buffer: the same dtype,
// or a 16-bit one (bf16, f16: a model saved for inference) into f32 or f64, which holds its values
// exactly. Narrowing is never done silently.
inline bool loads_into(DType from, DType to) { return from == to || (is_half(from) && is_floating(to)); }

// What load_state_dict found; each list is empty when everything matched.
struct LoadResult {
  std::vector<std::string> missing;     // the module's names absent from the dict
  std::vector<std::string> unexpected;  // the dict's names the module does not have
  std::vector<std::string> mismatched;  // "name: expected [4,3] f32, got [3,4] f32"
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- registration: `name` must be non-empty, without '.', and unique within this module ----
  // Registers a trainable tensor (sets requires_grad) and returns it: the same TensorImpl.
  Tensor register_parameter(const std::string& name, Tensor value);
  // Registers state that is saved and moved but not trained (running statistics, masks).
  Tensor register_buffer(const std::string& name, Tensor value);
  // Registers a child; its names appear under "name.". Returns the same pointer, typed.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check(module != nullptr, "register_module: '{}' is a null module", name);
    add_child(name, module);
    return module;
  }

  // ---- inspection (registration order, depth first: own entries, then each child's) ---------
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  // This module ("") and every descendant under its dotted name ("blocks.0.attn"), depth first in
  // registration order, as PyTorch's named_modules(): a module reachable by two paths is listed
  // once, under the first.
  std::vector<std::pair<std::string, const Module*>> named_modules() const;
  int64_t num_parameters() const;  // total element count of all parameters

  // ---- mode ----------------------------------------------------------------------------------
  void train(bool on = true);  // this module and every descendant
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Clears every parameter's gradient (to "none", as PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  // Moves every parameter and buffer (and any gradient) to `device` in place: the tensors keep
  // their identity, so a layer's members and an optimizer's parameter list follow the move.
  void to(Device device);
  // Where the module's parameters are: the device of its first parameter, or the first buffer's
  // for a module without parameters (the CPU for one with neither). After to() every tensor is
  // there, so a forward can make its index and mask tensors on device() to meet its weights.
  Device device() const;

  // Parameters then buffers of each module, depth first, as detached tensors sharing storage.
  NamedTensors state_dict() const;
  // Copies the dict's values into the module's tensors in place (no history recorded).
  // strict: any missing, unexpected or mis-shaped / mis-typed name is an ag::Error listing all
  // of them, and nothing is copied. Not strict: copies what matches and reports the rest.
  LoadResult load_state_dict(const NamedTensors& dict, bool strict = true);

 private:
  void check_name(const char* what, const std::string& name) const;
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  // Own tensors prefixed with `prefix`, then each child's under prefix + child name + ".".
  void collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const;
  // The first parameter (or buffer) in collect()'s order, or null: what device() reads, without
  // building every name (device() runs in each forward of the apps' models).
  const Tensor* first_tensor(bool params) const;

  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// ---- profiling scopes ----------------------------------------------------------------------
// A built-in layer's forward opens one `ModuleScope scope(this);` as its first line. While
// nn::summarize (nn/summary.h) profiles a forward, the ops recorded inside are attributed to the
// innermost open scope's module (its FLOPs and the activations it leaves alive); otherwise the
// scope costs one branch on a thread-local pointer.
class ModuleProfiler;  // nn/summary.cpp
namespace detail {
extern thread_local constinit ModuleProfiler* t_module_profiler;  // this thread's, or null
void profiler_enter(ModuleProfiler* p, const Module* m);
void profiler_leave(ModuleProfiler* p);
}  // namespace detail

class ModuleScope {
 public:
  explicit ModuleScope(const Module* m) : p_(detail::t_module_profiler) {
    if (p_) detail::profiler_enter(p_, m);
  }
  ~ModuleScope() {
    if (p_) detail::profiler_leave(p_);
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  ModuleProfiler* p_;
};

// A module mapping one tensor to one tensor: what Sequential can chain.
struct UnaryModule : Module {
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// Makes `dst`'s TensorImpl view `src`'s storage with `src`'s strides and offset (shape and dtype
// must match). Every handle sharing dst's impl sees the new data; no history is recorded. This
// is how Module::to() moves a parameter without replacing the tensor its layer holds.
void rebind_storage(const Tensor& dst, const Tensor& src);

}  // namespace ag::nn
