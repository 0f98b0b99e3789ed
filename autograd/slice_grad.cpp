// The pending gradient of a node's output and its slices' parts (see slice_grad.h for the idea).
#include "autograd/slice_grad.h"

#include <algorithm>

#include "autograd/ops.h"

namespace ag {

void PendingGrad::add(const Tensor& g) {
  settle();
  owned_ = sum_.defined();  // a sum is a new tensor of the tape's; g itself may be held elsewhere
  sum_ = owned_ ? ag::add(sum_, g) : g;
  dim_ = -1;
  written_.clear();
}

void PendingGrad::add_to_part(const SliceOfInput& s, const Tensor& g, const Shape& shape) {
  if (!sum_.defined()) {
    sum_ = empty(shape, g.dtype(), g.device());
    owned_ = true, dim_ = s.dim, written_.clear(), unset_ = true;
  } else if (!owned_ || !sum_.is_contiguous()) {
    settle();
    sum_ = sum_.clone();
    owned_ = true, dim_ = -1, written_.clear();
  }
  Tensor part = s.select ? sum_.select(s.dim, s.start) : sum_.slice(s.dim, s.start, s.stop, s.step);
  bool fresh = dim_ == s.dim;
  for (const auto& [lo, hi] : written_) fresh = fresh && (s.stop <= lo || hi <= s.start);
  // a strided slice leaves gaps inside its range, and an add reads the part: zeros first
  if (!fresh || (s.step != 1 && !s.select)) settle();
  if (fresh) part.copy_(g);
  else part.copy_(ag::add(part, g));
  if (dim_ == s.dim) written_.emplace_back(s.start, s.stop);
  else dim_ = -1;  // written along another dim: its zeros are no longer known
}

Tensor PendingGrad::take() {
  settle();
  Tensor g = std::move(sum_);
  clear();
  return g;
}

void PendingGrad::clear() {
  sum_ = Tensor();
  owned_ = false, dim_ = -1, written_.clear(), unset_ = false;
}

// The parts of q, k and v cover the whole of their projection's gradient: nothing is filled.
void PendingGrad::settle() {
  if (!unset_) return;
  unset_ = false;
  std::sort(written_.begin(), written_.end());  // (their order matters nowhere else)
  int64_t at = 0;  // [0, at) is written
  for (const auto& [lo, hi] : written_) {
    if (at < lo) sum_.slice(dim_, at, lo).zero_();
    at = std::max(at, hi);
  }
  if (const int64_t n = sum_.size(dim_); at < n) sum_.slice(dim_, at, n).zero_();
}

}  // namespace ag
