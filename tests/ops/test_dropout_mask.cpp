// The dropout rule (core/kernels/dropout_mask.h) that ag::dropout's kernels (core/cpu/nn.cpp,
// cuda/nn.cu) and the fused attention's dropout both call: the rule against docs/ops.md's
// definition, and the CPU kernel's mask against the rule element by element, forward and backward.
// The same on the GPU: tests/cuda/test_cuda_rules.cpp.
#include <cstdint>
#include <vector>

#include "core/kernels.h"
#include "core/kernels/dropout_mask.h"
#include "tests/helpers.h"

using namespace ag;

TEST_CASE("dropout rule: element i is lane i % 4 of Philox block offset + i / 4, kept when u >= p") {
  // docs/ops.md: m_i ~ Bernoulli(1 - p) drawn from Philox(seed, offset); written out from the docs
  for (uint64_t seed : {uint64_t(0), uint64_t(1234), ~uint64_t(0)})
    for (uint64_t offset : {uint64_t(0), uint64_t(7), (uint64_t(1) << 32) - 2})  // the counter's carry too
      for (double p : {0.0, 0.1, 0.5, 0.999}) {
        int kept = 0;
        for (uint64_t i = 0; i < 64; ++i) {
          const Philox4 r = philox4x32_10(seed, offset + i / 4);
          CHECK(philox_lane(r, i % 4) == r.v[i % 4]);
          const bool want = double(uniform01(r.v[i % 4])) >= p;
          CHECK(dropout_keep(seed, offset, i, p) == want);
          CHECK(dropout_keeps(r.v[i % 4], p) == want);
          kept += want;
        }
        if (p == 0.0) CHECK(kept == 64);
      }
  CHECK(dropout_scale<double>(0.25) == 1.0 / 0.75);
  CHECK(dropout_scale<float>(0.1) == float(1.0 / 0.9));  // rounded once, from double
  CHECK(dropout_blocks(0) == 0);
  CHECK(dropout_blocks(1) == 1);
  CHECK(dropout_blocks(4) == 1);
  CHECK(dropout_blocks(13) == 4);
  CHECK(attention_dropout_element(1, 2, 3, 5, 7) == uint64_t((1 * 5 + 2) * 7 + 3));
}

TEST_CASE("dropout: the CPU kernel's mask is dropout_keep's, element by element, forward and backward") {
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t n : {1, 3, 4, 13, 4099, 70001})  // partial Philox blocks, and sizes split across threads
      for (double p : {0.2, 0.7}) {
        INFO(name(dt), " n ", n, " p ", p);
        Generator gen(555);
        gen.set_offset((uint64_t(1) << 32) - 3);
        const uint64_t offset = gen.offset();
        Tensor x = ones({n}, dt).set_requires_grad(true);
        Tensor y = dropout(x, p, true, &gen);
        CHECK(gen.offset() == offset + dropout_blocks(n));  // the front reserves the rule's blocks
        Generator gr(9);
        Tensor g = randn({n}, dt, &gr);
        sum(mul(y, g)).backward();
        const std::vector<double> yv = y.to_vector<double>(), gv = g.to_vector<double>(),
                                  dx = x.grad().to_vector<double>();
        const double s = dt == DType::f32 ? double(dropout_scale<float>(p)) : dropout_scale<double>(p);
        int64_t wrong = 0, kept = 0;
        for (int64_t i = 0; i < n; ++i) {
          const bool keep = dropout_keep(555, offset, uint64_t(i), p);
          kept += keep;
          // y_i = 1 * factor; dx_i = g_i * factor (one rounding of the product in f32)
          const double want_dx = dt == DType::f32 ? double(float(gv[size_t(i)]) * float(s)) : gv[size_t(i)] * s;
          wrong += yv[size_t(i)] != (keep ? s : 0.0);
          wrong += dx[size_t(i)] != (keep ? want_dx : 0.0);
        }
        CHECK(wrong == 0);
        if (n > 1000) CHECK(std::abs(double(kept) / double(n) - (1 - p)) < 0.05);
      }
}
