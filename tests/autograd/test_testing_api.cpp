// The public test API (autograd/testing.h): gradcheck passes correct ops and names the input and
// element of a wrong backward; compare_devices compares two runs, names what differs, and reports
// "skipped" where there is no GPU.
#include <sstream>

#include "autograd/testing.h"
#include "cuda/memory.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// A custom op written the way a user adds one, with the tape's record():
//   y = w * x^2 (elementwise, same shapes)      dx = 2 w x g,  dw = x^2 g
// `forget_two` makes the VJP of x the classic slip dx = w x g: wrong by a factor 2 wherever
// w x g != 0, right where x = 0.
Tensor scaled_square(const Tensor& x, const Tensor& w, bool forget_two) {
  Tensor y;
  {
    NoGradGuard no_grad;  // the forward's ops are not recorded: the op is one node on the tape
    y = mul(w, mul(x, x));
  }
  record("scaled_square", {x, w}, y, [x, w, forget_two](const Tensor& g) {
    Tensor dx = mul(mul(w, x), g);
    if (!forget_two) dx = mul(dx, 2.0);
    return std::vector{dx, mul(mul(x, x), g)};
  });
  return y;
}

// f64 leaf holding `values`, requiring grad.
Tensor leaf(std::initializer_list<double> values, const Shape& shape) {
  return tensor<double>(values, shape).set_requires_grad(true);
}

std::string printed(const auto& result) {
  std::ostringstream os;
  os << result;
  return os.str();
}

}  // namespace

TEST_CASE("testing: gradcheck passes a correct op, with broadcasting and the same tensor twice") {
  // y = tanh(a) * b + a * a, b (3) broadcast over a's rows: every path of a's gradient is right.
  Tensor a = leaf64({2, 3}, 1), b = leaf64({3}, 2);
  auto fn = [](const std::vector<Tensor>& in) { return add(mul(tanh(in[0]), in[1]), mul(in[0], in[0])); };
  testing::GradcheckResult r = testing::gradcheck(fn, {a, b});
  REQUIRE(r);
  CHECK(r.passed);
  CHECK(r.checked == 9);  // 6 elements of a, 3 of b
  CHECK(r.failed == 0);
  CHECK(r.max_abs_err < 1e-7);
  CHECK(r.max_rel_err < 1e-6);
  CHECK(r.input >= 0);  // the largest error is still located
  CHECK(r.message.find("gradcheck passed: 9 elements") != std::string::npos);
  CHECK(printed(r) == r.message);
  // the caller's tensors are untouched: the check ran on copies
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  // and the custom op with the right VJP passes: what fails below is the VJP, not the harness
  Tensor x = leaf64({2, 3}, 3), w = leaf64({2, 3}, 4);
  auto good = [](const std::vector<Tensor>& in) { return scaled_square(in[0], in[1], false); };
  testing::assert_gradcheck(good, {x, w});
  CHECK(testing::gradcheck(good, {x, w}).passed);
}

TEST_CASE("testing: gradcheck names the input and element of a wrong backward") {
  // x is zero but at element 4 (index [1,1]), so the forgotten 2 shows there only:
  //   analytic = w x r_4 = numeric / 2, with r_4 the projection's weight of element 4.
  Tensor x = leaf({0, 0, 0, 0, 1.5, 0}, {2, 3});
  Tensor w = leaf({0.5, -1, 2, 0.25, 0.8, -0.3}, {2, 3});
  auto bad = [](const std::vector<Tensor>& in) { return scaled_square(in[0], in[1], true); };
  testing::GradcheckResult r = testing::gradcheck(bad, {x, w});
  CHECK_FALSE(r);
  CHECK_FALSE(r.passed);
  CHECK(r.checked == 12);
  CHECK(r.failed == 1);
  CHECK(r.input == 0);
  CHECK(r.element == 4);
  CHECK(r.index == Shape{1, 1});
  REQUIRE(r.numeric != 0);
  CHECK(r.analytic == doctest::Approx(r.numeric / 2).epsilon(1e-8));
  CHECK(r.max_abs_err == doctest::Approx(std::abs(r.numeric / 2)).epsilon(1e-8));
  CHECK(r.max_rel_err == doctest::Approx(0.5).epsilon(1e-8));
  for (const char* frag : {"gradcheck failed", "input 0 (shape [2,3]) element 4 (index [1,1])", "1 of 12 elements fail"})
    CHECK(r.message.find(frag) != std::string::npos);
  CHECK(printed(r) == r.message);
  // what doctest prints for REQUIRE(testing::gradcheck(...)): the message
  CHECK(std::string(doctest::toString(r).c_str()) == r.message);
  AG_CHECK_ERROR(testing::assert_gradcheck(bad, {x, w}), "gradcheck failed", "input 0", "element 4");
  // the old name reports the same element as the new one
  GradcheckResult old = gradcheck(bad, {x, w});
  CHECK_FALSE(old.ok);
  CHECK(old.max_abs_err == r.max_abs_err);
  CHECK(old.message.find("input 0 (shape [2,3]) element 4") != std::string::npos);
  CHECK(gradcheck(bad, {x.detach(), w}).ok);  // x without grad: only w's (right) VJP is checked
}

TEST_CASE("testing: gradcheck takes non-contiguous inputs and passes integer inputs through") {
  // x^T is a non-leaf view; idx (i64) selects rows and requires no gradient.
  Tensor x = leaf64({3, 2}, 5);
  Tensor idx = tensor<int64_t>({1, 0, 1});
  auto fn = [](const std::vector<Tensor>& in) { return mul(index_select(in[0], 0, in[1]), 3.0); };
  testing::GradcheckResult r = testing::gradcheck(fn, {x.mT(), idx});
  INFO(r.message);
  CHECK(r.passed);
  CHECK(r.checked == 6);  // the 6 elements of x^T, none of idx
}

TEST_CASE("testing: gradcheck errors name what is wrong") {
  auto id = [](const std::vector<Tensor>& in) { return mul(in[0], 1.0); };
  Tensor x32 = ones({2, 2}).set_requires_grad(true);
  AG_CHECK_ERROR(testing::gradcheck(id, {x32}), "gradcheck", "input 0", "[2,2]", "f32", "f64");
  AG_CHECK_ERROR(testing::gradcheck(id, {ones({2}, DType::f64)}), "gradcheck", "none of the 1 inputs requires grad");
  AG_CHECK_ERROR(testing::gradcheck(id, {Tensor()}), "gradcheck", "input 0 is an undefined tensor");
  Tensor x = leaf64({2}, 1);
  auto to32 = [](const std::vector<Tensor>& in) { return in[0].to(DType::f32); };
  AG_CHECK_ERROR(testing::gradcheck(to32, {x}), "gradcheck", "must return f64, got f32");
  auto constant = [](const std::vector<Tensor>& in) { return ones({3}, DType::f64); };
  AG_CHECK_ERROR(testing::gradcheck(constant, {x}), "gradcheck", "does not depend on any input");
  AG_CHECK_ERROR(testing::gradcheck(id, {x}, {.eps = 0}), "gradcheck", "eps must be > 0");
}

TEST_CASE("testing: compare_devices on a GPU no machine has reports skipped, and a true result") {
  Tensor x = leaf64({2, 3}, 1);
  auto fn = [](const std::vector<Tensor>& in) { return tanh(in[0]); };
  // a GPU index no machine here has: skipped on every machine, with the reason
  testing::CompareResult far = testing::compare_devices(fn, {x}, {.device = Device::cuda(64)});
  CHECK(far.skipped);
  CHECK_FALSE(far.passed);
  CHECK(far);  // a skip does not fail REQUIRE(compare_devices(...))
  CHECK(far.message.find("skipped: no CUDA device") != std::string::npos);
  CHECK(printed(far) == far.message);
}

TEST_CASE("testing: compare_devices on the default device reports skipped where no GPU is usable") {
  if (cuda::available()) {  // the default device is there: "cpu == cuda on a GPU" below runs on it
    MESSAGE("[skipped: no missing GPU to report: cuda:0 is usable]");
    return;
  }
  Tensor x = leaf64({2, 3}, 1);
  auto fn = [](const std::vector<Tensor>& in) { return tanh(in[0]); };
  testing::CompareResult r = testing::compare_devices(fn, {x});
  CHECK(r.skipped);
  CHECK_FALSE(r.passed);
  CHECK(r);
  CHECK(r.message.find("skipped: no CUDA device") != std::string::npos);
  CHECK_FALSE(x.grad().defined());  // nothing ran
}

TEST_CASE("testing: compare_devices of two cpu runs: agreement, then the output and the gradient that differ") {
  const testing::CompareOptions on_cpu{.device = Device::cpu()};
  Tensor a = leaf64({2, 3}, 1), b = leaf64({3}, 2).to(DType::f32).detach().set_requires_grad(true);
  auto fn = [](const std::vector<Tensor>& in) { return mul(tanh(in[0].to(DType::f32)), in[1]); };
  testing::CompareResult same = testing::compare_devices(fn, {a, b}, on_cpu);
  INFO(same.message);
  CHECK(same.passed);
  CHECK_FALSE(same.skipped);
  CHECK(same.max_abs_err == 0);  // the same kernels on the same inputs
  CHECK(same.message.find("compare_devices passed") != std::string::npos);
  CHECK_FALSE(a.grad().defined());  // the runs used copies

  // The second run (the "device") adds 1e-3 at output element 4 (index [1,1]).
  int calls = 0;
  auto drifting_output = [&calls](const std::vector<Tensor>& in) {
    Tensor y = tanh(in[0]);
    if (++calls == 2) y = add(y, tensor<double>({0, 0, 0, 0, 1e-3, 0}, {2, 3}));
    return y;
  };
  testing::CompareResult out = testing::compare_devices(drifting_output, {a}, on_cpu);
  CHECK_FALSE(out);
  CHECK_FALSE(out.skipped);
  CHECK(out.where == "output");
  CHECK(out.element == 4);
  CHECK(out.index == Shape{1, 1});
  CHECK(out.device_value - out.cpu_value == doctest::Approx(1e-3));
  CHECK(out.message.find("output element 4 (index [1,1])") != std::string::npos);

  // Same output values; the second run's gradient of input 1 gains 1e-2 r_2 at element 2:
  // (c - c.detach()) is zero with gradient one.
  calls = 0;
  auto drifting_grad = [&calls](const std::vector<Tensor>& in) {
    Tensor y = mul(in[0], in[1]);
    if (++calls == 2) y = add(y, mul(sub(in[1], in[1].detach()), tensor<double>({0, 0, 1e-2}, {3})));
    return y;
  };
  Tensor c = leaf64({3}, 3);
  testing::CompareResult grad = testing::compare_devices(drifting_grad, {a, c}, on_cpu);
  CHECK_FALSE(grad.passed);
  CHECK(grad.where == "grad of input 1");
  CHECK(grad.element == 2);
  CHECK(grad.message.find("grad of input 1 element 2") != std::string::npos);
}

TEST_CASE("testing: compare_devices cpu == cuda on a GPU") {
  if (skip_without_gpu()) return;
  // A function that runs on any device: the copies to and from it are differentiable.
  Tensor x = leaf64({2, 3}, 1);
  auto fn = [](const std::vector<Tensor>& in) { return mul(in[0].cpu(), 2.0).to(in[0].device()); };
  testing::CompareResult r = testing::compare_devices(fn, {x});
  INFO(r.message);
  CHECK(r.passed);
  // An error raised on the device is a failure that names it, not a skip.
  auto cpu_only = [](const std::vector<Tensor>& in) {
    check(in[0].device().is_cpu(), "my_op: cpu only, got a tensor on {}", in[0].device().str());
    return mul(in[0], 2.0);
  };
  testing::CompareResult e = testing::compare_devices(cpu_only, {x});
  CHECK_FALSE(e);
  CHECK(e.message.find("raised: my_op: cpu only, got a tensor on cuda:0") != std::string::npos);
}
