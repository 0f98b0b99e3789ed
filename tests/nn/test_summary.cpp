// The per-layer model report (nn/summary.h): forward FLOPs equal to hand counts for Linear, an MLP,
// MultiHeadAttention and a transformer block, parameter counts, activation bytes that add up, and
// no trace of the profiler once it is off.
#include <string>

#include "autograd/tape.h"
#include "nn/summary.h"
#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// Every module's inclusive numbers are at least the sum of its children's.
void check_inclusive(const nn::ModelSummary& s) {
  for (const nn::ModuleStats& m : s.modules) {
    double flops = m.self_flops;
    int64_t bytes = m.self_activation_bytes;
    for (const nn::ModuleStats& c : s.modules)
      if (c.depth == m.depth + 1 && c.name.rfind(m.name.empty() ? "" : m.name + ".", 0) == 0) {
        flops += c.flops;
        bytes += c.activation_bytes;
      }
    CHECK(m.flops == flops);
    CHECK(m.activation_bytes == bytes);
    CHECK(m.activation_bytes >= m.self_activation_bytes);
  }
}

}  // namespace

TEST_CASE("summary: Linear FLOPs, parameters and activation bytes equal hand counts") {
  nn::Linear lin(4, 3);
  Tensor x = randn({2, 5, 4});
  nn::ModelSummary s = nn::summarize(lin, [&] { return lin.forward(x); }, 2, 5);
  REQUIRE(s.modules.size() == 1);
  // y = x W^T + b: 2 * K * numel(y) = 2 * 4 * (2 * 5 * 3); the bias adds are not counted
  CHECK(s.forward_flops() == 240);
  CHECK(s.forward_flops_per_sample() == 120);
  CHECK(s.forward_flops_per_token() == 24);
  CHECK(s.root().parameters == 4 * 3 + 3);
  CHECK(s.root().type == "Linear");
  CHECK(s.root().calls == 1);
  // the output (2, 5, 3) f32 is the one tensor the forward made (linear saves x itself)
  CHECK(s.root().activation_bytes == 2 * 5 * 3 * 4);
  CHECK(s.forward_bytes_in_use >= s.root().activation_bytes);
  CHECK(s.uncounted_ops.empty());
}

TEST_CASE("summary: an MLP's FLOPs per child") {
  nn::MLP mlp(4, 8);  // fc1 4 -> 8, GELU, fc2 8 -> 4, dropout 0 (not recorded)
  Tensor x = randn({2, 5, 4});
  nn::ModelSummary s = nn::summarize(mlp, [&] { return mlp.forward(x); }, 2, 5);
  // fc1: 2*4*(10*8) = 640, gelu: 10*8 = 80, fc2: 2*8*(10*4) = 640
  CHECK(s.find("fc1")->flops == 640);
  CHECK(s.find("act")->flops == 80);
  CHECK(s.find("fc2")->flops == 640);
  CHECK(s.find("drop")->flops == 0);
  CHECK(s.forward_flops() == 1360);
  CHECK(s.root().self_flops == 0);
  CHECK(s.root().parameters == (4 * 8 + 8) + (8 * 4 + 4));
  CHECK(s.find("fc1")->parameters == 40);
  CHECK(s.find("fc1")->activation_bytes == 10 * 8 * 4);
  CHECK(s.find("act")->activation_bytes == 10 * 8 * 4);
  check_inclusive(s);
}

TEST_CASE("summary: MultiHeadAttention FLOPs equal the hand count") {
  nn::MultiHeadAttention mha(4, 2);
  Tensor x = randn({2, 5, 4});
  nn::AttentionOptions causal;  // set field by field: a designated temporary trips GCC 12's -Wextra
  causal.causal = true;
  nn::ModelSummary s = nn::summarize(mha, [&] { return mha.forward(x, causal).out; }, 2, 5);
  // qkv: 2*4*(10*12) = 960; attention, B 2, H 2, T 5, hs 2: 2*B*H*T*T*(hs + hs) = 800 (the full
  // T x T even when causal); proj: 2*4*(10*4) = 320
  CHECK(s.find("qkv")->flops == 960);
  CHECK(s.root().self_flops == 800);
  CHECK(s.find("proj")->flops == 320);
  CHECK(s.forward_flops() == 2080);
  CHECK(s.forward_flops_per_token() == 208);
  CHECK(s.root().parameters == 4 * 12 + 12 + 4 * 4 + 4);
  CHECK(s.uncounted_ops.empty());
  check_inclusive(s);
}

TEST_CASE("summary: a transformer block's FLOPs, parameters and activations add up") {
  nn::TransformerBlock block(4, 2, {.mlp_hidden = 8, .causal = true});
  Tensor x = randn({2, 5, 4}).set_requires_grad(true);
  nn::ModelSummary s = nn::summarize(block, [&] { return block.forward(x); }, 2, 5);
  // ln1 7*40 = 280, attn 2080, residual add 40, ln2 280, mlp 1360, residual add 40
  CHECK(s.find("ln1")->flops == 280);
  CHECK(s.find("attn")->flops == 2080);
  CHECK(s.find("ln2")->flops == 280);
  CHECK(s.find("mlp")->flops == 1360);
  CHECK(s.root().self_flops == 80);
  CHECK(s.forward_flops() == 4080);
  CHECK(s.forward_flops_per_sample() == 2040);
  CHECK(s.root().parameters == block.num_parameters());
  CHECK(s.find("attn.qkv")->depth == 2);
  check_inclusive(s);
  CHECK(s.find("attn")->activation_bytes > 0);
  CHECK(s.root().activation_bytes >= s.find("attn")->activation_bytes + s.find("mlp")->activation_bytes);
  CHECK(s.forward_peak_bytes >= s.forward_bytes_in_use);

  const std::string text = s.to_text();
  CHECK(text.find("MultiHeadAttention") != std::string::npos);
  CHECK(text.find("forward of 2 samples (10 tokens): 4.08k FLOPs (2.04k per sample)") != std::string::npos);
  CHECK(s.to_text(1).find("qkv") == std::string::npos);  // folded into attn
}

TEST_CASE("summary: no trace once off, and one at a time") {
  nn::TransformerBlock block(4, 2, {.mlp_hidden = 8});
  Tensor x = randn({2, 3, 4});
  Tensor before = block.forward(x);
  nn::ModelSummary s = nn::summarize(block, [&] { return block.forward(x); }, 2, 3);
  CHECK(s.forward_flops() > 0);
  Tensor after = block.forward(x);
  CHECK(after.to_vector<float>() == before.to_vector<float>());  // bit for bit
  CHECK(set_record_hook(nullptr) == nullptr);                     // the hook was removed
  CHECK(nn::detail::t_module_profiler == nullptr);
  CHECK(grad_enabled());
  {
    NoGradGuard no_grad;  // summarize records regardless, and gives the mode back
    CHECK(nn::summarize(block, [&] { return block.forward(x); }, 2, 3).forward_flops() == s.forward_flops());
    CHECK(!grad_enabled());
  }
  auto nested = [&] {
    nn::summarize(block, [&] { return block.forward(x); }, 1);
    return x;
  };
  CHECK_THROWS_WITH_AS(nn::summarize(block, nested, 1), "summarize: another summarize is already running on this thread",
                       Error);
  CHECK(nn::detail::t_module_profiler == nullptr);
  CHECK_THROWS_WITH_AS(nn::summarize(block, [&] { return x; }, 0),
                       "summarize: need samples >= 1 and tokens_per_sample >= 0, got 0 and 0", Error);
}

TEST_CASE("summary: the FLOP convention of op_flops") {
  bool counted = false;
  CHECK(nn::op_flops("matmul", {{3, 4}, {4, 5}}, {3, 5}, &counted) == 2 * 4 * 15);
  CHECK(counted);
  CHECK(nn::op_flops("softmax", {{2, 6}}, {2, 6}) == 5 * 12);
  CHECK(nn::op_flops("sum", {{2, 6}}, {2}) == 12);
  CHECK(nn::op_flops("permute", {{2, 6}}, {6, 2}, &counted) == 0);
  CHECK(counted);
  CHECK(nn::op_flops("checkpoint", {{2, 6}}, {2, 6}, &counted) == 0);
  CHECK(!counted);
}

// A window or a block mask keeps a part of the Tq x Tk plane and the kernels skip the rest, so the
// recorded node says which part (Node::Recorded::kept) and op_flops counts only that. Hand counts
// on T 8: window 1 keeps the band |i - j| <= 1, 8 * 3 - 2 = 22 pairs; the block-diagonal mask of
// 4 x 4 blocks keeps 2 * 16 = 32; both keep the band inside each diagonal block, 2 * (4 + 3 + 3) = 20.
// A causal mask counts in full by the convention, also beside a window.
TEST_CASE("summary: attention FLOPs count the pairs a window or a block mask keeps") {
  Tensor q = randn({2, 3, 8, 4});
  q.set_requires_grad();
  const Tensor k = randn({2, 3, 8, 4}), v = randn({2, 3, 8, 5});
  double kept = -1;
  const RecordHook before = set_record_hook([&](const Node& n, const Tensor&) {
    if (std::string(n.op) == "scaled_dot_product_attention") kept = n.recorded.kept;
  });
  auto kept_by = [&](SdpaOptions o) {
    kept = -1;
    (void)scaled_dot_product_attention(q, k, v, o);
    return kept;
  };
  SdpaOptions plain, band, blocks, both, causal_band;
  band.window = 1;
  Tensor diag = zeros({2, 2}, DType::b8);
  diag.data<bool>()[0] = diag.data<bool>()[3] = true;
  blocks.block_mask = diag, blocks.block_size = 4;
  both = blocks, both.window = 1;
  causal_band = band, causal_band.causal = true;
  CHECK(kept_by(plain) == 1);
  CHECK(kept_by(band) == doctest::Approx(22.0 / 64));
  CHECK(kept_by(blocks) == doctest::Approx(32.0 / 64));
  CHECK(kept_by(both) == doctest::Approx(20.0 / 64));
  CHECK(kept_by(causal_band) == doctest::Approx(22.0 / 64));
  set_record_hook(before);
  // q k^T and p v: 2 B H P (D + Dv) with P = 22 pairs
  CHECK(nn::op_flops("scaled_dot_product_attention", {q.shape(), k.shape(), v.shape()}, {2, 3, 8, 5}, nullptr,
                     22.0 / 64) == doctest::Approx(2.0 * 2 * 3 * 22 * (4 + 5)));
}
