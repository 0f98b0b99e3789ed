#pragma once
// gradcheck: compares the tape's gradients with central finite differences, in f64.
//
//   L(x) = sum(r * f(x)) for a fixed random r (a random projection catches permuted or
//   transposed gradients that sum() would not), then for every element x_j of every input that
//   requires grad:  numeric_j = (L(x + eps e_j) - L(x - eps e_j)) / (2 eps)  vs  dL/dx_j from backward.
// Passes when |analytic - numeric| <= atol + rtol * |numeric| everywhere.
// The public form, with the failing input and element in its result: ag::testing::gradcheck
// (autograd/testing.h, where the check is written); this is its short result under the old name.
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ag {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 1234;  // of the projection r
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_err = 0;  // worst |analytic - numeric|
  std::string message;     // the worst element, for the test report
};

// `inputs`: f64 leaves; those with requires_grad are checked (others, e.g. i64 indices, pass as is).
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace ag
