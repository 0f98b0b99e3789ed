// Anomaly mode: the first op whose output holds a NaN or an Inf raises an AnomalyError naming the
// op, its shapes and the caller's source line; in backward, the first node returning a
// non-finite gradient is named with its forward call's line. Off, nothing is checked.
#include <cmath>
#include <cstring>
#include <limits>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// "test_anomaly.cpp:<line>": how a message names a line of this file.
std::string here(int line) { return fmt::format("test_anomaly.cpp:{}", line); }

// The message of the AnomalyError that f raises ("" when it raises none).
template <class F>
std::string anomaly_of(F f) {
  try {
    f();
  } catch (const AnomalyError& e) {
    return e.what();
  }
  return "";
}

// A layer built from ops, marking its own call as the site to report (as a module's forward
// does): anything that goes wrong inside is reported at the line that called it.
struct LogLinear {
  Tensor w;
  Tensor forward(const Tensor& x, Site site = Site::current()) const {
    const CallSite at("LogLinear", site);
    return log(matmul(x, w));
  }
};

}  // namespace

TEST_CASE("anomaly: the switch and its guard restore the previous mode") {
  CHECK_FALSE(anomaly_enabled());  // off by default
  {
    DetectAnomalyGuard on;
    CHECK(anomaly_enabled());
    {
      DetectAnomalyGuard off(false);
      CHECK_FALSE(anomaly_enabled());
    }
    CHECK(anomaly_enabled());
  }
  CHECK_FALSE(anomaly_enabled());
  detect_anomaly(true);
  CHECK(anomaly_enabled());
  detect_anomaly(false);
  CHECK_FALSE(anomaly_enabled());
}

TEST_CASE("anomaly: log of a negative entry names 'log', its shapes and the calling line") {
  DetectAnomalyGuard anomaly;
  Tensor x = tensor({1.f, -2.f, 3.f});
  const int line = __LINE__ + 1;
  const std::string msg = anomaly_of([&] { return log(x); });
  INFO(msg);
  CHECK(msg.find("anomaly: 'log' produced 1 non-finite value (of 3; the first, nan, at flat index 1)") !=
        std::string::npos);
  CHECK(msg.find("in its output of shape [3] f32") != std::string::npos);
  CHECK(msg.find("input 0: [3] f32;") != std::string::npos);  // finite: no "already non-finite"
  CHECK(msg.find("already") == std::string::npos);
  CHECK(msg.find("called at ") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  // an ag::Error: code catching those sees it too
  AG_CHECK_ERROR(log(x), "anomaly", "'log'");
  // the same op on a requires-grad input (recording) raises the same way
  Tensor xg = tensor({1.f, -2.f, 3.f}).set_requires_grad(true);
  CHECK(anomaly_of([&] { return log(xg); }).find("'log' produced 1 non-finite value") != std::string::npos);
}

TEST_CASE("anomaly: an input that was already non-finite is named") {
  DetectAnomalyGuard anomaly;
  const double inf = std::numeric_limits<double>::infinity();
  Tensor a = tensor<double>({1, inf, 3, 4}, {2, 2}), b = tensor<double>({1, 1});  // broadcast [2] -> [2,2]
  const int line = __LINE__ + 1;
  const std::string msg = anomaly_of([&] { return add(a, b); });
  INFO(msg);
  CHECK(msg.find("'add' produced 1 non-finite value (of 4; the first, inf, at flat index 1)") != std::string::npos);
  CHECK(msg.find("input 0: [2,2] f64 (already non-finite: 1 of 4 values); input 1: [2,2] f64") !=
        std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
}

TEST_CASE("anomaly: an op inside a composite op reports its own name and the user's line") {
  DetectAnomalyGuard anomaly;
  // mse_loss is sub, mul and mean: 1e30 - (-1e30) = 2e30 is a finite f32, its square is not
  Tensor x = tensor({1e30f, 0.f}), t = tensor({-1e30f, 0.f});
  const int line = __LINE__ + 1;
  std::string msg = anomaly_of([&] { return mse_loss(x, t); });
  INFO(msg);
  CHECK(msg.find("anomaly: 'mul' (inside 'mse_loss') produced 1 non-finite value (of 2; the first, inf") !=
        std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK(msg.find("loss.cpp") == std::string::npos);  // not the line inside mse_loss
  // mean is sum, then div: the sum of two large f32 overflows
  Tensor big = tensor({3e38f, 3e38f});
  const int line2 = __LINE__ + 1;
  msg = anomaly_of([&] { return mean(big); });
  CHECK(msg.find("'sum' (inside 'mean') produced 1 non-finite value") != std::string::npos);
  CHECK(msg.find(here(line2)) != std::string::npos);
  // after an error the site is free again: a direct call reports its own line
  const int line3 = __LINE__ + 1;
  msg = anomaly_of([&] { return sqrt(tensor({-1.f})); });
  CHECK(msg.find("anomaly: 'sqrt' produced") != std::string::npos);
  CHECK(msg.find(here(line3)) != std::string::npos);
}

TEST_CASE("anomaly: a layer marking its CallSite is reported at the line that called it") {
  DetectAnomalyGuard anomaly;
  LogLinear layer{tensor({1.f, -1.f}, {2, 1})};
  Tensor x = tensor({1.f, 2.f}, {1, 2});  // x w = 1 - 2 = -1: its log is NaN
  const int line = __LINE__ + 1;
  const std::string msg = anomaly_of([&] { return layer.forward(x); });
  INFO(msg);
  CHECK(msg.find("'log' (inside 'LogLinear') produced 1 non-finite value") != std::string::npos);
  CHECK(msg.find("input 0: [1,1] f32") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
}

TEST_CASE("anomaly: sqrt at 0 is finite forward, infinite backward: backward names the 'sqrt' node") {
  DetectAnomalyGuard anomaly;
  Tensor x = tensor<double>({0, 4}).set_requires_grad(true);
  const int line = __LINE__ + 1;
  Tensor y = sqrt(x);  // [0, 2]: finite
  Tensor L = sum(y);
  CHECK(L.item<double>() == 2);
  const uint64_t seq = y.grad_fn()->seq;
  CHECK(y.grad_fn()->debug.site.line() == unsigned(line));  // stored at record time, anomaly mode being on
  CHECK(std::string(y.grad_fn()->debug.site_op) == "sqrt");
  const std::string msg = anomaly_of([&] { L.backward(); });
  INFO(msg);
  // dx = g / (2 y) = 1 / 0 at x = 0
  CHECK(msg.find(fmt::format("anomaly: backward of 'sqrt' (node #{}) returned 1 non-finite value (of 2; the first, "
                             "inf, at flat index 0) in the gradient of input 0 of shape [2]",
                             seq)) != std::string::npos);
  CHECK(msg.find("the gradient of its output (shape [2]) was finite") != std::string::npos);
  CHECK(msg.find("the forward op was called at") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK_FALSE(x.grad().defined());  // nothing half-accumulated reached the leaf
  // the sum node ran before and had its gradient measured (anomaly mode tracks norms)
  CHECK(L.grad_fn()->debug.grad_norm == 1.0);
}

TEST_CASE("anomaly: off, nothing is checked: NaN and Inf propagate") {
  CHECK_FALSE(anomaly_enabled());
  Tensor y = log(tensor({1.f, -2.f, 3.f}));
  auto v = y.to_vector<float>();
  CHECK(v[0] == 0);
  CHECK(std::isnan(v[1]));
  Tensor x = tensor<double>({0, 4}).set_requires_grad(true);
  Tensor L = sum(sqrt(x));
  CHECK(L.grad_fn()->debug.site_op == nullptr);  // no site stored
  L.backward();
  auto g = x.grad().to_vector<double>();
  CHECK(std::isinf(g[0]));
  CHECK(g[1] == doctest::Approx(0.25));
  CHECK(L.grad_fn()->debug.grad_norm == -1);  // norms not tracked
}

TEST_CASE("anomaly: intended infinities pass: -inf attention masks and the softmax that reads them") {
  DetectAnomalyGuard anomaly;
  const double inf = std::numeric_limits<double>::infinity();
  Tensor s = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2}).set_requires_grad(true);
  Tensor mask = tensor<bool>({false, true, false, false}, {2, 2});
  Tensor w = softmax(masked_fill(s, mask, -inf));
  check_close(w, {1, 0, 1 / (1 + std::exp(1.0)), std::exp(1.0) / (1 + std::exp(1.0))});
  sum(mul(w, w)).backward();
  CHECK(s.grad().defined());
  // the composed attention path masks with -inf too
  Generator g(3);
  Tensor q = randn({1, 1, 3, 4}, DType::f32, &g), k = randn({1, 1, 3, 4}, DType::f32, &g),
         v = randn({1, 1, 3, 4}, DType::f32, &g);
  SdpaOptions o;
  o.causal = true;
  o.return_weights = true;
  SdpaResult r = scaled_dot_product_attention(q, k, v, o);
  CHECK(r.weights.to_vector<float>()[1] == 0);
  // but a NaN where still counts
  CHECK(anomaly_of([&] { return masked_fill(s, mask, std::nan("")); }).find("'where' (inside 'masked_fill') produced "
                                                                            "1 NaN value") != std::string::npos);
}

TEST_CASE("anomaly: operators report the operator's line in ops.h, wrapped in a CallSite the caller's") {
  DetectAnomalyGuard anomaly;
  Tensor a = tensor({1e30f}), b = tensor({1e30f});
  CHECK(anomaly_of([&] { return a * b; }).find("ops.h:") != std::string::npos);
  const int line = __LINE__ + 1;
  const CallSite at("a * b", Site::current());
  const std::string msg = anomaly_of([&] { return a * b; });
  CHECK(msg.find("'mul' (inside 'a * b')") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
}

TEST_CASE("anomaly: a finite training step gives bitwise the same loss and gradients as without") {
  // x [8, 6] -> linear 6->5 -> layer_norm -> gelu -> linear 5->3 -> cross_entropy; three SGD steps
  auto run = [](bool anomaly) {
    DetectAnomalyGuard mode(anomaly);
    Generator g(11);
    Tensor x = randn({8, 6}, DType::f32, &g);
    Tensor w1 = mul(randn({5, 6}, DType::f32, &g), 0.4).detach().set_requires_grad(true);
    Tensor b1 = zeros({5}).set_requires_grad(true);
    Tensor w2 = mul(randn({3, 5}, DType::f32, &g), 0.4).detach().set_requires_grad(true);
    Tensor b2 = zeros({3}).set_requires_grad(true);
    Tensor y = tensor<int64_t>({0, 1, 2, 0, 1, 2, 0, 1});
    std::vector<float> out;
    for (int step = 0; step < 3; ++step) {
      Tensor h = gelu(layer_norm(linear(x, w1, b1), {5}));
      Tensor loss = cross_entropy(linear(h, w2, b2), y);
      loss.backward();
      out.push_back(loss.item<float>());
      NoGradGuard no_grad;
      for (Tensor* p : {&w1, &b1, &w2, &b2}) {
        for (float v : p->grad().to_vector<float>()) out.push_back(v);
        p->add_(p->grad(), -0.5);
        p->set_grad(Tensor());
      }
    }
    return out;
  };
  const std::vector<float> off = run(false), on = run(true);
  REQUIRE(off.size() == on.size());
  CHECK(std::memcmp(off.data(), on.data(), off.size() * sizeof(float)) == 0);
  const size_t stride = 1 + 30 + 5 + 15 + 3;  // per step: the loss, then every gradient
  REQUIRE(off.size() == 3 * stride);
  CHECK(std::isfinite(off[0]));
  CHECK(off[0] != off[stride]);  // the steps moved the parameters
  CHECK(off[stride] != off[2 * stride]);
}
