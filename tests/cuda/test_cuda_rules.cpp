// The rules the CPU and the GPU share, run on the GPU: the attention mask (core/kernels/
// attention_mask.h), the dropout mask (core/kernels/dropout_mask.h) and the elementwise engine's
// loop plan (core/kernels/loop_plan.h). Each case checks the GPU's result against the rule itself
// (which keys it let a query see, which elements it kept, where it read each operand) and against
// the CPU, at the GPU kernels' tile edges (32 queries x 32 keys) and on both attention paths (the
// tiled f32 kernels, the one-thread-per-row f64 one).
// Without a GPU every case prints the skip marker (CTest lists it as skipped).
#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "autograd/testing.h"
#include "core/kernels/attention_mask.h"
#include "core/kernels/dropout_mask.h"
#include "cuda/memory.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

const Device kGpu = Device::cuda(0);

// The masks of one case (B = 2, Tk <= 128), for the op as tensors and for the rule as it reads them.
struct Masks {
  int64_t B = 2, Tq = 1, Tk = 1;
  bool causal = false;
  int64_t window = -1;
  std::vector<int64_t> lengths;  // empty: none
  bool has_key_mask = false;
  bool key_mask[2 * 128] = {};   // (B, Tk)
};

SdpaOptions options_on(const Masks& m, Device dev) {
  SdpaOptions o;
  o.causal = m.causal, o.window = m.window;
  if (!m.lengths.empty()) o.key_padding_lengths = from_vector<int64_t>(m.lengths, {m.B}).to(dev);
  if (m.has_key_mask)
    o.key_padding_mask = from_vector<bool>(std::span<const bool>(m.key_mask, size_t(m.B * m.Tk)), {m.B, m.Tk}).to(dev);
  return o;
}

// Whether the rule lets query i of batch element b see key j, evaluated on the host.
bool rule_visible(const Masks& m, int64_t b, int64_t i, int64_t j) {
  const Visibility v{m.Tq, m.Tk, m.causal, m.window, m.lengths.empty() ? nullptr : m.lengths.data(),
                     m.has_key_mask ? m.key_mask : nullptr};
  return visible(v, b, i, j);
}

// Every mask pattern at the given sizes: none, causal, windows (with and without causal), lengths
// (one of 0), a scattered key_mask and one hiding all of element 1.
std::vector<Masks> patterns(int64_t Tq, int64_t Tk) {
  REQUIRE(Tk <= 128);
  std::vector<Masks> out;
  for (bool causal : {false, true}) {
    if (causal && Tq > Tk) continue;
    for (int64_t window : {int64_t(-1), int64_t(0), int64_t(3), int64_t(40)})
      for (int pad = 0; pad < 4; ++pad) {
        Masks m;
        m.Tq = Tq, m.Tk = Tk, m.causal = causal, m.window = window;
        if (pad == 1) m.lengths = {Tk, (Tk + 1) / 2};
        if (pad == 2) m.lengths = {0, Tk - 1};
        if (pad == 3) {
          m.has_key_mask = true;
          for (int64_t j = 0; j < Tk; ++j) m.key_mask[j] = (j * 5) % 7 == 2, m.key_mask[Tk + j] = j % 2 == 1;
        }
        out.push_back(m);
      }
  }
  return out;
}

}  // namespace

TEST_CASE("cuda rules: attention lets each query see exactly the keys the mask rule allows") {
  if (skip_without_gpu()) return;
  // V = identity (Dv = Tk): out_ij = P_ij, > 0 exactly where key j is visible. f32 with Tk <= 128
  // takes the tiled kernels, f64 the one-thread-per-row path.
  for (DType dt : {DType::f32, DType::f64})
    for (auto [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{1, 33}, {31, 31}, {33, 33}, {65, 100}, {32, 128},
                                                                 {40, 7}})
      for (const Masks& m : patterns(Tq, Tk)) {
        INFO(name(dt), " Tq ", Tq, " Tk ", Tk, " causal ", m.causal, " window ", m.window, " lengths ",
             !m.lengths.empty(), " key_mask ", m.has_key_mask);
        Generator g(3);
        const Tensor q = randn({2, 1, Tq, 8}, dt, &g).to(kGpu), k = randn({2, 1, Tk, 8}, dt, &g).to(kGpu);
        std::vector<double> eye(size_t(2 * Tk * Tk), 0.0);
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t j = 0; j < Tk; ++j) eye[size_t((b * Tk + j) * Tk + j)] = 1;
        const Tensor v = from_vector<double>(eye, {2, 1, Tk, Tk}).to(dt).to(kGpu);
        const std::vector<double> out =
            scaled_dot_product_attention(q, k, v, options_on(m, kGpu)).out.cpu().to_vector<double>();
        int64_t wrong = 0;
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t i = 0; i < Tq; ++i)
            for (int64_t j = 0; j < Tk; ++j)
              wrong += (out[size_t((b * Tq + i) * Tk + j)] > 0) != rule_visible(m, b, i, j);
        CHECK(wrong == 0);
      }
}

TEST_CASE("cuda rules: attention forward and backward equal the cpu for every mask, at the GPU's tile edges") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (auto [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{31, 33}, {32, 32}, {33, 65}, {64, 97}, {5, 70}})
      for (const Masks& m : patterns(Tq, Tk)) {
        INFO(name(dt), " Tq ", Tq, " Tk ", Tk, " causal ", m.causal, " window ", m.window, " lengths ",
             !m.lengths.empty(), " key_mask ", m.has_key_mask);
        Generator g(5);
        auto leaf = [&](Shape s) { return randn(s, dt, &g).detach().set_requires_grad(true); };
        const Tensor q = leaf({2, 2, Tq, 16}), k = leaf({2, 2, Tk, 16}), v = leaf({2, 2, Tk, 24});
        auto fn = [m](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], options_on(m, in[0].device())).out;
        };
        testing::CompareOptions o;
        if (dt == DType::f64) o.atol = 1e-10, o.rtol = 1e-9;
        else o.atol = 1e-4, o.rtol = 1e-3;
        const testing::CompareResult r = testing::compare_devices(fn, {q, k, v}, o);
        INFO(r.message);
        CHECK(r.passed);
      }
}

TEST_CASE("cuda rules: dropout on the GPU keeps dropout_keep's elements, alone and in attention") {
  if (skip_without_gpu()) return;
  // ag::dropout of ones: y_i = 1/(1 - p) where dropout_keep(seed, offset, i, p), else 0, exactly
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t n : {1, 13, 4099}) {
      INFO(name(dt), " n ", n);
      Generator gen(321);
      gen.set_offset((uint64_t(1) << 32) - 1);
      const uint64_t offset = gen.offset();
      const std::vector<double> y = dropout(ones({n}, dt, kGpu), 0.4, true, &gen).cpu().to_vector<double>();
      CHECK(gen.offset() == offset + dropout_blocks(n));
      const double s = dt == DType::f32 ? double(dropout_scale<float>(0.4)) : dropout_scale<double>(0.4);
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += y[size_t(i)] != (dropout_keep(321, offset, uint64_t(i), 0.4) ? s : 0.0);
      CHECK(wrong == 0);
    }
  // the fused attention with V = identity: out_ij = P_ij M_ij, 0 exactly where the rule drops
  // weight (bh, i, j) (element (bh Tq + i) Tk + j of the stream), on both GPU paths
  for (DType dt : {DType::f32, DType::f64}) {
    const int64_t Tq = 45, Tk = 70;
    Generator g(8);
    const Tensor q = randn({1, 2, Tq, 8}, dt, &g).to(kGpu), k = randn({1, 2, Tk, 8}, dt, &g).to(kGpu);
    std::vector<double> eye(size_t(2 * Tk * Tk), 0.0);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < Tk; ++j) eye[size_t((h * Tk + j) * Tk + j)] = 1;
    const Tensor v = from_vector<double>(eye, {1, 2, Tk, Tk}).to(dt).to(kGpu);
    Generator gen(77);
    gen.set_offset(5);
    SdpaOptions o;
    o.dropout = 0.3, o.generator = &gen;
    const std::vector<double> out = scaled_dot_product_attention(q, k, v, o).out.cpu().to_vector<double>();
    int64_t wrong = 0;
    for (int64_t bh = 0; bh < 2; ++bh)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j)
          wrong += (out[size_t((bh * Tq + i) * Tk + j)] != 0) !=
                   dropout_keep(77, 5, attention_dropout_element(bh, i, j, Tq, Tk), 0.3);
    INFO(name(dt));
    CHECK(wrong == 0);
  }
}

TEST_CASE("cuda rules: the elementwise engine reads strided operands where the loop plan says") {
  if (skip_without_gpu()) return;
  // Random views (permuted, sliced, broadcast, size-1 dims) of one buffer, through map1 (neg),
  // map2 (add), map3 (where) and the strided copy (contiguous): the GPU's values equal the CPU's
  // bit for bit, and both equal the buffer read at each layout's own offsets.
  std::mt19937 rng(7);
  const int64_t kBase = 16384;  // > 64 + 5^4 2^4: the furthest element of any view below
  Generator g(1);
  const Tensor base = randn({kBase}, DType::f32, &g);
  const std::vector<double> bv = base.to_vector<double>();
  const Tensor base_gpu = base.to(kGpu);
  for (int trial = 0; trial < 60; ++trial) {
    const int nd = 1 + int(rng() % 4);
    std::vector<int64_t> shape(static_cast<size_t>(nd));
    for (int64_t& s : shape) s = 1 + int64_t(rng() % 5);
    // strides: a permutation of a contiguous layout's, some stretched, some 0 (broadcast)
    auto strides_of = [&]() {
      std::vector<int> order(static_cast<size_t>(nd));
      for (int d = 0; d < nd; ++d) order[size_t(d)] = d;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int64_t> st(static_cast<size_t>(nd));
      int64_t step = 1;
      for (int k = nd - 1; k >= 0; --k) {
        const int d = order[size_t(k)];
        st[size_t(d)] = rng() % 5 == 0 ? 0 : step;
        step *= shape[size_t(d)] * (1 + int64_t(rng() % 2));
      }
      return st;
    };
    const std::vector<int64_t> sa = strides_of(), sb = strides_of(), sc = strides_of();
    const int64_t oa = int64_t(rng() % 64), ob = int64_t(rng() % 64), oc = int64_t(rng() % 64);
    const Shape sh{std::span<const int64_t>(shape)};
    auto view = [&](const Tensor& t, const std::vector<int64_t>& st, int64_t off) {
      return as_strided(t, sh, Shape(std::span<const int64_t>(st)), off);
    };
    INFO("trial ", trial, " shape ", fmt::format("{}", sh));
    auto results = [&](const Tensor& b) {
      const Tensor a = view(b, sa, oa), x = view(b, sb, ob), c = view(b, sc, oc);
      return std::vector<Tensor>{neg(a), add(a, x), where(gt(c, 0.0), a, x), a.contiguous()};
    };
    const std::vector<Tensor> on_cpu = results(base), on_gpu = results(base_gpu);
    for (size_t r = 0; r < on_cpu.size(); ++r) {
      const std::vector<double> c = on_cpu[r].to_vector<double>(), d = on_gpu[r].cpu().to_vector<double>();
      CHECK(c == d);
    }
    // against the layouts' own arithmetic: element i of a view at off + sum_d i_d t_d
    const int64_t n = sh.numel();
    const std::vector<double> added = on_gpu[1].cpu().to_vector<double>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t pa = oa, pb = ob, rest = i;
      for (int d = nd - 1; d >= 0; --d) {
        const int64_t id = rest % shape[size_t(d)];
        rest /= shape[size_t(d)];
        pa += id * sa[size_t(d)], pb += id * sb[size_t(d)];
      }
      wrong += added[size_t(i)] != double(float(bv[size_t(pa)]) + float(bv[size_t(pb)]));
    }
    CHECK(wrong == 0);
  }
}
