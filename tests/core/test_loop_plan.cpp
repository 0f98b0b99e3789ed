// The loop plan of the elementwise engine (core/kernels/loop_plan.h), the one walk of strided
// operands that the CPU engine (core/cpu/loops.h, row by row) and the GPU kernels (cuda/loops.cuh,
// one thread per element at plan_offsets) share: known plans, then for random layouts (permuted,
// broadcast, sliced, size-1 and size-0 dims) every element's operand offsets against the layouts'
// own arithmetic, both through plan_offsets (the GPU's indexing) and through the CPU's row walk.
// The GPU engine on the same layouts: tests/cuda/test_cuda_rules.cpp.
#include <algorithm>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "core/cpu/loops.h"
#include "core/kernels/loop_plan.h"
#include "tests/helpers.h"

using namespace ag;

namespace {

Layout make_layout(std::vector<int64_t> shape, std::vector<int64_t> strides) {
  Layout l;
  l.ndim = int(shape.size());
  for (int d = 0; d < l.ndim; ++d) l.shape[d] = shape[size_t(d)], l.strides[d] = strides[size_t(d)];
  return l;
}

// The offset of row-major element i of l's shape, straight from the definition: sum_d i_d t_d.
int64_t layout_offset(const Layout& l, int64_t i) {
  int64_t off = 0;
  for (int d = l.ndim - 1; d >= 0; --d) off += (i % l.shape[d]) * l.strides[d], i /= l.shape[d];
  return off;
}

// A random layout of `shape`: the strides of a contiguous buffer of the dims in a random order,
// some dims stretched (every other element: a slice with a step) and some broadcast (stride 0).
Layout random_layout(const std::vector<int64_t>& shape, std::mt19937& rng) {
  const int nd = int(shape.size());
  std::vector<int> order(static_cast<size_t>(nd));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> strides(static_cast<size_t>(nd));
  int64_t step = 1 + int64_t(rng() % 2);
  for (int k = nd - 1; k >= 0; --k) {
    const int d = order[size_t(k)];
    strides[size_t(d)] = rng() % 5 == 0 ? 0 : step;
    step *= shape[size_t(d)] * (rng() % 4 == 0 ? 2 : 1);
  }
  return make_layout(shape, strides);
}

// Checks, for N operands of one shape, that the plan's walks read every element where the layouts
// say: plan_offsets (the GPU kernels' index arithmetic) and cpu::for_each_row (the CPU engine's).
template <int N>
void expect_plan_walks_layouts(const Layout* const (&in)[N]) {
  const LoopPlan<N> p = make_plan<N>(in);
  const int64_t n = in[0]->numel();
  REQUIRE(p.n == n);
  REQUIRE(p.nd >= 1);
  REQUIRE(p.nd <= std::max(in[0]->ndim, 1));
  int64_t plan_numel = 1;
  for (int d = 0; d < p.nd; ++d) plan_numel *= p.size[d];
  CHECK(plan_numel == n);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t off[N];
    plan_offsets(p, i, off);
    for (int k = 0; k < N; ++k) wrong += off[k] != layout_offset(*in[k], i);
  }
  CHECK(wrong == 0);
  // the CPU's walk: rows of the innermost plan dim, possibly split across threads
  std::vector<int64_t> seen(size_t(n), 0), got(size_t(n) * N, -1);
  cpu::for_each_row(p, [&](int64_t o, const int64_t* off, int64_t len, const int64_t* st) {
    for (int64_t t = 0; t < len; ++t) {
      seen[size_t(o + t)] += 1;
      for (int k = 0; k < N; ++k) got[size_t(o + t) * N + size_t(k)] = off[k] + t * st[k];
    }
  });
  int64_t missed = 0;
  wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    missed += seen[size_t(i)] != 1;
    for (int k = 0; k < N; ++k) wrong += got[size_t(i) * N + size_t(k)] != layout_offset(*in[k], i);
  }
  CHECK(missed == 0);
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("loop plan: known plans") {
  {  // contiguous: one dim
    const Layout a = make_layout({2, 3, 4}, {12, 4, 1});
    const Layout* const in[2] = {&a, &a};
    const LoopPlan<2> p = make_plan<2>(in);
    CHECK(p.nd == 1);
    CHECK(p.n == 24);
    CHECK(p.size[0] == 24);
    CHECK(p.stride[0][0] == 1);
    CHECK(p.stride[1][0] == 1);
  }
  {  // a transposed operand keeps two dims; size-1 dims are dropped first
    const Layout a = make_layout({4, 1, 3}, {1, 99, 4}), b = make_layout({4, 1, 3}, {3, 3, 1});
    const Layout* const in[2] = {&b, &a};
    const LoopPlan<2> p = make_plan<2>(in);
    CHECK(p.nd == 2);
    CHECK(p.size[0] == 4);
    CHECK(p.size[1] == 3);
    CHECK(p.stride[0][0] == 3);
    CHECK(p.stride[0][1] == 1);
    CHECK(p.stride[1][0] == 1);
    CHECK(p.stride[1][1] == 4);
  }
  {  // a row broadcast down a (5, 2, 3) block: the last two dims merge, the first stays
    const Layout x = make_layout({5, 2, 3}, {6, 3, 1}), row = make_layout({5, 2, 3}, {0, 3, 1});
    const Layout* const in[2] = {&x, &row};
    const LoopPlan<2> p = make_plan<2>(in);
    CHECK(p.nd == 2);
    CHECK(p.size[0] == 5);
    CHECK(p.size[1] == 6);
    CHECK(p.stride[1][0] == 0);
    CHECK(p.stride[1][1] == 1);
  }
  {  // a scalar, and every dim of size 1: one dim of size 1, strides 0
    const Layout s = make_layout({}, {}), ones = make_layout({1, 1}, {7, 7});
    for (const Layout* l : {&s, &ones}) {
      const Layout* const in[1] = {l};
      const LoopPlan<1> p = make_plan<1>(in);
      CHECK(p.nd == 1);
      CHECK(p.n == 1);
      CHECK(p.size[0] == 1);
      CHECK(p.stride[0][0] == 0);
    }
  }
  {  // no elements
    const Layout e = make_layout({3, 0, 2}, {0, 2, 1});
    const Layout* const in[1] = {&e};
    CHECK(make_plan<1>(in).n == 0);
  }
}

TEST_CASE("loop plan: every element of random strided layouts is read where the layouts say") {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 400; ++trial) {
    const int nd = int(rng() % 6);  // 0 .. 5 dims
    std::vector<int64_t> shape(static_cast<size_t>(nd));
    for (int64_t& s : shape) s = int64_t(rng() % 5);  // sizes 0 .. 4: size-1 and empty dims too
    if (trial % 3 != 0)
      for (int64_t& s : shape) s = std::max<int64_t>(s, 1);
    INFO("trial ", trial, " shape ", fmt::format("{}", Shape(std::span<const int64_t>(shape))));
    const Layout a = random_layout(shape, rng), b = random_layout(shape, rng), c = random_layout(shape, rng);
    const Layout* const in1[1] = {&a};
    const Layout* const in2[2] = {&a, &b};
    const Layout* const in3[3] = {&a, &b, &c};
    expect_plan_walks_layouts<1>(in1);
    expect_plan_walks_layouts<2>(in2);
    expect_plan_walks_layouts<3>(in3);
  }
  // large enough for the CPU walk to split rows (and single rows) across threads
  const Layout big = make_layout({64, 3, 1100}, {1, 64 * 1100, 64});
  const Layout dense = make_layout({64, 3, 1100}, {3300, 1100, 1});
  const Layout* const in2[2] = {&dense, &big};
  expect_plan_walks_layouts<2>(in2);
  const Layout row = make_layout({1, 70000}, {0, 2});
  const Layout* const in1[1] = {&row};
  expect_plan_walks_layouts<1>(in1);
}
