// An outside project built against an installed attograd (find_package(attograd)):
//   1. trains a two-layer MLP on a toy regression for a few AdamW steps, and fails unless the loss
//      falls;
//   2. checks a user-written op and the MLP's backward with ag::testing::gradcheck, and compares
//      cpu and GPU with ag::testing::compare_devices (skipped without a GPU).
// Exits non-zero when any of that fails, so scripts/check-install.sh can rely on it.
#include <cstdio>
#include <vector>

#include "attograd.h"
#include "autograd/testing.h"
#include "nn/linear.h"
#include "optim/adam.h"

using namespace ag;

// A user's op composed from attograd's: softplus(x) = log(1 + exp(x)),  d/dx = sigmoid(x).
Tensor softplus(const Tensor& x) { return log(add(exp(x), 1.0)); }

struct Mlp : nn::UnaryModule {  // x (N, 1) -> y (N, 1)
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit Mlp(DType dtype, Generator* gen) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(1, 16, true, dtype, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 1, true, dtype, gen));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(softplus(fc1->forward(x))); }
};

int main() {
  int failures = 0;

  // ---- 1. a few training steps: fit y = x^2 on [-1, 1] ----
  Generator gen(7);
  Mlp model(DType::f32, &gen);
  optim::AdamW opt(model.parameters(), {.lr = 3e-2, .weight_decay = 0.0});
  Tensor x = rand({64, 1}, DType::f32, &gen, -1.0, 1.0);
  Tensor y = mul(x, x);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    Tensor loss = mse_loss(model(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item<double>();
    if (step == 0) first = last;
    if (step % 10 == 0 || step == 29) std::printf("step %2d  loss %.5f\n", step, last);
  }
  if (!(last < 0.5 * first)) {
    std::printf("FAIL: the loss did not halve (%.5f -> %.5f)\n", first, last);
    ++failures;
  }

  // ---- 2. the public test API on the user's op and layer ----
  Tensor xs = randn({3, 4}, DType::f64, &gen).set_requires_grad(true);
  auto softplus_fn = [](const std::vector<Tensor>& in) { return softplus(in[0]); };
  testing::GradcheckResult g1 = testing::gradcheck(softplus_fn, {xs});
  std::printf("softplus: %s\n", g1.message.c_str());
  failures += !g1;

  Mlp model64(DType::f64, &gen);  // gradcheck works in f64: the input gradient through both layers
  Tensor x64 = randn({5, 1}, DType::f64, &gen).set_requires_grad(true);
  auto mlp_fn = [&model64](const std::vector<Tensor>& in) { return model64(in[0]); };
  testing::GradcheckResult g2 = testing::gradcheck(mlp_fn, {x64});
  std::printf("mlp:      %s\n", g2.message.c_str());
  failures += !g2;

  testing::CompareResult c = testing::compare_devices(softplus_fn, {xs});
  std::printf("cpu vs cuda: %s\n", c.message.c_str());
  failures += !c;

  if (failures) {
    std::printf("consumer: %d check(s) FAILED\n", failures);
    return 1;
  }
  std::printf("consumer: all checks passed\n");
  return 0;
}
