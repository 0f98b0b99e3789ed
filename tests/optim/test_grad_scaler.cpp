// optim::GradScaler (optim/grad_scaler.h): dynamic loss scaling for fp16 autocast.
//   - a loss whose gradients underflow in fp16 (they vanish in the backward GEMMs) trains with the
//     scaler to the f32 gradients within half's rounding
//   - an overflow skips the step (parameters and AdamW state untouched) and halves the scale;
//     growth_interval finite steps double it
//   - bad options and bad loaded states are refused
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f32, &g);
}
}  // namespace

TEST_CASE("grad scaler: gradients that vanish in fp16 come back with the scale") {
  // L = 1e-7 * sum(x W^T): dL/dy = 1e-7 per element, below half's smallest subnormal 2^-24 ~ 6e-8
  // after rounding (1e-7 rounds to 2^-23 ~ 1.2e-7, not 0; use 2e-8, which rounds to 0)
  const double tiny = 2e-8;
  Tensor x = rnd({16, 32}, 1);
  Tensor w = rnd({8, 32}, 2).set_requires_grad(true);
  auto loss_of = [&] { return mul(sum(linear(x, w)), tiny); };
  // the f32 gradient: dL/dW[o, i] = tiny * sum_r x[r, i]
  Tensor want = mul(sum(x, {0}, true).expand({8, 32}), tiny).contiguous();
  {
    AutocastGuard fp16(Precision::fp16);
    loss_of().backward();
  }
  CHECK(max(abs(w.grad())).item<double>() == 0);  // all lost without scaling
  w.set_grad(Tensor());
  optim::GradScaler scaler;  // S = 2^16: tiny * S = 1.3e-3, well inside half's range
  {
    AutocastGuard fp16(Precision::fp16);
    scaler.scale(loss_of()).backward();
  }
  scaler.unscale({w});
  // what the fp16 GEMM computes: dW[o, i] = round(tiny S) / S * sum_r round(x[r, i]), the rounded
  // operands multiplied exactly and summed in f32
  const double g16 = round_fp16(full({1}, tiny * scaler.get_scale())).item<double>() / scaler.get_scale();
  Tensor exact = mul(sum(round_fp16(x), {0}, true).expand({8, 32}), g16).contiguous();
  check_close(w.grad(), exact, 1e-15, 1e-5);
  // and that is the f32 gradient up to half's rounding of x and of tiny S (sums of 16 values that
  // partly cancel: an absolute bound relative to the largest entry)
  const double scale = max(abs(want)).item<double>();
  check_close(w.grad(), want, 4e-3 * scale, 0);
  CHECK(scale > 0);
}

TEST_CASE("grad scaler: an overflow skips the step and halves the scale, finite steps grow it") {
  Tensor w = ones({4}).set_requires_grad(true);
  optim::AdamW opt({w}, {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  CHECK(scaler.get_scale() == 1024);
  // an inf gradient: no step, no AdamW state, the gradient dropped, S = 512
  w.set_grad(tensor({1.f, std::numeric_limits<float>::infinity(), 1.f, 1.f}));
  CHECK_FALSE(scaler.step(opt));
  CHECK(w.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK_FALSE(w.grad().defined());
  CHECK(opt.state_dict().size() == 1 + 4);  // hyper-parameters only: no "state.0.*" yet
  CHECK(scaler.get_scale() == 512);
  CHECK(scaler.growth_tracker() == 0);
  // three finite steps: the third doubles S back to 1024; the gradients were divided by S first
  for (int i = 1; i <= 3; ++i) {
    w.set_grad(full({4}, 512.0 * 0.25));  // a true gradient of 0.25 scaled by 512
    const double s = scaler.get_scale();
    CHECK(scaler.step(opt));
    if (i < 3) CHECK(scaler.growth_tracker() == i);
    CHECK(scaler.get_scale() == (i < 3 ? s : 1024));
  }
  CHECK(scaler.growth_tracker() == 0);
  CHECK(w.to_vector<float>()[0] < 1.f);  // AdamW moved it
  // NaN counts as an overflow too
  w.set_grad(full({4}, std::nan("")));
  CHECK_FALSE(scaler.step(opt));
  CHECK(scaler.get_scale() == 512);

  // unscale divides exactly by S (a power of two)
  optim::GradScaler s2({.init_scale = 8});
  Tensor v = zeros({2}).set_requires_grad(true);
  v.set_grad(tensor({3.f, -5.f}));
  s2.unscale({v, ones({1})});  // a parameter without a gradient is skipped
  CHECK(v.grad().to_vector<float>() == std::vector<float>{0.375f, -0.625f});
  CHECK(s2.scale(tensor({2.f})).item<float>() == 16.f);
}

TEST_CASE("grad scaler: bad options and loaded states are refused") {
  AG_CHECK_ERROR(optim::GradScaler({.init_scale = 0}), "GradScaler", "init_scale", "0");
  AG_CHECK_ERROR(optim::GradScaler({.init_scale = 1, .growth_factor = 1}), "GradScaler", "growth_factor");
  AG_CHECK_ERROR(optim::GradScaler({.init_scale = 1, .growth_factor = 2, .backoff_factor = 1}), "backoff_factor");
  AG_CHECK_ERROR(optim::GradScaler({.init_scale = 1, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 0}),
                 "growth_interval");
  optim::GradScaler s;
  AG_CHECK_ERROR(s.load_state(std::numeric_limits<double>::infinity(), 0), "GradScaler", "scale", "inf");
  AG_CHECK_ERROR(s.load_state(2.0, -1), "GradScaler", "tracker", "-1");
  s.load_state(256, 7);
  CHECK(s.get_scale() == 256);
  CHECK(s.growth_tracker() == 7);
}
