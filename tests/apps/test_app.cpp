// apps/common/app.h and the shared rules of apps/common/options.h and run.h that every app's
// main() relies on: one exit code per kind of failure, the validation split, and the step's
// gradients with the fp16 loss scale.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/common/app.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "data/images.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

// App::main on `args` (after the program name) with a check and a body that may throw; returns
// the exit code. The run directory goes to `out` so that nothing is written elsewhere.
int run_main(std::vector<std::string> args, const std::function<void()>& check, const std::function<int()>& body,
             const std::string& out) {
  App app("demo", "a test of the frame");
  app.o = {.steps = 7};
  app.add_run_options();
  int64_t width = 4;
  app.cli.add_option("--width", width, "a model size")->check(positive());
  args.insert(args.begin(), "demo");
  args.insert(args.end(), {"--out", out, "--threads", "1"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return app.main(int(argv.size()), argv.data(), check, body);
}

}  // namespace

TEST_CASE("app: each kind of failure has its exit code, the body's value is the exit code") {
  const AutocastGuard restore(Precision::fp32);  // apply_run_options sets the thread's precision
  TempDir tmp("app_main");
  const std::string out = tmp.file("run");
  const auto ok = [] { return 0; };
  CHECK(run_main({}, nullptr, ok, out) == 0);
  CHECK(run_main({}, nullptr, [] { return 7; }, out) == 7);
  // the command line: a bad flag, a bad value (CLI11's checks), --help
  CHECK(run_main({"--bogus"}, nullptr, ok, out) == kExitUsage);
  CHECK(run_main({"--width", "0"}, nullptr, ok, out) == kExitUsage);
  CHECK(run_main({"--help"}, nullptr, ok, out) == 0);
  // apply_run_options' checks of combinations (--stop-at past --steps)
  CHECK(run_main({"--stop-at", "9"}, nullptr, ok, out) == kExitUsage);
  // the app's own checks, and a usage error found while working (an option --eval-only ignores)
  CHECK(run_main({}, [] { usage_check(false, "demo: --width 3: odd"); }, ok, out) == kExitUsage);
  CHECK(run_main({}, nullptr, []() -> int { throw UsageError("demo: --resume: another schedule"); }, out) ==
        kExitUsage);
  // missing data: 2, with the install hint in its message; any other error: 1
  CHECK(run_main({}, nullptr, []() -> int { throw data::DatasetNotFound("no files; apt install x"); }, out) ==
        kExitNoData);
  CHECK(run_main({}, nullptr, []() -> int { fail("demo: the checkpoint is broken"); }, out) == kExitError);
  CHECK(run_main({}, nullptr, []() -> int { throw std::runtime_error("malformed JSON"); }, out) == kExitError);
  CHECK(kExitNoData == 2);
  CHECK(kExitError == 1);
}

TEST_CASE("app: the options given on the command line are known to the app, and the defaults it set are kept") {
  const AutocastGuard restore(Precision::fp32);
  TempDir tmp("app_given");
  App app("demo", "a test of the frame");
  app.o = {.steps = 40, .batch = 16, .lr = 3e-3};
  app.add_run_options();
  const std::vector<std::string> args = {"demo", "--lr", "0.01", "--out", tmp.file("r"), "--threads", "1"};
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  RunOptions seen;
  CHECK(app.main(int(argv.size()), argv.data(), nullptr, [&] {
    seen = app.o;
    return 0;
  }) == 0);
  CHECK(seen.steps == 40);
  CHECK(seen.batch == 16);
  CHECK(seen.lr == 0.01);
  CHECK(was_given(seen, "--lr"));
  CHECK_FALSE(was_given(seen, "--steps"));
  CHECK(seen.command_line == args);
  CHECK(seen.eval_every == 4);  // derived from --steps 40: ten evaluations
}

TEST_CASE("app: the validation split is 10% of the training set, at least 1 and at most 5000") {
  CHECK(validation_size(-1, 60000) == 5000);  // capped
  CHECK(validation_size(-1, 50000) == 5000);
  CHECK(validation_size(-1, 49990) == 4999);  // 10%, rounded down
  CHECK(validation_size(-1, 8000) == 800);
  CHECK(validation_size(-1, 9) == 1);          // at least one
  CHECK(validation_size(-1, 2) == 1);
  CHECK(validation_size(0, 100) == 0);         // none: the last model is tested
  CHECK(validation_size(30, 100) == 30);       // a count is taken as it is
  AG_CHECK_ERROR(validation_size(-1, 1), "--val-size 1", "leaves no training sample", "has 1");
  AG_CHECK_ERROR(validation_size(100, 100, "--val-texts"), "--val-texts 100", "has 100");
}

TEST_CASE("app: compute_gradients zeroes the gradients and scales the backward by the fp16 loss scale") {
  Generator gen(3);
  nn::Linear lin(3, 1, true, DType::f32, &gen);
  optim::AdamW opt(lin.parameters(), {.lr = 0.1});
  const Tensor x = randn({4, 3}, DType::f32, &gen), y = randn({4, 1}, DType::f32, &gen);
  // the reference: d/dw of the mean squared error, by hand: 2/N sum_i (w.x_i + b - y_i) x_i
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const std::vector<float> w = lin.weight.to_vector<float>(), b = lin.bias.to_vector<float>();
  std::vector<double> dw(3, 0.0);
  double loss_ref = 0;
  for (int i = 0; i < 4; ++i) {
    double r = b[0] - yv[size_t(i)];
    for (int j = 0; j < 3; ++j) r += double(w[size_t(j)]) * xv[size_t(i * 3 + j)];
    loss_ref += r * r / 4;
    for (int j = 0; j < 3; ++j) dw[size_t(j)] += 2.0 / 4 * r * xv[size_t(i * 3 + j)];
  }
  for (const double scale : {1.0, 1024.0}) {
    CAPTURE(scale);
    for (Tensor p : lin.parameters()) p.set_grad(full(p.shape(), 5.0));  // stale: must not be added to
    const double loss = compute_gradients(opt, mse_loss(lin.forward(x), y), scale);
    CHECK(loss == doctest::Approx(loss_ref).epsilon(1e-6));  // unscaled
    const std::vector<float> g = lin.weight.grad().to_vector<float>();
    // f32 sums of 4 terms of size ~1: within 1e-5 relative; the scale is a power of two, exact
    for (int j = 0; j < 3; ++j) CHECK(g[size_t(j)] == doctest::Approx(scale * dw[size_t(j)]).epsilon(1e-5));
  }
}
