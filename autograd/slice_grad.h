#pragma once
// The gradient of a node's output while backward sums it, and the slices that write into it by
// parts.
//
// A slice (slice, narrow, select) is a view of part of its input. Its own backward returns a
// gradient of the whole input: zeros, with its part written in. q, k and v cut from one fused
// projection would then make three zero-filled tensors of the projection's output, summed by two
// adds. Instead the tape writes each slice's gradient straight into its part of the input's
// pending gradient (add_to_part): a copy where no slice wrote before, an add where one did.
// Zeros go only into the parts no slice wrote, just before anything else reads the sum (settle).
// q, k and v cover their projection's output, so its gradient costs three copies and no fill.
//
// The sums are those of the plain path, bit for bit: x + 0 = x, and overlapping slices add in
// the order they arrive. A gradient that another node or the caller may hold (one a backward
// handed on as it is) is copied before a slice writes into it.
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ag {

// The part of its input that a slice or select node's output is: x[..., start:stop:step, ...]
// along dim `dim`; select drops that dim (index `start`, stop = start + 1, step 1).
struct SliceOfInput {
  int dim;
  int64_t start, stop, step;
  bool select;
};

// The gradient of a node's output, summed from what its consumers send while backward runs.
class PendingGrad {
 public:
  bool defined() const { return sum_.defined(); }
  // sum += g, for a gradient of the whole output.
  void add(const Tensor& g);
  // sum[part] += g, for a slice's gradient g; `shape` is the whole output's (the sum is made
  // empty, of that shape, when this is the first gradient to arrive).
  void add_to_part(const SliceOfInput& part, const Tensor& g, const Shape& shape);
  // The sum, with zeros where nothing wrote; undefined when nothing arrived. Leaves it empty.
  Tensor take();
  // Drops the sum (a backward that throws leaves no half-summed gradient behind).
  void clear();

 private:
  // Zeros into the parts no slice has written, when the sum was made empty (unset_).
  void settle();

  Tensor sum_;
  // Whether the tape made sum_ while summing (no one else holds it, so a slice may write into it).
  bool owned_ = false;
  // The ranges [lo, hi) of dim dim_ that slices have written since sum_ was made (dim_ -1: not
  // known). A slice whose range meets none of them is copied in, not added.
  int dim_ = -1;
  std::vector<std::pair<int64_t, int64_t>> written_;
  // sum_ was made empty, and only the written_ ranges hold values: settle() fills the rest.
  bool unset_ = false;
};

}  // namespace ag
