// The tape's hooks (autograd/tape.h): the record hook sees every recorded node, the gradient-ready
// hook fires once per leaf when its gradient is final, and both are off (and cost nothing) unset.
#include <map>
#include <string>
#include <vector>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
Tensor s64(double v) { return scalar_tensor(v, DType::f64).set_requires_grad(true); }

// Installs a hook for one test case and restores the previous one after it, even on failure.
struct RecordHookGuard {
  explicit RecordHookGuard(RecordHook h) : prev(set_record_hook(std::move(h))) {}
  ~RecordHookGuard() { set_record_hook(std::move(prev)); }
  RecordHook prev;
};
struct GradReadyHookGuard {
  explicit GradReadyHookGuard(GradReadyHook h) : prev(set_grad_ready_hook(std::move(h))) {}
  ~GradReadyHookGuard() { set_grad_ready_hook(std::move(prev)); }
  GradReadyHook prev;
};
}  // namespace

TEST_CASE("tape hooks: the record hook sees each recorded node with its output") {
  std::vector<std::string> ops;
  std::vector<Shape> shapes;
  RecordHookGuard guard([&](const Node& n, const Tensor& out) {
    ops.push_back(n.op);
    shapes.push_back(out.shape());
    CHECK(n.recorded.out_shape == out.shape());
  });
  Tensor x = leaf64({2, 3});
  Tensor y = sum(mul(exp(x), 2.0));
  CHECK(ops == std::vector<std::string>{"exp", "mul", "sum"});
  CHECK(shapes == std::vector<Shape>{{2, 3}, {2, 3}, {}});
  {
    NoGradGuard no_grad;  // nothing is recorded, so the hook sees nothing
    (void)exp(x);
  }
  CHECK(ops.size() == 3);
  (void)exp(zeros({2}, DType::f64));  // no input requires grad: not recorded either
  CHECK(ops.size() == 3);
}

TEST_CASE("tape hooks: set_record_hook returns the hook it replaces") {
  int first = 0, second = 0;
  RecordHookGuard guard([&](const Node&, const Tensor&) { ++first; });
  RecordHook prev = set_record_hook([&](const Node&, const Tensor&) { ++second; });
  (void)exp(s64(1));
  set_record_hook(std::move(prev));  // the first one again
  (void)exp(s64(1));
  CHECK(first == 1);
  CHECK(second == 1);
}

TEST_CASE("tape hooks: grad-ready fires once per leaf, after its last contribution") {
  // L = a*b + a*c + c: a feeds two nodes, c two, b one. The tape in reverse runs
  // add(.., c) [c: 1 of 2], add(ab, ac), mul(a,c) [a: 1 of 2, c: 2 of 2 -> c ready],
  // mul(a,b) [a: 2 of 2 -> a ready, b ready].
  Tensor a = s64(2), b = s64(3), c = s64(5);
  Tensor ab = mul(a, b);  // one statement each: the order of recording is the tape's order
  Tensor ac = mul(a, c);
  Tensor L = add(add(ab, ac), c);
  std::vector<std::pair<const TensorImpl*, double>> fired;  // (leaf, its grad when it fired)
  GradReadyHookGuard guard([&](const Tensor& leaf) {
    CHECK(leaf.grad().defined());
    fired.push_back({&leaf.impl(), leaf.grad().item<double>()});
  });
  L.backward();
  REQUIRE(fired.size() == 3);
  CHECK(fired[0].first == &c.impl());
  CHECK(fired[0].second == 3);  // dL/dc = a + 1, complete when it fired
  std::map<const TensorImpl*, double> by_leaf(fired.begin(), fired.end());
  CHECK(by_leaf.at(&a.impl()) == 8);  // dL/da = b + c
  CHECK(by_leaf.at(&b.impl()) == 2);  // dL/db = a
}

TEST_CASE("tape hooks: grad-ready fires for a leaf root and for a leaf whose branch got no gradient") {
  Tensor x = s64(4);
  int count = 0;
  GradReadyHookGuard guard([&](const Tensor&) { ++count; });
  x.backward();
  CHECK(count == 1);
  // y's only consumer is a node whose output gradient is never produced: split's second chunk is
  // unused, so its node has no pending gradient, yet y still counts as final once it is passed.
  Tensor y = leaf64({4});
  std::vector<Tensor> parts = split(y, 2);
  Tensor z = s64(1);
  count = 0;
  std::vector<const TensorImpl*> seen;
  set_grad_ready_hook([&](const Tensor& leaf) { seen.push_back(&leaf.impl()); });
  sum(mul(parts[0], z)).backward();
  CHECK(std::count(seen.begin(), seen.end(), &y.impl()) == 1);
  CHECK(std::count(seen.begin(), seen.end(), &z.impl()) == 1);
}

TEST_CASE("tape hooks: with no hook set, backward gives the same gradients") {
  Tensor a = s64(2), b = s64(3);
  add(mul(a, b), a).backward();
  CHECK(a.grad().item<double>() == 4);
  CHECK(b.grad().item<double>() == 2);
}
