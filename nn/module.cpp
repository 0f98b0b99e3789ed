#include "nn/module.h"

#include <algorithm>
#include <map>
#include <set>

namespace ag::nn {

void Module::check_name(const char* what, const std::string& name) const {
  check(!name.empty(), "{}: empty name", what);
  check(name.find('.') == std::string::npos, "{}: name '{}' contains '.' (dots separate submodules)", what, name);
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  check(!taken(params_) && !taken(buffers_) && !taken(children_), "{}: name '{}' is already registered", what,
        name);
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_name("register_parameter", name);
  check(value.defined(), "register_parameter: '{}' is an undefined tensor", name);
  check(is_floating(value.dtype()), "register_parameter: '{}' must be f32 or f64, got {} (shape {})", name,
        value.dtype(), value.shape());
  check(value.is_leaf(), "register_parameter: '{}' (shape {}) has history; pass a leaf (detach() it)", name,
        value.shape());
  value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name("register_buffer", name);
  check(value.defined(), "register_buffer: '{}' is an undefined tensor", name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name("register_module", name);
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const {
  if (params)
    for (const auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  if (buffers)
    for (const auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, true, out);
  return out;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out;
  std::set<const Module*> seen;
  // iterative depth first (children pushed in reverse so they come out in registration order)
  std::vector<std::pair<std::string, const Module*>> todo = {{"", this}};
  while (!todo.empty()) {
    auto [name, m] = todo.back();
    todo.pop_back();
    if (!seen.insert(m).second) continue;
    out.emplace_back(name, m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      todo.emplace_back(name.empty() ? it->first : name + "." + it->first, it->second.get());
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad() {
  for (Tensor& t : parameters()) t.set_grad(Tensor());
}

void rebind_storage(const Tensor& dst, const Tensor& src) {
  check(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
        "rebind_storage: destination {} {} and source {} {} differ", dst.shape(), dst.dtype(), src.shape(),
        src.dtype());
  TensorImpl& d = dst.impl();
  const TensorImpl& s = src.impl();
  d.storage = s.storage;
  d.strides = s.strides;
  d.offset = s.offset;
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  auto move = [&](const Tensor& t) {
    if (t.device() == device) return;
    rebind_storage(t, t.detach().to(device));
    if (t.grad().defined()) t.impl().grad = t.grad().to(device).impl_ptr();
  };
  for (auto& [n, t] : named_parameters()) move(t);
  for (auto& [n, t] : named_buffers()) move(t);
}

const Tensor* Module::first_tensor(bool params) const {
  const NamedTensors& own = params ? params_ : buffers_;
  if (!own.empty()) return &own.front().second;
  for (const auto& [n, m] : children_)
    if (const Tensor* t = m->first_tensor(params)) return t;
  return nullptr;
}

Device Module::device() const {
  const Tensor* t = first_tensor(true);
  if (!t) t = first_tensor(false);
  return t ? t->device() : Device::cpu();
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect("", true, true, out);
  for (auto& [n, t] : out) t = t.detach();
  return out;
}

LoadResult Module::load_state_dict(const NamedTensors& dict, bool strict) {
  NamedTensors own = state_dict();
  std::map<std::string, const Tensor*> given;
  for (const auto& [n, t] : dict) given[n] = &t;

  LoadResult r;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source) of each matching name
  for (const auto& [n, dst] : own) {
    auto it = given.find(n);
    if (it == given.end()) {
      r.missing.push_back(n);
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined() || src.shape() != dst.shape() || !loads_into(src.dtype(), dst.dtype())) {
      r.mismatched.push_back(src.defined() ? fmt::format("{}: expected {} {}, got {} {}", n, dst.shape(),
                                                         dst.dtype(), src.shape(), src.dtype())
                                           : fmt::format("{}: expected {} {}, got an undefined tensor", n,
                                                         dst.shape(), dst.dtype()));
      continue;
    }
    copies.emplace_back(dst, src);
  }
  std::map<std::string, bool> known;
  for (const auto& [n, t] : own) known[n] = true;
  for (const auto& [n, t] : dict)
    if (!known.count(n)) r.unexpected.push_back(n);

  if (strict && !r.ok()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s.empty() ? std::string("none") : s;
    };
    fail("load_state_dict: {} missing ({}); {} unexpected ({}); {} mismatched ({})", r.missing.size(),
         join(r.missing), r.unexpected.size(), join(r.unexpected), r.mismatched.size(), join(r.mismatched));
  }
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(src.detach().to(dst.device()));
  return r;
}

}  // namespace ag::nn
