// cpu == cuda for block-sparse attention (SdpaOptions::block_mask; the patterns of
// nn/sparse_patterns.h), forward and backward, through scaled_dot_product_attention: the tiled
// f32 kernels (heads up to 128) and the one-thread-per-row path (f64), block sizes below, at and
// above the GPU's 32-wide tiles, with causal and key padding, and a block row that sees nothing.
// ag::testing::compare_devices runs each function on both devices and compares outputs and every
// input's gradient. Without a GPU every case prints the skip marker (CTest lists it as skipped).
#include <memory>
#include <span>

#include "autograd/testing.h"
#include "nn/sparse_patterns.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

Tensor leaf(const Shape& s, uint64_t seed, DType dt) {
  Generator g(seed);
  return randn(s, dt, &g).detach().set_requires_grad(true);
}

struct Sparse {
  int64_t B = 2, H = 2, Tq = 100, Tk = 100, D = 64, Dv = 64;
  int64_t bs = 16;
  Tensor blocks;            // b8 on the cpu
  bool blocks_on_cpu = false;  // the op also takes a cpu mask for GPU inputs
  bool causal = false;
  Tensor lengths;           // i64 (B), or undefined
  double dropout = 0;
  DType dt = DType::f32;
};

void expect_sparse(const Sparse& a) {
  INFO("Tq ", a.Tq, " Tk ", a.Tk, " D ", a.D, " bs ", a.bs, " blocks ", a.blocks.shape(), " causal ", a.causal,
       " lengths ", a.lengths.defined(), " dropout ", a.dropout, " f64 ", a.dt == DType::f64);
  const Tensor q = leaf({a.B, a.H, a.Tq, a.D}, 1, a.dt), k = leaf({a.B, a.H, a.Tk, a.D}, 2, a.dt),
               v = leaf({a.B, a.H, a.Tk, a.Dv}, 3, a.dt);
  auto fn = [a](const std::vector<Tensor>& in) {
    SdpaOptions o;
    const Device dev = in[0].device();
    o.block_mask = a.blocks_on_cpu ? a.blocks : a.blocks.to(dev), o.block_size = a.bs, o.causal = a.causal;
    if (a.lengths.defined()) o.key_padding_lengths = a.lengths.to(dev);
    o.dropout = a.dropout;
    Generator gen(21);
    o.generator = &gen;
    return scaled_dot_product_attention(in[0], in[1], in[2], o).out;
  };
  testing::CompareOptions o;
  if (a.dt == DType::f64) o.atol = 1e-10, o.rtol = 1e-9;
  else o.atol = 1e-4, o.rtol = 1e-3;
  const testing::CompareResult r = testing::compare_devices(fn, {q, k, v}, o);
  INFO(r.message);
  CHECK(r.passed);
}

}  // namespace

TEST_CASE("cuda: sparse attention, local+global and strided patterns equal the cpu's, bs 8, 32, 48") {
  if (skip_without_gpu()) return;
  for (int64_t bs : {8, 32, 48})
    for (bool strided : {false, true}) {
      Sparse a;
      a.bs = bs;
      a.blocks = strided ? nn::strided_block_mask(a.Tq, bs, 3) : nn::local_global_block_mask(a.Tq, bs, 1, 1);
      expect_sparse(a);
      a.causal = true;
      expect_sparse(a);
      a.lengths = tensor<int64_t>({100, 41}), a.blocks_on_cpu = true;
      expect_sparse(a);
    }
}

TEST_CASE("cuda: sparse attention, a block row that sees nothing, Tq < Tk, D 16 and 128") {
  if (skip_without_gpu()) return;
  // T 96, bs 32: block row 1 keeps nothing (zeros, zero gradients), column 2 is dropped everywhere
  const int64_t n = 3;
  std::unique_ptr<bool[]> m(new bool[n * n]);
  for (int64_t e = 0; e < n * n; ++e) m[size_t(e)] = e / n != 1 && e % n != 2;
  for (int64_t D : {16, 128}) {
    Sparse a;
    a.Tq = a.Tk = 96, a.bs = 32, a.D = a.Dv = D;
    a.blocks = from_vector<bool>(std::span<const bool>(m.get(), size_t(n * n)), {n, n});
    expect_sparse(a);
  }
  // queries at the end of the keys (causal bottom-right aligned), blocks indexed by the query
  Sparse c;
  c.Tq = 40, c.Tk = 130, c.bs = 20, c.causal = true, c.D = c.Dv = 32;
  c.blocks = nn::strided_block_mask(130, 20, 2).narrow(0, 0, 2).contiguous();  // (2, 7)
  expect_sparse(c);
}

TEST_CASE("cuda: sparse attention, dropout and the f64 one-thread-per-row path") {
  if (skip_without_gpu()) return;
  Sparse a;
  a.bs = 16, a.blocks = nn::local_global_block_mask(100, 16, 1, 1), a.dropout = 0.25;
  expect_sparse(a);
  Sparse f;
  f.dt = DType::f64, f.Tq = f.Tk = 45, f.D = f.Dv = 16, f.bs = 7, f.causal = true;
  f.blocks = nn::strided_block_mask(45, 7, 2);
  expect_sparse(f);
}
