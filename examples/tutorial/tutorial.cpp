// attograd in one file: from nothing to a trained attention model. Read it top to bottom.
//   build/tutorial [seed]    about a second on the CPU. Exits 1 unless the held-out accuracy
//                            passes kPass; the test suite runs it ("tutorial: ..." in CTest).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "attograd.h"          // tensors, ops, the tape, random numbers, threads
#include "autograd/testing.h"  // ag::testing::gradcheck
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/positional.h"
#include "nn/transformer.h"
#include "optim/adam.h"

using namespace ag;

// ---- 1. A task that needs attention: sort the sequence -------------------------------------------
//   input   3 1 4 1 5 9 2 6        T = 8 tokens drawn from a vocabulary of V = 10
//   target  1 1 2 3 4 5 6 9        target[t] = the t-th smallest input token
// Output t depends on every token of the input, and attention is the one layer that moves
// information between positions. Without it a position sees only its own token and where it is:
// it can guess 0 near the start and 9 near the end, and no more (far below kPass).
constexpr int64_t V = 10, T = 8;

struct Batch {
  Tensor x, y;  // tokens, targets: i64 (B, T)
};
Batch make_batch(int64_t B, Generator& gen) {
  Tensor x = randint(0, V, {B, T}, &gen);
  std::vector<int64_t> y = x.to_vector<int64_t>();
  for (int64_t b = 0; b < B; ++b) std::sort(y.begin() + b * T, y.begin() + (b + 1) * T);
  return {x, from_vector(y, {B, T})};
}

// ---- 2. The model: tokens -> vectors -> one transformer block -> scores per position -----------
//   x (B, T) i64 -> tok(x) + pos(T)   (B, T, d)   what each token is, and where it is
//               -> block              (B, T, d)   h + attn(ln1(h)), then h + mlp(ln2(h))
//               -> head               (B, T, V)   a score for each vocabulary entry
// Every layer comes from nn/; register_module names the parameters ("block.attn.qkv.weight").
struct Sorter : nn::Module {
  std::shared_ptr<nn::Embedding> tok;
  std::shared_ptr<nn::LearnedPositions> pos;
  std::shared_ptr<nn::TransformerBlock> block;
  std::shared_ptr<nn::Linear> head;
  Sorter(int64_t d, int64_t heads, Generator* gen) {
    tok = register_module("tok", std::make_shared<nn::Embedding>(V, d, std::nullopt, DType::f32, gen));
    pos = register_module("pos", std::make_shared<nn::LearnedPositions>(T, d, DType::f32, gen));
    // not causal: to sort, every position needs to see the whole sequence
    const nn::TransformerBlock::Options block_options{.mlp_hidden = 4 * d, .causal = false, .generator = gen};
    block = register_module("block", std::make_shared<nn::TransformerBlock>(d, heads, block_options));
    head = register_module("head", std::make_shared<nn::Linear>(d, V, true, DType::f32, gen));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = tok->forward(x) + pos->forward(T);  // (B, T, d) + (T, d): broadcast over B
    return head->forward(block->forward(h));
  }
};

// The predictions (B, T): the highest score wins. NoGradGuard: no tape is recorded.
Tensor predict(Sorter& model, const Tensor& x) {
  NoGradGuard no_grad;
  return argmax(model.forward(x), 2);
}

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const int64_t B = 64, steps = 300, d = 32, heads = 2;
  // kPass sits between the held-out accuracy with attention and without it (forward returning
  // head->forward(h + block->mlp->forward(block->ln2->forward(h)))): the test fails without attention.
  const double kPass = 0.95;
  set_num_threads(1);  // a model this small runs fastest on one thread
  const auto t0 = std::chrono::steady_clock::now();
  Generator gen(seed);

  // ---- 3. Check one piece of the math: attention's backward against finite differences --------
  // gradcheck nudges each input element by +-eps, measures how sum(r * f) moves (r random) and
  // compares that with what backward() computed; in f64, on small shapes (docs/math/autograd.md).
  std::vector<Tensor> qkv;  // q, k, v: (B=1, H=1, T=3, hs=4)
  for (int i = 0; i < 3; ++i) qkv.push_back(randn({1, 1, 3, 4}, DType::f64, &gen).set_requires_grad(true));
  auto attention = [](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2]).out; };
  testing::GradcheckResult check = testing::gradcheck(attention, qkv);
  std::printf("gradcheck of softmax(q k^T / sqrt(4)) v: %s\n", check.message.c_str());
  if (!check) return 1;

  // ---- 4. Train: forward, loss, backward, step ------------------------------------------------
  Sorter model(d, heads, &gen);
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  std::printf("model: %lld parameters; a uniform guess would score %.0f%%\n", (long long)model.num_parameters(),
              100.0 / V);
  for (int64_t step = 1; step <= steps; ++step) {
    Batch b = make_batch(B, gen);                                                   // fresh sequences
    Tensor logits = model.forward(b.x);                                             // (B, T, V)
    Tensor loss = cross_entropy(logits.reshape({B * T, V}), b.y.reshape({B * T}));  // mean over tokens
    opt.zero_grad();
    loss.backward();  // the tape replayed in reverse: every parameter gets its .grad
    opt.step();       // AdamW moves each parameter against its gradient
    if (step == 1 || step % 50 == 0) std::printf("step %3lld  loss %.4f\n", (long long)step, loss.item<double>());
  }

  // ---- 5. Evaluate on sequences from another generator, never trained on ----------------------
  Generator held_out(seed + 1000);
  Batch test = make_batch(1000, held_out);
  Tensor pred = predict(model, test.x);
  const double acc = mean(eq(pred, test.y).to(DType::f32)).item<double>();
  std::vector<int64_t> x = test.x.to_vector<int64_t>(), p = pred.to_vector<int64_t>();
  std::printf("example:");
  for (int64_t t = 0; t < T; ++t) std::printf(" %lld", (long long)x[size_t(t)]);
  std::printf("  ->");
  for (int64_t t = 0; t < T; ++t) std::printf(" %lld", (long long)p[size_t(t)]);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nheld-out accuracy %.1f%% of %lld tokens (pass: above %.0f%%), %.1f s\n", 100 * acc,
              (long long)test.y.numel(), 100 * kPass, secs);
  return acc > kPass ? 0 : 1;
}
