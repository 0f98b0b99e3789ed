#pragma once
// ag::testing: the checks attograd's own tests use, public and installed, for people who write
// their own ops and layers.
//
//   gradcheck(fn, inputs, tolerances)   the tape's gradients vs central finite differences (f64)
//   compare_devices(fn, inputs)         fn's output and gradients on the cpu vs on a GPU; reports
//                                       "skipped: no CUDA device" where there is none
//
// Both return a result that converts to bool and prints itself, so a test framework's assertion
// shows what went wrong:
//
//   #include "autograd/testing.h"
//   auto fn = [](const std::vector<ag::Tensor>& in) { return my_softplus(in[0]); };
//   ag::Tensor x = ag::randn({3, 4}, ag::DType::f64).set_requires_grad(true);
//   REQUIRE(ag::testing::gradcheck(fn, {x}));        // doctest / Catch2: prints the worst element
//   ag::testing::assert_gradcheck(fn, {x});          // anywhere else: throws ag::Error on failure
//
// gradcheck, in math. With a fixed random r of the output's shape, L(x) = sum(r * fn(x)) (a random
// projection catches permuted or transposed gradients that sum() would not). For every element
// x_j of every input that requires grad:
//   numeric_j  = (L(x + eps e_j) - L(x - eps e_j)) / (2 eps)     (error O(eps^2))
//   analytic_j = dL/dx_j from one backward of L
// and the check passes when |analytic_j - numeric_j| <= atol + rtol |numeric_j| for every j.
// It runs in f64: in f32 the rounding error of L, about 1e-7 |L| / eps, drowns the difference.
// fn receives copies of the inputs (fresh leaves), so the caller's tensors and gradients are
// untouched; inputs that do not require grad (integer indices, masks) are passed as they are.
// The cost is 2 forward passes per checked element: keep the inputs to a few dozen elements.
//
// The old name ag::gradcheck (autograd/gradcheck.h) is the same check with a shorter result.
// Call these qualified, ag::testing::gradcheck(...): unqualified, argument-dependent lookup also
// finds ag::gradcheck, and the call is ambiguous.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/tensor.h"

namespace ag::testing {

// The function under test: inputs -> one output tensor (stack or concatenate several outputs).
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// eps (the finite-difference step), atol, rtol and the seed of the projection r.
// Defaults suit smooth f64 functions: eps 1e-6, atol 1e-6, rtol 1e-4. Near a kink (relu at 0,
// max with ties) move the inputs away from it rather than loosening the tolerances.
using Tolerances = GradcheckOptions;

struct GradcheckResult {
  bool passed = true;
  int64_t checked = 0;      // elements compared, over all inputs that require grad
  int64_t failed = 0;       // elements outside the tolerance
  double max_abs_err = 0;   // max_j |analytic_j - numeric_j|
  double max_rel_err = 0;   // max_j |analytic_j - numeric_j| / |numeric_j|, over numeric_j != 0
  // The worst element: on failure the one furthest beyond its tolerance, else the one with the
  // largest absolute error. input is its index in `inputs`, element its row-major (flat) index,
  // index the same as a multi-index into the input's shape.
  int input = -1;
  int64_t element = -1;
  Shape index;
  double analytic = 0, numeric = 0;
  std::string message;  // one line: what passed, or the worst element and how many failed

  explicit operator bool() const { return passed; }
};
std::ostream& operator<<(std::ostream& os, const GradcheckResult& r);  // the message

GradcheckResult gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, Tolerances tolerances = {});

// gradcheck that throws ag::Error carrying the message when the check fails.
void assert_gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, Tolerances tolerances = {});

// ---- cpu vs device -----------------------------------------------------------------------------
struct CompareOptions {
  double atol = 1e-5;  // |device - cpu| <= atol + rtol |cpu|, elementwise; f32-sized defaults
  double rtol = 1e-4;
  uint64_t seed = 1234;              // of the output gradient r used for the backward
  Device device = Device::cuda(0);   // compared against the cpu (Device::cpu() compares two cpu runs)
};

struct CompareResult {
  bool passed = false;   // ran on both devices, and outputs and gradients agree
  bool skipped = false;  // the device is not there; message says why ("skipped: no CUDA device")
  double max_abs_err = 0;  // over the output and every gradient
  // The worst value: "output" or "grad of input i", its flat and multi-index, and both values.
  std::string where;
  int64_t element = -1;
  Shape index;
  double cpu_value = 0, device_value = 0;
  std::string message;

  // True when passed or skipped: a machine without a GPU does not fail a test that asserts it.
  explicit operator bool() const { return passed || skipped; }
};
std::ostream& operator<<(std::ostream& os, const CompareResult& r);  // the message

// Runs fn on the cpu and on options.device with the same inputs (copied to each), compares the
// outputs, then backpropagates the same random gradient r of the output's shape through both
// and compares the gradient of every input that requires grad (any floating dtype).
// An error raised on the device (e.g. an op without a CUDA kernel) is a failure naming it.
CompareResult compare_devices(const Fn& fn, const std::vector<Tensor>& inputs, CompareOptions options = {});

}  // namespace ag::testing
