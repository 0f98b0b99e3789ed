#include "optim/optimizer.h"

#include <cmath>
#include <map>

#include "autograd/tape.h"

namespace ag::optim {

namespace {
void check_lr(const char* name, double lr) {
  check(std::isfinite(lr) && lr >= 0, "{}: learning rate must be finite and >= 0, got {}", name, lr);
}
}  // namespace

Optimizer::Optimizer(const char* name, std::vector<Tensor> params, double lr, std::vector<StateField> fields)
    : name_(name), params_(std::move(params)), lr_(lr), fields_(std::move(fields)), state_(params_.size()) {
  check_lr(name_, lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    check(p.defined(), "{}: parameter {} is an undefined tensor", name_, i);
    check(p.requires_grad() && p.is_leaf(), "{}: parameter {} (shape {}) is not a leaf that requires grad", name_,
          i, p.shape());
    check(p.is_contiguous(), "{}: parameter {} (shape {}, strides {}) is not contiguous", name_, i, p.shape(),
          p.strides());
    for (size_t j = 0; j < i; ++j)
      check(params_[j].impl_ptr() != p.impl_ptr(), "{}: parameter {} is the same tensor as parameter {}", name_, i,
            j);
  }
}

std::vector<std::vector<size_t>> group_by_device_and_dtype(const std::vector<Tensor>& ts) {
  std::vector<std::vector<size_t>> groups;
  std::vector<std::pair<Device, DType>> keys;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) continue;
    const std::pair<Device, DType> key{ts[i].device(), ts[i].dtype()};
    size_t g = 0;
    while (g < keys.size() && keys[g] != key) ++g;
    if (g == keys.size()) {
      keys.push_back(key);
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

void Optimizer::set_lr(double lr) {
  check_lr(name_, lr);
  lr_ = lr;
}

std::vector<Tensor>& Optimizer::init_state(size_t i) {
  std::vector<Tensor>& s = state_[i];
  s.clear();
  for (const StateField& f : fields_)
    s.push_back(f.is_step ? zeros({}, DType::i64) : zeros_like(params_[i]));
  return s;
}

Tensor Optimizer::contiguous_grad(size_t i) const {
  Tensor g = params_[i].grad();
  return g.defined() ? g.contiguous() : g;
}

int64_t Optimizer::next_step(size_t i, size_t k) {
  Tensor& t = state_[i][k];
  const int64_t step = t.item<int64_t>() + 1;
  t.fill_(double(step));
  return step;
}

StateDict Optimizer::state_dict() const {
  StateDict dict;
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t k = 0; k < state_[i].size(); ++k)
      dict.emplace_back(fmt::format("state.{}.{}", i, fields_[k].name), state_[i][k].detach());
  dict.emplace_back("param_groups.0.lr", scalar_tensor(lr_, DType::f64));
  for (const auto& [hname, value] : hyper_parameters())
    dict.emplace_back("param_groups.0." + hname, scalar_tensor(value, DType::f64));
  return dict;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  // names this optimizer writes, mapped to (parameter, field) or to a hyper-parameter slot
  const auto hyper = hyper_parameters();
  std::map<std::string, std::pair<size_t, size_t>> state_names;
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t k = 0; k < fields_.size(); ++k) state_names[fmt::format("state.{}.{}", i, fields_[k].name)] = {i, k};
  std::map<std::string, size_t> hyper_names{{"param_groups.0.lr", 0}};
  for (size_t h = 0; h < hyper.size(); ++h) hyper_names["param_groups.0." + hyper[h].first] = h + 1;

  std::vector<std::vector<Tensor>> new_state(params_.size(), std::vector<Tensor>(fields_.size()));
  std::vector<double> hyper_values(hyper.size() + 1);
  std::vector<bool> hyper_seen(hyper.size() + 1, false);
  std::map<std::string, bool> seen;
  for (const auto& [key, t] : dict) {
    check(!seen[key], "{}: load_state_dict: name '{}' appears twice", name_, key);
    seen[key] = true;
    check(t.defined(), "{}: load_state_dict: '{}' is an undefined tensor", name_, key);
    if (auto h = hyper_names.find(key); h != hyper_names.end()) {
      check(t.ndim() == 0, "{}: load_state_dict: hyper-parameter '{}' must be a 0-dim tensor, got shape {}", name_,
            key, t.shape());
      hyper_values[h->second] = t.item<double>();
      hyper_seen[h->second] = true;
      continue;
    }
    auto s = state_names.find(key);
    check(s != state_names.end(), "{}: load_state_dict: unknown name '{}' (this optimizer has {} parameters)", name_,
          key, params_.size());
    const auto [i, k] = s->second;
    const Tensor& p = params_[i];
    if (fields_[k].is_step) {
      check(t.ndim() == 0, "{}: load_state_dict: '{}' must be a 0-dim step count, got shape {}", name_, key,
            t.shape());
      const double v = t.item<double>();
      check(v >= 0 && v == std::floor(v) && v < 9e15, "{}: load_state_dict: '{}' must be a whole number >= 0, got {}",
            name_, key, v);
      new_state[i][k] = scalar_tensor(v, DType::i64);
    } else {
      check(t.shape() == p.shape(), "{}: load_state_dict: '{}' has shape {}, parameter {} has shape {}", name_, key,
            t.shape(), i, p.shape());
      check(t.dtype() == p.dtype(), "{}: load_state_dict: '{}' has dtype {}, parameter {} has dtype {}", name_, key,
            t.dtype(), i, p.dtype());
      Tensor copy = empty_like(p);
      copy.copy_(t.detach().to(p.device()));
      new_state[i][k] = copy;
    }
  }
  for (const auto& [hname, slot] : hyper_names)
    check(hyper_seen[slot], "{}: load_state_dict: missing hyper-parameter '{}'", name_, hname);
  for (size_t i = 0; i < params_.size(); ++i) {
    size_t present = 0;
    for (const Tensor& t : new_state[i]) present += t.defined();
    if (present == 0) {
      new_state[i].clear();
      continue;
    }
    for (size_t k = 0; k < fields_.size(); ++k)
      check(new_state[i][k].defined(), "{}: load_state_dict: parameter {} has state but 'state.{}.{}' is missing",
            name_, i, i, fields_[k].name);
  }
  check_lr(name_, hyper_values[0]);
  set_hyper_parameters(std::vector<double>(hyper_values.begin() + 1, hyper_values.end()));  // validates
  lr_ = hyper_values[0];
  state_ = std::move(new_state);
}

}  // namespace ag::optim
