// cpu == cuda for the kernels of cuda/core.cu, pointwise.cu, reduce.cu, nn.cu, index.cu and optim.cu,
// through the public ops, so what the fronts hand the kernels (layouts of broadcast and transposed
// views, [outer, C, inner] splits, null weights, ignore_index) is what the GPU receives.
// ag::testing::compare_devices runs a function on both devices, compares the outputs, then sends one
// random output gradient through both backwards and compares every input's gradient.
// Random numbers and dropout masks must match the CPU's bit for bit (same Philox counters), and the
// scatter-adds (embedding, index_select) must give the same bits run after run (no atomics).
// Without a GPU every case prints the skip marker (CTest lists it as skipped).
#include <cmath>
#include <limits>

#include "autograd/testing.h"
#include "core/dispatch.h"
#include "cuda/memory.h"
#include "nn/norm.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

const Device kGpu = Device::cuda(0);

Tensor leaf(const Shape& s, uint64_t seed, DType dt = DType::f32, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, dt, &g), scale).detach().set_requires_grad(true);
}
// values in [lo, hi): inputs of log, sqrt, pow
Tensor positive_leaf(const Shape& s, uint64_t seed, double lo = 0.5, double hi = 2.0, DType dt = DType::f32) {
  Generator g(seed);
  return rand(s, dt, &g, lo, hi).detach().set_requires_grad(true);
}

testing::CompareOptions tolerance(DType dt, double atol32 = 1e-5, double rtol32 = 1e-4) {
  testing::CompareOptions o;
  if (dt == DType::f64) o.atol = 1e-12, o.rtol = 1e-10;
  else o.atol = atol32, o.rtol = rtol32;
  return o;
}

void expect_same(const testing::Fn& fn, const std::vector<Tensor>& inputs,
                 const testing::CompareOptions& o = tolerance(DType::f32)) {
  const testing::CompareResult r = testing::compare_devices(fn, inputs, o);
  INFO(r.message);
  CHECK(r.passed);
}

// the exact values of a tensor, as doubles (bit-exact comparisons of f32/i64/b8 data)
std::vector<double> values(const Tensor& t) { return t.detach().cpu().contiguous().to_vector<double>(); }

void expect_bitwise(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = values(a), y = values(b);
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) differ += 1, first = first < 0 ? int64_t(i) : first;
  INFO("first difference at ", first, " of ", x.size());
  CHECK(differ == 0);
}

}  // namespace

// ---- tensor core: copies, casts, fills, arange -------------------------------------------------
TEST_CASE("cuda ops: casts, strided copies, fill and arange equal the cpu") {
  if (skip_without_gpu()) return;
  const Tensor x = leaf({3, 4, 5}, 1);
  for (DType to : {DType::f32, DType::f64, DType::i64, DType::b8}) {
    INFO("to ", name(to));
    // the cast reads a non-contiguous view on the device
    expect_bitwise(x.detach().to(kGpu).transpose(0, 2).to(to), x.detach().transpose(0, 2).to(to));
  }
  // f64 <-> f32 through the tape
  expect_same([](const std::vector<Tensor>& in) { return in[0].to(DType::f64).transpose(0, 1).to(DType::f32); }, {x});
  // copy_ into a strided destination, with a broadcast source
  Tensor dst_cpu = zeros({4, 6}), dst_gpu = zeros({4, 6}, DType::f32, kGpu);
  const Tensor src = arange(0, 4, 1, DType::f32).reshape({4, 1});
  dst_cpu.slice(1, 0, 6, 2).copy_(src);
  dst_gpu.slice(1, 0, 6, 2).copy_(src.to(kGpu));
  expect_bitwise(dst_gpu, dst_cpu);
  // fill of a strided view, full, arange in each numeric dtype
  Tensor f_cpu = zeros({5, 5}), f_gpu = zeros({5, 5}, DType::f32, kGpu);
  f_cpu.transpose(0, 1).slice(0, 1, 4).fill_(2.5);
  f_gpu.transpose(0, 1).slice(0, 1, 4).fill_(2.5);
  expect_bitwise(f_gpu, f_cpu);
  for (DType dt : {DType::f32, DType::f64, DType::i64})
    expect_bitwise(arange(-3, 7.5, 0.7, dt, kGpu), arange(-3, 7.5, 0.7, dt));
  expect_bitwise(full({2, 3}, -1.25, DType::f64, kGpu), full({2, 3}, -1.25, DType::f64));
  // cat writes each piece through a strided copy
  expect_same([](const std::vector<Tensor>& in) { return cat({in[0], in[1].transpose(0, 1)}, 1); },
              {leaf({3, 2}, 2), leaf({4, 3}, 3)});
}

TEST_CASE("cuda ops: host reads of device tensors (views, item, index checks)") {
  if (skip_without_gpu()) return;
  const Tensor x = arange(0, 12, 1, DType::f32).reshape({3, 4});
  const Tensor d = x.to(kGpu);
  // a non-contiguous view is gathered on the device, then read back
  check_close(d.transpose(0, 1).to_vector<double>(), x.transpose(0, 1).contiguous().to_vector<double>(), 0, 0);
  CHECK(d.select(1, 2).select(0, 1).item<double>() == 6.0);
  // the fronts check index values on the host: a bad index on the GPU is the same clear error
  const Tensor w = zeros({5, 2}, DType::f32, kGpu);
  AG_CHECK_ERROR(embedding(w, from_vector(std::vector<int64_t>{1, 5}, {2}, kGpu)), "embedding", "out of range");
  AG_CHECK_ERROR(index_select(w, 0, from_vector(std::vector<int64_t>{-1}, {1}, kGpu)), "index_select", "out of range");
  AG_CHECK_ERROR(cross_entropy(w, from_vector(std::vector<int64_t>{0, 1, 2, 3, 2}, {5}, kGpu)), "cross_entropy",
                 "out of range");
}

// ---- random numbers ------------------------------------------------------------------------------
// rand/randn/randint fill host tensors; the GPU kernels are called through KERNEL on device buffers
// with the same (seed, offset), and must give the same numbers.
TEST_CASE("cuda ops: uniform, normal and randint give the cpu's numbers for a seed") {
  if (skip_without_gpu()) return;
  for (int64_t n : {1, 3, 4, 7, 1000, 100003}) {
    INFO("n ", n);
    const uint64_t seed = 0x1234abcdULL, offset = 17;
    Tensor uc = empty({n}), ug = empty({n}, DType::f32, kGpu);
    KERNEL(Device::cpu(), uniform<float>, uc.data<float>(), n, seed, offset, -2.0, 3.0);
    KERNEL(kGpu, uniform<float>, ug.data<float>(), n, seed, offset, -2.0, 3.0);
    expect_bitwise(ug, uc);
    Tensor dc = empty({n}, DType::f64), dg = empty({n}, DType::f64, kGpu);
    KERNEL(Device::cpu(), uniform<double>, dc.data<double>(), n, seed, offset, 0.0, 1.0);
    KERNEL(kGpu, uniform<double>, dg.data<double>(), n, seed, offset, 0.0, 1.0);
    expect_bitwise(dg, dc);
    Tensor ic = empty({n}, DType::i64), ig = empty({n}, DType::i64, kGpu);
    KERNEL(Device::cpu(), randint, ic.data<int64_t>(), n, seed, offset, -5, 1000003);
    KERNEL(kGpu, randint, ig.data<int64_t>(), n, seed, offset, -5, 1000003);
    expect_bitwise(ig, ic);
    // normal: log/cos/sin differ in the last f64 ulp between the two math libraries; f32 results
    // round those away (almost always), f64 ones agree to a few ulp
    Tensor nc = empty({n}), ng = empty({n}, DType::f32, kGpu);
    KERNEL(Device::cpu(), normal<float>, nc.data<float>(), n, seed, offset, 0.5, 2.0);
    KERNEL(kGpu, normal<float>, ng.data<float>(), n, seed, offset, 0.5, 2.0);
    check_close(ng.to_vector<double>(), nc.to_vector<double>(), 1e-6, 1e-6);
    Tensor mc = empty({n}, DType::f64), mg = empty({n}, DType::f64, kGpu);
    KERNEL(Device::cpu(), normal<double>, mc.data<double>(), n, seed, offset, 0.0, 1.0);
    KERNEL(kGpu, normal<double>, mg.data<double>(), n, seed, offset, 0.0, 1.0);
    check_close(mg.to_vector<double>(), mc.to_vector<double>(), 1e-13, 1e-13);
  }
}

// ---- elementwise ----------------------------------------------------------------------------------
TEST_CASE("cuda ops: unary ops and their gradients equal the cpu") {
  if (skip_without_gpu()) return;
  const std::vector<std::pair<const char*, testing::Fn>> ops = {
      {"exp", [](const std::vector<Tensor>& in) { return exp(in[0]); }},
      {"tanh", [](const std::vector<Tensor>& in) { return tanh(in[0]); }},
      {"sigmoid", [](const std::vector<Tensor>& in) { return sigmoid(in[0]); }},
      {"relu", [](const std::vector<Tensor>& in) { return relu(in[0]); }},
      {"abs", [](const std::vector<Tensor>& in) { return abs(in[0]); }},
      {"silu", [](const std::vector<Tensor>& in) { return silu(in[0]); }},
      {"gelu", [](const std::vector<Tensor>& in) { return gelu(in[0]); }},
      {"gelu tanh", [](const std::vector<Tensor>& in) { return gelu(in[0], "tanh"); }},
      {"clamp", [](const std::vector<Tensor>& in) { return clamp(in[0], -0.5, 0.7); }},
      {"neg", [](const std::vector<Tensor>& in) { return neg(in[0]); }},
      {"pow 3", [](const std::vector<Tensor>& in) { return pow(in[0], 3.0); }},
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const auto& op : ops) {
      INFO(op.first, " ", name(dt));
      const Tensor x = leaf({6, 7}, 5, dt);
      const testing::Fn fn = op.second;
      expect_same(fn, {x}, tolerance(dt));
      expect_same([fn](const std::vector<Tensor>& in) { return fn({in[0].transpose(0, 1)}); }, {x}, tolerance(dt));
    }
  // the ones that need positive inputs
  const std::vector<std::pair<const char*, testing::Fn>> positive = {
      {"log", [](const std::vector<Tensor>& in) { return log(in[0]); }},
      {"sqrt", [](const std::vector<Tensor>& in) { return sqrt(in[0]); }},
      {"rsqrt", [](const std::vector<Tensor>& in) { return rsqrt(in[0]); }},
      {"pow 0.5", [](const std::vector<Tensor>& in) { return pow(in[0], 0.5); }},
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const auto& op : positive) {
      INFO(op.first, " ", name(dt));
      expect_same(op.second, {positive_leaf({5, 9}, 6, 0.5, 2.0, dt)}, tolerance(dt));
    }
  // NaN and infinities pass through as on the cpu
  const Tensor special = from_vector(std::vector<float>{NAN, INFINITY, -INFINITY, 0.f, -0.f, 1e-30f}, {6});
  for (const auto& op : ops) {
    INFO(op.first, " on NaN/inf");
    Tensor c = op.second({special}), g = op.second({special.to(kGpu)});
    check_close(g.to_vector<double>(), c.to_vector<double>(), 1e-6, 1e-5);
  }
}

TEST_CASE("cuda ops: binary ops with broadcasting and non-contiguous views equal the cpu") {
  if (skip_without_gpu()) return;
  const std::vector<std::pair<const char*, testing::Fn>> ops = {
      {"add", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); }},
      {"sub", [](const std::vector<Tensor>& in) { return sub(in[0], in[1]); }},
      {"mul", [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); }},
      {"div", [](const std::vector<Tensor>& in) { return div(in[0], add(abs(in[1]), 0.5)); }},
      {"pow", [](const std::vector<Tensor>& in) { return pow(add(abs(in[0]), 0.5), in[1]); }},
      {"maximum", [](const std::vector<Tensor>& in) { return maximum(in[0], in[1]); }},
      {"minimum", [](const std::vector<Tensor>& in) { return minimum(in[0], in[1]); }},
      {"where", [](const std::vector<Tensor>& in) { return where(lt(in[0], in[1]), in[0], mul(in[1], 2.0)); }},
      {"masked_fill", [](const std::vector<Tensor>& in) { return masked_fill(add(in[0], in[1]), gt(in[1], 0.3), -7); }},
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const auto& op : ops) {
      INFO(op.first, " ", name(dt));
      const testing::Fn fn = op.second;
      expect_same(fn, {leaf({3, 4, 5}, 7, dt), leaf({3, 4, 5}, 8, dt)}, tolerance(dt));  // same shape
      expect_same(fn, {leaf({3, 1, 5}, 9, dt), leaf({4, 1}, 10, dt)}, tolerance(dt));    // broadcast both ways
      expect_same(fn, {leaf({2, 3, 4}, 11, dt), leaf({4}, 12, dt)}, tolerance(dt));      // a row against a batch
      // a permuted view against a strided slice: (5, 3, 4) and (5, 3, 4) read with gaps
      expect_same([fn](const std::vector<Tensor>& in) { return fn({in[0].permute({2, 0, 1}), in[1].slice(0, 0, 10, 2)}); },
                  {leaf({3, 4, 5}, 13, dt), leaf({10, 3, 4}, 14, dt)}, tolerance(dt));
    }
  // scalar operands, integer arithmetic and comparisons of every dtype
  expect_same([](const std::vector<Tensor>& in) { return sub(2.0, div(mul(in[0], 3.0), 1.5)); }, {leaf({4, 4}, 15)});
  const Tensor a = randint(-5, 5, {4, 6}), b = randint(-5, 5, {6});
  expect_bitwise(add(a.to(kGpu), b.to(kGpu)), add(a, b));
  expect_bitwise(mul(a.to(kGpu).transpose(0, 1), 3.0), mul(a.transpose(0, 1), 3.0));
  for (DType dt : {DType::f32, DType::f64, DType::i64, DType::b8}) {
    INFO("compare ", name(dt));
    const Tensor x = a.to(dt), y = b.to(dt);
    expect_bitwise(lt(x.to(kGpu), y.to(kGpu)), lt(x, y));
    expect_bitwise(ge(x.to(kGpu), y.to(kGpu)), ge(x, y));
    expect_bitwise(eq(x.to(kGpu), y.to(kGpu)), eq(x, y));
    expect_bitwise(ne(x.to(kGpu), y.to(kGpu)), ne(x, y));
    expect_bitwise(where(gt(a, b).to(kGpu), x.to(kGpu), y.to(kGpu)), where(gt(a, b), x, y));
  }
  // NaN through maximum/minimum, as on the cpu
  const Tensor n1 = from_vector(std::vector<float>{NAN, 1, 2, NAN}, {4}), n2 = from_vector(std::vector<float>{1, NAN, 3, NAN}, {4});
  expect_bitwise(maximum(n1.to(kGpu), n2.to(kGpu)), maximum(n1, n2));
  expect_bitwise(minimum(n1.to(kGpu), n2.to(kGpu)), minimum(n1, n2));
}

TEST_CASE("cuda ops: in-place add_ and mul_ equal the cpu") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64, DType::i64}) {
    INFO(name(dt));
    Tensor c = arange(0, 12, 1, dt).reshape({3, 4}), g = c.to(kGpu);
    const Tensor o = arange(1, 5, 1, dt);  // broadcast over the rows
    c.add_(o, 2.0).mul_(3.0);
    g.add_(o.to(kGpu), 2.0).mul_(3.0);
    expect_bitwise(g, c);
  }
}

// ---- reductions ------------------------------------------------------------------------------------
TEST_CASE("cuda ops: sum, mean, max, var and argmax over any dims equal the cpu") {
  if (skip_without_gpu()) return;
  const std::vector<std::vector<int>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {-1}};
  for (DType dt : {DType::f32, DType::f64})
    for (const auto& dims : dim_sets)
      for (bool keep : {false, true}) {
        INFO(name(dt), " dims ", dims.size() ? dims[0] : -9, dims.size() > 1 ? dims[1] : -9, " keepdim ", keep);
        const Tensor x = leaf({5, 6, 7}, 21, dt);
        expect_same([dims, keep](const std::vector<Tensor>& in) { return sum(in[0], dims, keep); }, {x}, tolerance(dt));
        expect_same([dims, keep](const std::vector<Tensor>& in) { return mean(in[0].transpose(0, 2), dims, keep); },
                    {x}, tolerance(dt));
        expect_same([dims, keep](const std::vector<Tensor>& in) { return max(in[0], dims, keep); }, {x}, tolerance(dt));
        expect_same([dims, keep](const std::vector<Tensor>& in) { return var(in[0], dims, 1, keep); }, {x},
                    tolerance(dt));
      }
  // a long full reduction (the two-pass path) and integer sums
  const Tensor big = leaf({300001}, 22);
  expect_same([](const std::vector<Tensor>& in) { return sum(in[0]); }, {big}, tolerance(DType::f32, 1e-3, 1e-4));
  expect_same([](const std::vector<Tensor>& in) { return max(in[0]); }, {big});
  const Tensor ints = randint(-100, 100, {7, 300});
  expect_bitwise(sum(ints.to(kGpu), {1}), sum(ints, {1}));
  expect_bitwise(sum(ints.to(kGpu)), sum(ints));
  expect_bitwise(max(ints.to(kGpu), {0}), max(ints, {0}));
  // argmax: first maximum on ties, NaN is the maximum; rows (inner == 1) and columns (inner > 1)
  const Tensor t = from_vector(std::vector<float>{1, 3, 3, 0, NAN, 2, NAN, 5, -1, -1, -1, -1, 7, 7, 6, 7}, {4, 4});
  for (int dim : {0, 1}) {
    INFO("argmax dim ", dim);
    expect_bitwise(argmax(t.to(kGpu), dim), argmax(t, dim));
    expect_bitwise(max(t.to(kGpu), {dim}), max(t, {dim}));
  }
  const Tensor wide = randint(0, 50, {3, 4000}).to(DType::f32);  // many ties, one block per row
  expect_bitwise(argmax(wide.to(kGpu), 1), argmax(wide, 1));
  expect_bitwise(argmax(wide.to(kGpu), 0), argmax(wide, 0));
  // the reductions are the same bits run after run (fixed tree, no atomics)
  const Tensor g = big.detach().to(kGpu);
  expect_bitwise(sum(g), sum(g));
}

TEST_CASE("cuda ops: sums and maxima down long columns (bias gradients) equal the cpu in each path") {
  if (skip_without_gpu()) return;
  // (outer, R, inner) over dim 1: one chunk of rows; 2 chunks; 16 chunks (a bias gradient of the
  // 8192 x 768 shape); 79 chunks, whose partials are chunked again; and a wide one (a thread per
  // column)
  const std::vector<Shape> shapes = {{2, 300, 5}, {3, 600, 40}, {1, 8192, 768}, {1, 40000, 33}, {300, 100, 500}};
  uint64_t seed = 40;
  for (const Shape& shape : shapes)
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(name(dt), " R ", shape[1], " inner ", shape[2]);
      const Tensor x = leaf(shape, seed++, dt);
      expect_same([](const std::vector<Tensor>& in) { return sum(in[0], {1}); }, {x},
                  tolerance(dt, 1e-3, 1e-4));
      expect_same([](const std::vector<Tensor>& in) { return max(in[0], {1}); }, {x}, tolerance(dt));
      const Tensor g = x.detach().to(kGpu);
      expect_bitwise(sum(g, {1}), sum(g, {1}));  // the same bits run after run
    }
  const Tensor ints = randint(-1000, 1000, {40000, 7});
  expect_bitwise(sum(ints.to(kGpu), {0}), sum(ints, {0}));
  Tensor nan_col = leaf({5000, 40}, 49).detach();
  nan_col.data<float>()[1234 * 40 + 17] = NAN;  // one NaN deep in column 17: its maximum is NaN
  expect_bitwise(max(nan_col.to(kGpu), {0}), max(nan_col, {0}));
}

// ---- softmax, layer_norm, embedding, cross_entropy, dropout -------------------------------------------
TEST_CASE("cuda ops: softmax and log_softmax over the last, first and a middle dim equal the cpu") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (int dim : {-1, 0, 1})
      for (int64_t C : {5, 1000}) {
        INFO(name(dt), " dim ", dim, " C ", C);
        const Tensor x = leaf({3, C, 4}, 31, dt, 3.0);
        expect_same([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x}, tolerance(dt));
        expect_same([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x}, tolerance(dt));
        // a transposed input is made dense by the front
        expect_same([dim](const std::vector<Tensor>& in) { return softmax(in[0].transpose(0, 2), dim); }, {x},
                    tolerance(dt));
      }
  // -inf entries (masks), and a fully masked row gives NaN on both
  const Tensor m = from_vector(std::vector<float>{0, -INFINITY, 1, 2, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, {2, 4});
  check_close(softmax(m.to(kGpu)).to_vector<double>(), softmax(m).to_vector<double>(), 1e-7, 1e-6);
  check_close(log_softmax(m.to(kGpu)).to_vector<double>(), log_softmax(m).to_vector<double>(), 1e-6, 1e-6);
}

TEST_CASE("cuda ops: layer_norm with and without weight and bias equals the cpu") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t N : {7, 768}) {
      INFO(name(dt), " N ", N);
      const Tensor x = leaf({3, 37, N}, 41, dt, 2.0), w = leaf({N}, 42, dt), b = leaf({N}, 43, dt);
      auto tol = tolerance(dt, 1e-4, 1e-3);  // dw, db sum 111 rows in another order
      expect_same([N](const std::vector<Tensor>& in) { return layer_norm(in[0], {N}, in[1], in[2]); }, {x, w, b}, tol);
      expect_same([N](const std::vector<Tensor>& in) { return layer_norm(in[0], {N}, in[1]); }, {x, w}, tol);
      expect_same([N](const std::vector<Tensor>& in) { return layer_norm(in[0], {N}, Tensor(), in[1], 1e-3); }, {x, b},
                  tol);
      expect_same([N](const std::vector<Tensor>& in) { return layer_norm(in[0].transpose(0, 1), {N}); }, {x}, tol);
      // only the weight needs a gradient (dx not wanted)
      expect_same([N](const std::vector<Tensor>& in) { return layer_norm(in[0], {N}, in[1], in[2]); },
                  {x.detach(), w, b}, tol);
    }
  // more rows than one block of the partial sums of dw, db
  expect_same([](const std::vector<Tensor>& in) { return layer_norm(in[0], {64}, in[1], in[2]); },
              {leaf({1000, 64}, 44), leaf({64}, 45), leaf({64}, 46)}, tolerance(DType::f32, 1e-3, 1e-3));
}

TEST_CASE("cuda ops: embedding and index_select with repeated indices equal the cpu, bit-stable") {
  if (skip_without_gpu()) return;
  const Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 3, 9, 1, 0, 3, 7, 9, 9, 2}, {3, 4});
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(name(dt));
    const Tensor w = leaf({10, 6}, 51, dt);
    expect_same([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }, {w, idx}, tolerance(dt));
    const Tensor x = leaf({4, 10, 3}, 52, dt);
    const Tensor flat = idx.reshape({12});
    for (int dim : {0, 1, 2}) {
      INFO("index_select dim ", dim);
      const Tensor i = dim == 1 ? flat : from_vector(std::vector<int64_t>{2, 0, 2, 1, 2}, {5});
      expect_same([dim](const std::vector<Tensor>& in) { return index_select(in[0], dim, in[1]); }, {x, i},
                  tolerance(dt));
    }
  }
  // integer tensors gather too
  const Tensor iv = randint(0, 100, {10, 3});
  expect_bitwise(index_select(iv.to(kGpu), 0, idx.reshape({12}).to(kGpu)), index_select(iv, 0, idx.reshape({12})));
  // the scatter-add of many rows into few gives the same bits every run
  const Tensor many = randint(0, 5, {20000});
  Tensor w = leaf({5, 32}, 53).detach().to(kGpu).set_requires_grad(true);
  const Tensor g = randn({20000, 32}).to(kGpu);
  embedding(w, many.to(kGpu)).backward(g);
  const Tensor first = w.grad().clone();
  w.set_grad(Tensor());
  embedding(w, many.to(kGpu)).backward(g);
  expect_bitwise(w.grad(), first);
}

TEST_CASE("cuda ops: cross_entropy with reductions, label smoothing and ignore_index equals the cpu") {
  if (skip_without_gpu()) return;
  const Tensor target = from_vector(std::vector<int64_t>{3, -100, 0, 9, 3, 5, -100, 1}, {8});
  for (DType dt : {DType::f32, DType::f64})
    for (const char* red : {"mean", "sum", "none"})
      for (double s : {0.0, 0.1}) {
        INFO(name(dt), " reduction ", red, " smoothing ", s);
        const Tensor logits = leaf({8, 10}, 61, dt, 2.0);
        expect_same([red, s](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], red, -100, s); },
                    {logits, target}, tolerance(dt));
      }
  // many classes: one block per row with a long stride loop
  const Tensor t2 = randint(0, 5000, {6});
  expect_same([](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); }, {leaf({6, 5000}, 62), t2});
}

TEST_CASE("cuda ops: dropout keeps and drops the cpu's elements for a seed") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t n : {1, 5, 4099}) {
      INFO(name(dt), " n ", n);
      const Tensor x = leaf({n}, 71, dt);
      // a fresh generator per run, so both devices draw the same (seed, offset)
      auto fn = [](const std::vector<Tensor>& in) {
        Generator gen(99);
        gen.advance(3);
        return dropout(in[0], 0.3, true, &gen);
      };
      testing::CompareOptions exact = tolerance(dt);
      exact.atol = 0, exact.rtol = 0;  // the same mask and the same rounding: equal values
      expect_same(fn, {x}, exact);
    }
}

// ---- optimizers -------------------------------------------------------------------------------------
namespace {
// Five steps of an optimizer on a quadratic loss sum(w^2 * c) from the same start, on one device.
template <class Make>
std::vector<double> steps_on(Device dev, Make make) {
  Tensor w = leaf({33, 7}, 81).detach().to(dev).set_requires_grad(true);
  Tensor b = leaf({7}, 82).detach().to(dev).set_requires_grad(true);
  const Tensor c = positive_leaf({33, 7}, 83).detach().to(dev);
  auto opt = make(std::vector<Tensor>{w, b});
  for (int k = 0; k < 5; ++k) {
    opt.zero_grad();
    Tensor loss = add(sum(mul(mul(w, w), c)), sum(mul(b, b)));
    loss.backward();
    opt.step();
  }
  std::vector<double> out = w.to_vector<double>(), bv = b.to_vector<double>();
  out.insert(out.end(), bv.begin(), bv.end());
  return out;
}
}  // namespace

TEST_CASE("cuda ops: SGD, Adam and AdamW steps equal the cpu's") {
  if (skip_without_gpu()) return;
  auto sgd = [](std::vector<Tensor> p) { return optim::SGD(std::move(p), {0.05, 0.9, 0.01, 0.0, true}); };
  check_close(steps_on(kGpu, sgd), steps_on(Device::cpu(), sgd), 1e-6, 1e-5);
  auto plain = [](std::vector<Tensor> p) { return optim::SGD(std::move(p), {0.05}); };
  auto damped = [](std::vector<Tensor> p) { return optim::SGD(std::move(p), {0.05, 0.8, 0.0, 0.3, false}); };
  check_close(steps_on(kGpu, damped), steps_on(Device::cpu(), damped), 1e-6, 1e-5);
  check_close(steps_on(kGpu, plain), steps_on(Device::cpu(), plain), 1e-6, 1e-5);
  auto adam = [](std::vector<Tensor> p) { return optim::Adam(std::move(p), {1e-2, 0.9, 0.999, 1e-8, 0.01}); };
  check_close(steps_on(kGpu, adam), steps_on(Device::cpu(), adam), 1e-6, 1e-5);
  auto adamw = [](std::vector<Tensor> p) { return optim::AdamW(std::move(p), {1e-2, 0.9, 0.99, 1e-8, 0.1}); };
  check_close(steps_on(kGpu, adamw), steps_on(Device::cpu(), adamw), 1e-6, 1e-5);
}

TEST_CASE("cuda ops: clip_grad_norm and clip_grad_value equal the cpu") {
  if (skip_without_gpu()) return;
  for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    INFO("norm_type ", p);
    std::vector<Tensor> pc, pg;
    for (uint64_t s = 0; s < 3; ++s) {
      Tensor a = leaf({int64_t(100 + 40000 * s)}, 90 + s), g = leaf({int64_t(100 + 40000 * s)}, 95 + s, DType::f32, 3.0);
      a.set_grad(g.detach());
      Tensor b = a.detach().to(kGpu).set_requires_grad(true);
      b.set_grad(g.detach().to(kGpu));
      pc.push_back(a), pg.push_back(b);
    }
    const double nc = optim::clip_grad_norm(pc, 1.0, p), ng = optim::clip_grad_norm(pg, 1.0, p);
    CHECK(ng == doctest::Approx(nc).epsilon(1e-9));
    for (size_t i = 0; i < pc.size(); ++i) check_close(pg[i].grad().to_vector<double>(), pc[i].grad().to_vector<double>(), 1e-7, 1e-6);
  }
  // a NaN gradient makes the norm NaN on both
  Tensor a = zeros({5}, DType::f32, kGpu).set_requires_grad(true);
  a.set_grad(from_vector(std::vector<float>{1, NAN, 2, 3, 4}, {5}, kGpu));
  CHECK(std::isnan(optim::clip_grad_norm({a}, 1.0, 2.0, false)));
  // clip_grad_value
  Tensor c = zeros({6}).set_requires_grad(true), d = zeros({6}, DType::f32, kGpu).set_requires_grad(true);
  const Tensor gv = from_vector(std::vector<float>{-3, -0.5, 0, 0.5, 3, NAN}, {6});
  c.set_grad(gv.clone()), d.set_grad(gv.to(kGpu));
  optim::clip_grad_value({c}, 1.0);
  optim::clip_grad_value({d}, 1.0);
  expect_bitwise(d.grad(), c.grad());
}

TEST_CASE("cuda ops: multi-tensor optimizers over many tensors equal the cpu") {
  if (skip_without_gpu()) return;
  // 300 tensors (several tables of a launch), one of 70000 elements (two chunks) and one of
  // 21 million (more chunks than one launch holds), f32 and f64, some without a gradient at a step
  std::vector<Tensor> pc;
  for (int i = 0; i < 300; ++i) {
    const int64_t n = i == 7 ? 70000 : i == 150 ? 21000003 : 1 + (i * 53) % 700;
    pc.push_back(leaf({n}, 400 + uint64_t(i), i % 4 == 3 ? DType::f64 : DType::f32));
  }
  std::vector<Tensor> pg;
  for (const Tensor& p : pc) pg.push_back(p.detach().to(kGpu).set_requires_grad(true));
  optim::AdamW ac(pc, {1e-2, 0.9, 0.99, 1e-8, 0.1}), agpu(pg, {1e-2, 0.9, 0.99, 1e-8, 0.1});
  optim::SGD sc(pc, {0.05, 0.9, 0.01, 0.0, true}), sg(pg, {0.05, 0.9, 0.01, 0.0, true});
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < pc.size(); ++i) {
      if ((i + size_t(t)) % 5 == 0) {
        pc[i].set_grad(Tensor()), pg[i].set_grad(Tensor());
        continue;
      }
      Generator gen(9000 + 1000 * uint64_t(t) + i);
      const Tensor g = randn(pc[i].shape(), pc[i].dtype(), &gen);
      pc[i].set_grad(g), pg[i].set_grad(g.to(kGpu));
    }
    for (double p : {2.0, std::numeric_limits<double>::infinity()}) {
      INFO("step ", t, ", norm_type ", p);
      const double nc = optim::clip_grad_norm(pc, 1e30, p), ng = optim::clip_grad_norm(pg, 1e30, p);
      CHECK(ng == doctest::Approx(nc).epsilon(1e-10));
    }
    const double nc = optim::clip_grad_norm(pc, 50.0), ng = optim::clip_grad_norm(pg, 50.0);
    CHECK(ng == doctest::Approx(nc).epsilon(1e-10));
    optim::clip_grad_value(pc, 0.01), optim::clip_grad_value(pg, 0.01);
    optim::scale_grads(pc, 3.0), optim::scale_grads(pg, 3.0);
    optim::Optimizer& oc = t % 2 ? static_cast<optim::Optimizer&>(sc) : ac;
    optim::Optimizer& og = t % 2 ? static_cast<optim::Optimizer&>(sg) : agpu;
    oc.step(), og.step();
  }
  for (size_t i = 0; i < pc.size(); i += (i < 160 ? 1 : 7)) {
    INFO("tensor ", i, ", numel ", pc[i].numel());
    if (pc[i].dtype() == DType::f64)
      check_close(pg[i].to_vector<double>(), pc[i].to_vector<double>(), 1e-12, 1e-10);
    else
      check_close(pg[i].to_vector<double>(), pc[i].to_vector<double>(), 1e-6, 1e-5);
  }
}

// ---- layers the apps do not use ----------------------------------------------------------------------
TEST_CASE("cuda layers: RMSNorm after a causal cross-attention transformer block equals the cpu") {
  if (skip_without_gpu()) return;
  Generator g1(3), g2(3);
  nn::TransformerBlock bc(32, 4, {.mlp_hidden = 64, .causal = true, .cross = true, .generator = &g1}),
      bg(32, 4, {.mlp_hidden = 64, .causal = true, .cross = true, .generator = &g2});
  nn::RMSNorm rc(32), rg(32);
  bg.to(kGpu), rg.to(kGpu);
  const Tensor x = leaf({2, 9, 32}, 61), ctx = leaf({2, 5, 32}, 62);
  // the output, the input's gradient and every parameter's gradient, as one list
  auto run = [&](nn::TransformerBlock& block, nn::RMSNorm& norm, Device dev) {
    Tensor xi = x.detach().to(dev).set_requires_grad(true);
    const Tensor out = norm.forward(block.forward(xi, ctx.to(dev)));
    sum(mul(out, out)).backward();
    std::vector<double> all = out.to_vector<double>(), gx = xi.grad().to_vector<double>();
    all.insert(all.end(), gx.begin(), gx.end());
    for (nn::Module* m : {static_cast<nn::Module*>(&block), static_cast<nn::Module*>(&norm)})
      for (const Tensor& p : m->parameters()) {
        REQUIRE(p.grad().defined());
        const std::vector<double> g = p.grad().to_vector<double>();
        all.insert(all.end(), g.begin(), g.end());
      }
    return all;
  };
  check_close(run(bg, rg, kGpu), run(bc, rc, Device::cpu()), 1e-4, 1e-3);
}

// ---- a whole model step ----------------------------------------------------------------------------
TEST_CASE("cuda ops: a small network's loss and gradients equal the cpu's") {
  if (skip_without_gpu()) return;
  // embedding -> layer_norm -> linear -> gelu -> linear -> cross_entropy, with dropout
  const Tensor tokens = randint(0, 20, {24});
  const Tensor labels = randint(0, 11, {24});
  auto fn = [](const std::vector<Tensor>& in) {
    Generator gen(5);
    Tensor h = embedding(in[0], in[5]);
    h = layer_norm(h, {16}, in[1]);
    h = gelu(linear(h, in[2]));
    h = dropout(h, 0.1, true, &gen);
    return cross_entropy(linear(h, in[3], in[4]), in[6], "mean", -100, 0.05);
  };
  expect_same(fn, {leaf({20, 16}, 101), leaf({16}, 102), leaf({32, 16}, 103, DType::f32, 0.25),
                   leaf({11, 32}, 104, DType::f32, 0.2), leaf({11}, 105), tokens, labels},
              tolerance(DType::f32, 1e-5, 1e-3));
}
