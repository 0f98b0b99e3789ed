// The pending gradient that slices write into by parts (autograd/slice_grad.h). The reference is
// the plain path: each slice's gradient as its own backward returns it (zeros, its part written
// in), summed with add in the order the gradients arrive.
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// One gradient sent to the pending sum: into a part (a slice's), or of the whole.
struct Send {
  std::optional<SliceOfInput> part;  // none: a gradient of the whole output
  Tensor g;
};

Tensor part_of(const Tensor& t, const SliceOfInput& s) {
  return s.select ? t.select(s.dim, s.start) : t.slice(s.dim, s.start, s.stop, s.step);
}
SliceOfInput slice_part(int dim, int64_t start, int64_t stop, int64_t step = 1) {
  return {dim, start, stop, step, false};
}
SliceOfInput select_part(int dim, int64_t i) { return {dim, i, i + 1, 1, true}; }

// f32 values of a normal (never 0 or -0, so x + 0 = x holds for the bits too).
Tensor values(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, DType::f32, &gen);
}

// The plain path: a zero-filled whole per slice, summed with add.
Tensor plain_sum(const std::vector<Send>& sends, const Shape& shape) {
  Tensor sum;
  for (const Send& s : sends) {
    Tensor d = s.g;
    if (s.part) {
      d = zeros(shape);
      part_of(d, *s.part).copy_(s.g);
    }
    sum = sum.defined() ? add(sum, d) : d;
  }
  return sum;
}

// The same gradients sent through PendingGrad, with NaN-filled blocks of the sum's size left in
// the allocator's cache first: a sum made empty then starts as NaN, not as zeros by luck.
Tensor pending_sum(const std::vector<Send>& sends, const Shape& shape) {
  {
    std::vector<Tensor> junk;
    for (int i = 0; i < 16; ++i) junk.push_back(full(shape, std::nan("")));
  }
  PendingGrad p;
  for (const Send& s : sends) {
    if (s.part) p.add_to_part(*s.part, s.g, shape);
    else p.add(s.g);
  }
  Tensor sum = p.take();
  CHECK_FALSE(p.defined());  // take() leaves it empty
  return sum;
}

void check_same_bits(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<float> a = got.contiguous().to_vector<float>(), b = want.contiguous().to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      FAIL_CHECK(fmt::format("element {}: got {:.9g}, the plain path gives {:.9g}", i, a[i], b[i]));
      return;
    }
}

// Every element that no part of `parts` covers is +0 in `sum`.
void check_zeros_outside(const Tensor& sum, const std::vector<SliceOfInput>& parts) {
  Tensor covered = zeros(sum.shape());
  for (const SliceOfInput& s : parts) part_of(covered, s).fill_(1);
  const std::vector<float> v = sum.contiguous().to_vector<float>(), c = covered.to_vector<float>();
  int64_t untouched = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (c[i] == 0) {
      ++untouched;
      if (!(v[i] == 0 && !std::signbit(v[i]))) {
        FAIL_CHECK(fmt::format("element {}, which no slice wrote, is {}", i, v[i]));
        return;
      }
    }
  CHECK(untouched > 0);  // the case leaves something untouched
}

}  // namespace

TEST_CASE("slice_grad: the parts' sum equals the plain path's, bit for bit") {
  const Shape shape{2, 3, 8};
  const std::vector<std::pair<const char*, std::vector<SliceOfInput>>> cases = {
      {"q, k, v along one dim, covering the whole", {slice_part(2, 0, 3), slice_part(2, 3, 6), slice_part(2, 6, 8)}},
      {"along one dim, one range left out", {slice_part(2, 0, 2), slice_part(2, 2, 4), slice_part(2, 5, 8)}},
      {"overlapping ranges", {slice_part(2, 0, 5), slice_part(2, 3, 8), slice_part(2, 4, 5)}},
      {"a strided slice alone, gaps inside its range", {slice_part(2, 1, 8, 2)}},
      {"a strided slice, then a range over its gaps", {slice_part(2, 0, 8, 3), slice_part(2, 1, 3)}},
      {"selects along one dim", {select_part(2, 3), select_part(2, 5), select_part(2, 3)}},
      {"a select, then a strided slice of the same dim", {select_part(2, 3), slice_part(2, 1, 8, 3)}},
      {"along two dims", {slice_part(2, 0, 4), slice_part(1, 1, 3), slice_part(2, 4, 8)}},
      {"along two dims, a select and a step",
       {slice_part(2, 0, 4), select_part(0, 1), slice_part(1, 0, 3, 2), slice_part(2, 2, 6)}},
  };
  for (const auto& [name, parts] : cases) {
    const std::string what = name;  // a const char* would be logged as its address
    CAPTURE(what);
    std::vector<Send> sends;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Shape part_shape = part_of(zeros(shape), parts[i]).shape();
      sends.push_back({parts[i], values(part_shape, i + 1)});
    }
    check_same_bits(pending_sum(sends, shape), plain_sum(sends, shape));
  }
}

TEST_CASE("slice_grad: the parts no slice wrote are zeros") {
  const Shape shape{2, 3, 8};
  const std::vector<std::vector<SliceOfInput>> cases = {
      {slice_part(2, 0, 2), slice_part(2, 5, 8)},     // a gap between two ranges
      {slice_part(2, 2, 6)},                     // the ends
      {slice_part(2, 1, 8, 2)},                  // the gaps of a strided slice
      {select_part(2, 3), select_part(2, 6)},           // around two selects
      {slice_part(2, 0, 4), slice_part(1, 0, 1)},     // two dims
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    CAPTURE(k);
    std::vector<Send> sends;
    for (size_t i = 0; i < cases[k].size(); ++i)
      sends.push_back({cases[k][i], values(part_of(zeros(shape), cases[k][i]).shape(), i + 1)});
    check_zeros_outside(pending_sum(sends, shape), cases[k]);
  }
}

TEST_CASE("slice_grad: whole gradients and parts mixed, in either order") {
  const Shape shape{4, 6};
  const Tensor w1 = values(shape, 7), w2 = values(shape, 8);
  const Tensor a = values({4, 2}, 1), b = values({4, 3}, 2), c = values({6}, 3);
  const std::vector<std::vector<Send>> cases = {
      {{slice_part(1, 0, 2), a}, {std::nullopt, w1}},                       // a part, then a whole
      {{slice_part(1, 0, 2), a}, {std::nullopt, w1}, {slice_part(1, 2, 5), b}},  // ... then a part again
      {{std::nullopt, w1}, {std::nullopt, w2}, {select_part(0, 2), c}},      // a sum of wholes, then a part
      {{select_part(0, 2), c}, {slice_part(1, 3, 6), b}, {std::nullopt, w2}},     // two dims, then a whole
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    CAPTURE(k);
    check_same_bits(pending_sum(cases[k], shape), plain_sum(cases[k], shape));
  }
}

TEST_CASE("slice_grad: a gradient held elsewhere is copied, never written into") {
  // A backward may hand its output gradient on as it is (add's does): the pending sum then is
  // that very tensor, and a slice's part must go into a copy of it.
  const Shape shape{3, 5};
  const Tensor held = values(shape, 4), before = held.clone();
  const Tensor g = values({3, 2}, 5);
  PendingGrad p;
  p.add(held);
  p.add_to_part(slice_part(1, 1, 3), g, shape);
  const Tensor sum = p.take();
  check_same_bits(held, before);
  check_same_bits(sum, plain_sum({{std::nullopt, held}, {slice_part(1, 1, 3), g}}, shape));
  // and a non-contiguous one (a transposed gradient) the same way
  const Tensor held_t = values({5, 3}, 6).transpose(0, 1), before_t = held_t.clone();
  PendingGrad q;
  q.add(held_t);
  q.add_to_part(select_part(0, 1), values({5}, 7), shape);
  const Tensor sum_t = q.take();
  check_same_bits(held_t, before_t);
  check_same_bits(sum_t, plain_sum({{std::nullopt, held_t}, {select_part(0, 1), values({5}, 7)}}, shape));
}

TEST_CASE("slice_grad: backward through fused q, k, v gives the plain path's gradients, bit for bit") {
  // p = x W: one fused projection cut into q, k, v (and an overlapping probe), then mixed with
  // random f32 weights. Anomaly mode runs every node's own backward: the plain path.
  const Shape xs{2, 4, 6}, ws{6, 9};
  Tensor want_x, want_w;
  for (const bool plain : {true, false}) {
    CAPTURE(plain);
    DetectAnomalyGuard guard(plain);
    Tensor x = values(xs, 1).set_requires_grad(true), w = values(ws, 2).set_requires_grad(true);
    Tensor p = matmul(x, w);
    // backward meets the views in the reverse order: the strided probe first, then v, k, q, the
    // select along another dim last
    Tensor row = p.select(1, 2);
    Tensor q = p.narrow(2, 0, 3), k = p.narrow(2, 3, 3), v = p.narrow(2, 6, 3), probe = p.slice(2, 1, 9, 4);
    Tensor L = sum(mul(q, values(q.shape(), 3)));
    L = add(L, sum(mul(k, values(k.shape(), 4))));
    L = add(L, sum(mul(v, values(v.shape(), 5))));
    L = add(L, sum(mul(probe, values(probe.shape(), 6))));
    L = add(L, sum(mul(row, values(row.shape(), 7))));
    L.backward();
    if (plain) {
      want_x = x.grad(), want_w = w.grad();
    } else {
      check_same_bits(x.grad(), want_x);
      check_same_bits(w.grad(), want_w);
    }
  }
}
