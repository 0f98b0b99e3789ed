// Autocast's per-thread state (autograd/autocast.h): the precision and the bf16 weights kept
// for inference.
#include "autograd/autocast.h"

#include <memory>
#include <unordered_map>

#include "autograd/tape.h"

namespace ag {

namespace {

thread_local Precision g_precision = Precision::fp32;
thread_local bool g_no_copies = false;  // NoBf16WeightCopiesGuard

// A weight's bf16 copy, valid while the weight's storage is alive with `version`.
struct KeptWeight {
  std::weak_ptr<Storage> storage;
  uint64_t version = 0;
  Shape shape, strides;
  Tensor copy;  // contiguous
};
// keyed by the weight's storage and its offset in it (a weight may be a view)
struct Key {
  const Storage* storage;
  int64_t offset;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.storage) ^ size_t(k.offset) * 0x9e3779b97f4a7c15u;
  }
};
thread_local std::unordered_map<Key, KeptWeight, KeyHash> g_kept;

}  // namespace

Precision autocast_precision() { return g_precision; }
void set_autocast_precision(Precision p) {
  if (p != g_precision) g_kept.clear();
  g_precision = p;
}

Tensor autocast_bf16_weight(const Tensor& w) {
  if (g_precision != Precision::bf16) return Tensor();
  if (grad_enabled()) {  // training: every step changes the weights
    if (!g_kept.empty()) g_kept.clear();
    return Tensor();
  }
  if (g_no_copies || !w.defined() || w.dtype() != DType::f32 || !w.device().is_cpu() || !w.requires_grad())
    return Tensor();
  const std::shared_ptr<Storage>& st = w.impl().storage;
  const Key key{st.get(), w.offset()};
  auto it = g_kept.find(key);
  if (it != g_kept.end()) {
    const KeptWeight& k = it->second;
    if (k.storage.lock() == st && k.version == st->version && k.shape == w.shape() && k.strides == w.strides())
      return k.copy;
  }
  // a new or changed weight: first drop the copies of weights that are gone or were written since
  std::erase_if(g_kept, [](const auto& e) {
    const std::shared_ptr<Storage> s = e.second.storage.lock();
    return !s || s->version != e.second.version;
  });
  KeptWeight k{st, st->version, w.shape(), w.strides(), cast(w.detach(), DType::bf16).contiguous()};
  Tensor copy = k.copy;
  g_kept.insert_or_assign(key, std::move(k));
  return copy;
}

int64_t autocast_bf16_weights_kept() { return int64_t(g_kept.size()); }

NoBf16WeightCopiesGuard::NoBf16WeightCopiesGuard() : prev_(g_no_copies) { g_no_copies = true; }
NoBf16WeightCopiesGuard::~NoBf16WeightCopiesGuard() { g_no_copies = prev_; }

}  // namespace ag
