#pragma once
// Sequential, as torch.nn.Sequential: children named "0", "1", ... in order; forward feeds each
// one's output to the next. So Sequential(Linear, ReLU, Linear) has the parameters
// 0.weight, 0.bias, 2.weight, 2.bias (ReLU, index 1, has none), exactly as in PyTorch.
//
// ModuleList<M>, as torch.nn.ModuleList: children "0", "1", ... of one type M that the owner
// calls itself (e.g. transformer blocks that take masks), so blocks.3.attn.qkv.weight names
// the same tensor here and in PyTorch.
#include <initializer_list>

#include "nn/module.h"

namespace ag::nn {

struct Sequential : UnaryModule {
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules) {
    for (const auto& m : modules) push_back(m);
  }
  // Appends `m` under the next index and returns it, typed.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    layers_.push_back(m);
    return register_module(std::to_string(layers_.size() - 1), std::move(m));
  }
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<UnaryModule>& operator[](size_t i) const {
    check(i < layers_.size(), "Sequential: index {} out of range for {} modules", i, layers_.size());
    return layers_[i];
  }
  Tensor forward(const Tensor& x) override {
    ModuleScope scope(this);
    Tensor y = x;
    for (const auto& m : layers_) y = m->forward(y);
    return y;
  }

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

template <class M>
struct ModuleList : Module {
  // Appends `m` under the next index and returns it.
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    items_.push_back(m);
    return register_module(std::to_string(items_.size() - 1), std::move(m));
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const {
    check(i < items_.size(), "ModuleList: index {} out of range for {} modules", i, items_.size());
    return *items_[i];
  }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace ag::nn
