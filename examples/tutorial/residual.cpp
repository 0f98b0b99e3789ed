// The measurements of docs/math/transformer-block.md: what the residual additions and the scaled
// initialisation do to a stack of transformer blocks at init.
//   build/residual    prints two tables; exits 1 when one of the page's claims does not hold
//
// L blocks (d 64, 4 heads, MLP 256) on x0 (B 4, T 16, d 64), wired three ways from the parts of
// the same nn::TransformerBlock:
//   pre-LN       h = x + attn(ln1(x));  y = h + mlp(ln2(h))     what TransformerBlock::forward does
//   post-LN      h = ln1(x + attn(x));  y = ln2(h + mlp(h))     the original Transformer (2017)
//   no residual  h = attn(ln1(x));      y = mlp(ln2(h))         the additions taken out
// Initialisation as GPT-2 (apps/common/gpt2_style.h): every weight matrix N(0, 0.02), biases 0,
// LayerNorm (1, 0), and attn.proj, mlp.fc2 (the two that write into the residual stream)
// N(0, 0.02 / sqrt(2 L)).
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "attograd.h"
#include "nn/transformer.h"

using namespace ag;

enum class Wiring { pre_ln, post_ln, no_residual };

Tensor block_forward(nn::TransformerBlock& b, const Tensor& x, Wiring w) {
  if (w == Wiring::pre_ln) return b.forward(x);
  if (w == Wiring::post_ln) {
    Tensor h = b.ln1->forward(x + b.attn->forward(x).out);
    return b.ln2->forward(h + b.mlp->forward(h));
  }
  Tensor h = b.attn->forward(b.ln1->forward(x)).out;
  return b.mlp->forward(b.ln2->forward(h));
}

struct Stack {
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
  // scale_residual false: attn.proj and mlp.fc2 get N(0, 0.02) like the other weights.
  Stack(int L, bool scale_residual, Generator& gen) {
    NoGradGuard no_grad;
    const double std_resid = scale_residual ? 0.02 / std::sqrt(2.0 * L) : 0.02;
    for (int l = 0; l < L; ++l) {
      blocks.push_back(std::make_shared<nn::TransformerBlock>(
          64, 4, nn::TransformerBlock::Options{.mlp_hidden = 256, .generator = &gen}));
      for (auto& [n, p] : blocks.back()->named_parameters()) {
        const bool resid = n == "attn.proj.weight" || n == "mlp.fc2.weight";
        if (p.ndim() == 2) p.copy_(randn(p.shape(), DType::f32, &gen, 0.0, resid ? std_resid : 0.02));
        else if (n.ends_with("bias")) p.fill_(0.0);
      }
    }
  }
  Tensor forward(Tensor x, Wiring w) {
    for (auto& b : blocks) x = block_forward(*b, x, w);
    return x;
  }
};

double norm(const Tensor& t) { return std::sqrt(sum(t * t).item<double>()); }

int main() {
  set_num_threads(1);
  Generator gen(0);
  const Tensor x0_data = randn({4, 16, 64}, DType::f32, &gen);  // N(0, 1)
  std::vector<const char*> failed;  // the statements that did not hold, printed at the end
  auto claim = [&](bool holds, const char* what) {
    if (!holds) failed.push_back(what);
  };

  // The loss is sum(r * xL) for a fixed r ~ N(0, 1) of xL's shape: the gradient arriving at the
  // top is r, and what backward() leaves in x0.grad is r carried down through every block.
  std::printf("1. |dL/dx0| / |dL/dxL|: how much gradient reaches the input of L blocks, x0 ~ N(0, 1)\n");
  std::printf("%5s %12s %12s %12s\n", "L", "pre-LN", "post-LN", "no residual");
  for (int L : {1, 2, 4, 8, 16, 32}) {
    std::printf("%5d", L);
    for (Wiring w : {Wiring::pre_ln, Wiring::post_ln, Wiring::no_residual}) {
      Generator g(L);
      Stack s(L, true, g);
      Tensor x0 = x0_data.clone().set_requires_grad(true);
      Tensor xL = s.forward(x0, w);
      Tensor r = randn(xL.shape(), DType::f32, &g);
      sum(r * xL).backward();
      const double ratio = norm(x0.grad()) / norm(r);
      std::printf(" %12.3g", ratio);
      if (w == Wiring::pre_ln) claim(ratio > 0.9 && ratio < 1.1, "pre-LN passes the gradient down at every L");
      if (w == Wiring::no_residual && L == 32) claim(ratio < 1e-2, "without residuals it shrinks below 1%");
    }
    std::printf("\n");
  }

  // Forward only: the spread of x_L when x0 has GPT-2's embedding scale.
  std::printf("\n2. std of the residual stream after L pre-LN blocks, x0 ~ N(0, 0.02^2)\n");
  std::printf("%5s %20s %20s\n", "L", "proj, fc2: 0.02", "0.02 / sqrt(2 L)");
  std::vector<double> first(2), last(2);
  for (int L : {1, 4, 16, 48}) {
    std::printf("%5d", L);
    for (int scaled : {0, 1}) {
      NoGradGuard no_grad;
      Generator g(L);
      Stack s(L, scaled == 1, g);
      const double sd = std::sqrt(var(s.forward(x0_data * 0.02, Wiring::pre_ln)).item<double>());
      std::printf(" %20.4f", sd);
      (L == 1 ? first : last)[size_t(scaled)] = sd;
    }
    std::printf("\n");
  }
  claim(last[0] > 3 * first[0], "with 0.02 everywhere the stream grows with depth");
  claim(last[1] < 1.5 * first[1], "with the scaled projections it stays put");
  for (const char* what : failed) std::printf("FAILED: %s\n", what);
  return failed.empty() ? 0 : 1;
}
