// cpu == cuda for the efficient-attention layers (nn/efficient_attention.h): each layer's output
// and the gradients of its input and every parameter, through ag::testing::compare_devices. The
// layers are compositions of ops (linear, views, matmul, cat, masked_fill, the fused attention), so
// this checks that the composition and its masks (made on the input's device) run on the GPU.
// The parameters are substituted from the compared inputs (qkv->weight = in[1]), so both runs use
// the same values on their own device. Without a GPU every case prints the skip marker.
#include <vector>

#include "autograd/testing.h"
#include "nn/efficient_attention.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

Tensor leaf(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, DType::f32, &g), scale).detach().set_requires_grad(true);
}

void expect_same(const testing::Fn& fn, const std::vector<Tensor>& inputs) {
  testing::CompareOptions o;
  o.atol = 1e-4, o.rtol = 1e-3;  // f32 sums in a different order on each device
  const testing::CompareResult r = testing::compare_devices(fn, inputs, o);
  INFO(r.message);
  CHECK(r.passed);
}

}  // namespace

TEST_CASE("cuda: LinformerAttention forward and gradients match the cpu (plain, key padding)") {
  if (skip_without_gpu()) return;
  nn::LinformerAttention lin(16, 4, 40, 8);
  for (int padding : {0, 1, 2}) {
    CAPTURE(padding);
    nn::AttentionOptions o;
    if (padding == 1) o.key_padding_lengths = from_vector<int64_t>({33, 20});
    if (padding == 2) o.key_padding_mask = gt(randn({2, 33}), 0.5);
    expect_same(
        [&](const std::vector<Tensor>& in) {
          lin.qkv->weight = in[1], lin.qkv->bias = in[2], lin.proj->weight = in[3], lin.proj->bias = in[4];
          lin.E = in[5], lin.F = in[6];
          return lin.forward(in[0], o).out;
        },
        {leaf({2, 33, 16}, 1), leaf({48, 16}, 2, 0.25), leaf({48}, 3), leaf({16, 16}, 4, 0.25), leaf({16}, 5),
         leaf({8, 40}, 6, 0.2), leaf({8, 40}, 7, 0.2)});
  }
}

TEST_CASE("cuda: MemoryCompressedAttention forward and gradients match the cpu (causal, padding, T % s != 0)") {
  if (skip_without_gpu()) return;
  nn::MemoryCompressedAttention mca(16, 4, 4);
  for (int padding : {0, 1, 2})
    for (bool causal : {false, true}) {
      CAPTURE(padding);
      CAPTURE(causal);
      nn::AttentionOptions o;
      o.causal = causal;
      if (padding == 1) o.key_padding_lengths = from_vector<int64_t>({30, 0});
      if (padding == 2) o.key_padding_mask = gt(randn({2, 30}), 0.3);
      expect_same(
          [&](const std::vector<Tensor>& in) {
            mca.qkv->weight = in[1], mca.qkv->bias = in[2];
            mca.compress_k->weight = in[3], mca.compress_k->bias = in[4];
            mca.compress_v->weight = in[5], mca.compress_v->bias = in[6];
            mca.proj->weight = in[7], mca.proj->bias = in[8];
            return mca.forward(in[0], o).out;
          },
          {leaf({2, 30, 16}, 1), leaf({48, 16}, 2, 0.25), leaf({48}, 3), leaf({16, 64}, 4, 0.125), leaf({16}, 5),
           leaf({16, 64}, 6, 0.125), leaf({16}, 7), leaf({16, 16}, 8, 0.25), leaf({16}, 9)});
    }
}

TEST_CASE("cuda: AxialAttention forward and gradients match the cpu (plain and causal)") {
  if (skip_without_gpu()) return;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::AxialAttention ax(16, 4, 5, 7, {.causal = causal});
    expect_same(
        [&](const std::vector<Tensor>& in) {
          ax.row->qkv->weight = in[1], ax.row->qkv->bias = in[2], ax.row->proj->weight = in[3],
          ax.row->proj->bias = in[4];
          ax.col->qkv->weight = in[5], ax.col->qkv->bias = in[6], ax.col->proj->weight = in[7],
          ax.col->proj->bias = in[8];
          return ax.forward(in[0]);
        },
        {leaf({2, 35, 16}, 1), leaf({48, 16}, 2, 0.25), leaf({48}, 3), leaf({16, 16}, 4, 0.25), leaf({16}, 5),
         leaf({48, 16}, 6, 0.25), leaf({48}, 7), leaf({16, 16}, 8, 0.25), leaf({16}, 9)});
  }
}
