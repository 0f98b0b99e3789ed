// cpu == cuda for the matmul and attention kernels (cuda/matmul.cu, cuda/attention.cu), through the
// public ops (matmul, linear, scaled_dot_product_attention), so the fronts' operand descriptions
// (trans flags, leading dims, batch layouts, q/k/v strides) are what the GPU kernels receive.
// ag::testing::compare_devices runs each function on both devices, compares the outputs, then one
// random output gradient through both backwards and every input's gradient.
// Without a GPU every case prints the skip marker (CTest lists it as skipped).
#include <memory>
#include <span>

#include "autograd/autocast.h"
#include "autograd/testing.h"
#include "cuda/memory.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

Tensor leaf(const Shape& s, uint64_t seed, DType dt = DType::f32) {
  Generator g(seed);
  return randn(s, dt, &g).detach().set_requires_grad(true);
}

testing::CompareOptions tolerance(DType dt, double atol32 = 1e-5, double rtol32 = 1e-4) {
  testing::CompareOptions o;
  if (dt == DType::f64) o.atol = 1e-10, o.rtol = 1e-9;
  else o.atol = atol32, o.rtol = rtol32;
  return o;
}

void expect_same(const testing::Fn& fn, const std::vector<Tensor>& inputs, const testing::CompareOptions& o) {
  const testing::CompareResult r = testing::compare_devices(fn, inputs, o);
  INFO(r.message);
  CHECK(r.passed);
}

// ---- attention --------------------------------------------------------------------------------
struct Attn {
  int64_t B = 2, H = 3, Tq = 37, Tk = 37, D = 64, Dv = -1;  // Dv -1: = D
  SdpaOptions o;
  Tensor lengths, mask;  // on the cpu; moved to the inputs' device in the function unless masks_on_cpu
  bool masks_on_cpu = false;  // the kernels also take host masks (copied to the device)
  uint64_t seed = 11;    // of the dropout generator, fresh for each run so both devices draw the same
  DType dt = DType::f32;
};

// f32 tolerances: outputs and gradients are sums of up to Tk products of O(1) values, computed in
// a different order on each device; an indexing error is O(0.1) or more.
void expect_attention(const Attn& a) {
  const int64_t Dv = a.Dv < 0 ? a.D : a.Dv;
  INFO("B ", a.B, " H ", a.H, " Tq ", a.Tq, " Tk ", a.Tk, " D ", a.D, " Dv ", Dv, " causal ", a.o.causal, " window ",
       a.o.window, " dropout ", a.o.dropout, " lengths ", a.lengths.defined(), " mask ", a.mask.defined());
  const Tensor q = leaf({a.B, a.H, a.Tq, a.D}, 1, a.dt), k = leaf({a.B, a.H, a.Tk, a.D}, 2, a.dt),
               v = leaf({a.B, a.H, a.Tk, Dv}, 3, a.dt);
  auto fn = [a](const std::vector<Tensor>& in) {
    SdpaOptions o = a.o;
    const Device dev = a.masks_on_cpu ? Device::cpu() : in[0].device();
    if (a.lengths.defined()) o.key_padding_lengths = a.lengths.to(dev);
    if (a.mask.defined()) o.key_padding_mask = a.mask.to(dev);
    Generator gen(a.seed);
    o.generator = &gen;
    return scaled_dot_product_attention(in[0], in[1], in[2], o).out;
  };
  expect_same(fn, {q, k, v}, tolerance(a.dt, 1e-4, 1e-3));
}

}  // namespace

TEST_CASE("cuda attention: no mask, D = 16, 64, 128, rows not a multiple of the tile") {
  if (skip_without_gpu()) return;
  for (int64_t D : {16, 64, 128}) {
    Attn a;
    a.D = D, a.Tq = a.Tk = 45;
    expect_attention(a);
  }
}

TEST_CASE("cuda attention: causal, bottom-right aligned when Tq and Tk differ") {
  if (skip_without_gpu()) return;
  Attn a;
  a.o.causal = true, a.Tq = a.Tk = 70;
  expect_attention(a);
  a.Tq = 5, a.Tk = 77, a.D = 32;  // a query block at the end of a KV cache
  expect_attention(a);
  a.Tq = 40, a.Tk = 100, a.D = 128;
  expect_attention(a);
}

TEST_CASE("cuda attention: more queries than keys, odd head sizes, Dv unlike D") {
  if (skip_without_gpu()) return;
  Attn a;
  a.Tq = 40, a.Tk = 23, a.D = 24, a.Dv = 40;
  expect_attention(a);
  a.D = 20, a.Dv = 7;
  expect_attention(a);
  a.D = 100, a.Dv = 64;
  expect_attention(a);
}

TEST_CASE("cuda attention: window, alone and with causal, and rows that see nothing") {
  if (skip_without_gpu()) return;
  Attn a;
  a.Tq = a.Tk = 90, a.o.window = 5;
  expect_attention(a);
  a.o.causal = true;
  expect_attention(a);
  // Tq > Tk, not causal: query i sits at key position i - 17, so with window 3 the first 14 rows
  // see no key at all (zeros, zero gradients, lse = +inf)
  a.o.causal = false, a.o.window = 3, a.Tq = 40, a.Tk = 23, a.D = 32;
  expect_attention(a);
}

TEST_CASE("cuda attention: key_padding_lengths, a sequence of length 0") {
  if (skip_without_gpu()) return;
  Attn a;
  a.Tq = a.Tk = 50;
  a.lengths = tensor<int64_t>({33, 0});
  expect_attention(a);
  a.o.causal = true, a.lengths = tensor<int64_t>({50, 7});
  expect_attention(a);
  a.masks_on_cpu = true;
  expect_attention(a);
}

TEST_CASE("cuda attention: key_padding_mask with a fully masked sequence, D = 128") {
  if (skip_without_gpu()) return;
  Attn a;
  a.Tq = 20, a.Tk = 70, a.D = 128;
  // sequence 0: every fifth key masked; sequence 1: all of them (its rows see nothing)
  std::unique_ptr<bool[]> m(new bool[size_t(2 * a.Tk)]);
  for (int64_t j = 0; j < a.Tk; ++j) m[size_t(j)] = (j * 7) % 5 == 0, m[size_t(a.Tk + j)] = true;
  a.mask = from_vector<bool>(std::span<const bool>(m.get(), size_t(2 * a.Tk)), {2, a.Tk});
  expect_attention(a);
  a.o.causal = true;
  expect_attention(a);
  a.masks_on_cpu = true;
  expect_attention(a);
}

TEST_CASE("cuda attention: dropout draws the cpu's Philox mask") {
  if (skip_without_gpu()) return;
  Attn a;
  a.Tq = a.Tk = 66, a.o.dropout = 0.25, a.seed = 1234;
  expect_attention(a);
  a.o.causal = true, a.D = 16;
  expect_attention(a);
  a.lengths = tensor<int64_t>({60, 9}), a.D = 128, a.Tq = 10;
  expect_attention(a);
}

TEST_CASE("cuda attention: f64 and heads wider than 128 (the one-thread-per-row path)") {
  if (skip_without_gpu()) return;
  Attn a;
  a.dt = DType::f64, a.Tq = 21, a.Tk = 34, a.D = 16, a.o.causal = true;
  expect_attention(a);
  a.o.dropout = 0.3, a.lengths = tensor<int64_t>({30, 0});
  expect_attention(a);
  Attn w;
  w.Tq = w.Tk = 19, w.D = 160, w.Dv = 144, w.o.window = 4;
  expect_attention(w);
}

TEST_CASE("cuda attention: q, k, v as strided heads of one fused projection") {
  if (skip_without_gpu()) return;
  // qkv (B, T, 3 H D) -> q, k, v (B, H, T, D) views with strides (T 3HD, D, 3HD, 1): read in place
  const int64_t B = 2, T = 41, H = 4, D = 32;
  const Tensor qkv = leaf({B, T, 3 * H * D}, 5);
  auto fn = [=](const std::vector<Tensor>& in) {
    const Tensor x = in[0].reshape({B, T, 3, H, D}).permute({2, 0, 3, 1, 4});  // (3, B, H, T, D)
    SdpaOptions o;
    o.causal = true;
    return scaled_dot_product_attention(x.select(0, 0), x.select(0, 1), x.select(0, 2), o).out;
  };
  expect_same(fn, {qkv}, tolerance(DType::f32, 1e-4, 1e-3));
}

TEST_CASE("cuda attention: grouped-query heads and ALiBi biases, tiled (f32) and naive (f64) paths") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t D : {16, 64, 200}) {  // 200: wider than the tiles, the one-thread-per-row path
      for (bool causal : {false, true}) {
        INFO("dt ", dt, " D ", D, " causal ", causal);
        // 4 query heads on 2 key/value heads, Tq < Tk (bottom-right aligned), slopes on the cpu
        const Tensor q = leaf({2, 4, 37, D}, 1, dt), k = leaf({2, 2, 45, D}, 2, dt), v = leaf({2, 2, 45, D}, 3, dt);
        auto fn = [causal](const std::vector<Tensor>& in) {
          SdpaOptions o;
          o.enable_gqa = true, o.causal = causal;
          o.alibi_slopes = tensor<float>({0.5f, 0.25f, 0.125f, 1.0f / 16}, {4});
          return scaled_dot_product_attention(in[0], in[1], in[2], o).out;
        };
        expect_same(fn, {q, k, v}, tolerance(dt, 1e-4, 1e-3));
      }
    }
}

TEST_CASE("cuda rope: rotate-half and interleaved at an offset equal the cpu's") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (bool interleaved : {false, true}) {
      INFO("dt ", dt, " interleaved ", interleaved);
      expect_same([interleaved](const std::vector<Tensor>& in) { return rope(in[0], 4000, interleaved); },
                  {leaf({2, 3, 17, 64}, 1, dt)}, tolerance(dt));
      // a strided view (the heads of a fused projection)
      expect_same([interleaved](const std::vector<Tensor>& in) { return rope(in[0].transpose(1, 2), 3, interleaved); },
                  {leaf({2, 9, 4, 32}, 2, dt)}, tolerance(dt));
    }
}

TEST_CASE("cuda attention: backward is deterministic (same bits twice)") {
  if (skip_without_gpu()) return;
  const Device dev = Device::cuda(0);
  auto grads = [&] {
    const Tensor q = leaf({2, 2, 100, 64}, 1).to(dev).detach().set_requires_grad(true),
                 k = leaf({2, 2, 100, 64}, 2).to(dev).detach().set_requires_grad(true),
                 v = leaf({2, 2, 100, 64}, 3).to(dev).detach().set_requires_grad(true);
    SdpaOptions o;
    o.causal = true;
    Tensor y = scaled_dot_product_attention(q, k, v, o).out;
    y.backward(leaf({2, 2, 100, 64}, 4).detach().to(dev));
    return std::vector{q.grad().cpu().to_vector<float>(), k.grad().cpu().to_vector<float>(),
                       v.grad().cpu().to_vector<float>()};
  };
  CHECK(grads() == grads());
}

// ---- matmul and linear ------------------------------------------------------------------------
TEST_CASE("cuda matmul: plain, transposed views, vectors") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor a = leaf({5, 7}, 1, dt), b = leaf({7, 3}, 2, dt), bt = leaf({3, 7}, 3, dt), at = leaf({7, 5}, 4, dt);
    const Tensor x = leaf({7}, 5, dt);
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b}, tolerance(dt));
    // b^T and a^T as views: trans flags, no copies
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0], in[1].mT()); }, {a, bt}, tolerance(dt));
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0].mT(), in[1].mT()); }, {at, bt},
                tolerance(dt));
    // a column strided by 2 (ld > K) and 1-D operands
    const Tensor wide = leaf({5, 14}, 6, dt);
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0].slice(1, 0, 14, 2), in[1]); }, {wide, b},
                tolerance(dt));
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, x}, tolerance(dt));
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[1], in[0]); }, {b, x}, tolerance(dt));
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0], in[0]); }, {x}, tolerance(dt));
  }
}

TEST_CASE("cuda matmul: batched, broadcast and non-uniform batch strides") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64}) {
    auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
    // b shared by every matrix: folded into one GEMM of all rows of a
    expect_same(mm, {leaf({2, 3, 4, 5}, 1, dt), leaf({5, 6}, 2, dt)}, tolerance(dt));
    // a shared: strided-batched with stride 0 for a
    expect_same(mm, {leaf({4, 5}, 3, dt), leaf({2, 3, 5, 6}, 4, dt)}, tolerance(dt));
    // both batched, both broadcast along different dims: (2, 1) x (3) -> (2, 3), a loop over the outer dim
    expect_same(mm, {leaf({2, 1, 4, 5}, 5, dt), leaf({3, 5, 6}, 6, dt)}, tolerance(dt));
    // a permuted batch (strides not of one step) of transposed matrices
    expect_same(
        [](const std::vector<Tensor>& in) { return matmul(in[0].permute({1, 0, 3, 2}), in[1]); },
        {leaf({3, 2, 5, 4}, 7, dt), leaf({2, 3, 5, 6}, 8, dt)}, tolerance(dt));
    // batched a @ batched b^T, the attention-score shape
    expect_same([](const std::vector<Tensor>& in) { return matmul(in[0], in[1].mT()); },
                {leaf({2, 3, 9, 8}, 9, dt), leaf({2, 3, 11, 8}, 10, dt)}, tolerance(dt));
  }
}

TEST_CASE("cuda linear: bias epilogue, no bias, strided input") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x = leaf({2, 3, 8}, 1, dt), w = leaf({5, 8}, 2, dt), b = leaf({5}, 3, dt);
    expect_same([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, tolerance(dt));
    expect_same([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, w}, tolerance(dt));
    expect_same([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {leaf({8}, 4, dt), w, b},
                tolerance(dt));
    // rows of x strided (a slice of a wider buffer), w seen through a transposed view
    expect_same(
        [](const std::vector<Tensor>& in) { return linear(in[0].narrow(1, 2, 8), in[1].mT(), in[2]); },
        {leaf({6, 12}, 5, dt), leaf({8, 5}, 6, dt), b}, tolerance(dt));
  }
}

// bf16 and fp16 autocast (autograd/autocast.h): both devices multiply the same rounded operands
// (the GPU on tensor cores through cublasGemmEx, the CPU in its f32 GEMM on rounded copies) and
// sum in f32, so they agree to f32 summation-order error (tolerance 1e-4 + 1e-3 |ref|). For bf16
// that is below the bf16-vs-f32 gap of these sums (~3e-2), so a GPU that skipped the rounding
// would fail the comparison; fp16's gap is closer to the tolerance, so the last check asks
// directly that the GPU's 16-bit product differ from its f32 one.
TEST_CASE("cuda autocast: bf16 and fp16 matmul, linear and attention equal the cpu's") {
  if (skip_without_gpu()) return;
  const testing::CompareOptions tol = tolerance(DType::f32, 1e-4, 1e-3);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    INFO("precision ", name(p));
    auto under = [p](testing::Fn fn) {
      return [fn, p](const std::vector<Tensor>& in) {
        AutocastGuard autocast(p);
        return fn(in);
      };
    };
    expect_same(under([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }),
                {leaf({37, 64}, 1), leaf({64, 29}, 2)}, tol);
    // batched with a transposed view: strided-batched GemmEx
    expect_same(under([](const std::vector<Tensor>& in) { return matmul(in[0], in[1].mT()); }),
                {leaf({4, 37, 64}, 3), leaf({4, 29, 64}, 4)}, tol);
    expect_same(under([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }),
                {leaf({2, 19, 96}, 5), leaf({48, 96}, 6), leaf({48}, 7)}, tol);
    SdpaOptions causal;
    causal.causal = true;
    expect_same(under([causal](const std::vector<Tensor>& in) {
                  return scaled_dot_product_attention(in[0], in[1], in[2], causal).out;
                }),
                {leaf({2, 3, 41, 64}, 8), leaf({2, 3, 41, 64}, 9), leaf({2, 3, 41, 64}, 10)}, tol);
    // and the GPU's 16-bit product is not its f32 one
    const Tensor a = leaf({37, 64}, 1).to(Device::cuda(0)), b = leaf({64, 29}, 2).to(Device::cuda(0));
    Tensor y32 = matmul(a, b), y16;
    {
      AutocastGuard autocast(p);
      y16 = matmul(a, b);
    }
    CHECK(max(abs(sub(y16, y32))).item<double>() > 1e-4);
  }
}
