// The old name of the check: ag::gradcheck is ag::testing::gradcheck (autograd/testing.cpp, where
// the finite differences live) with the short result the tests of tests/ops/ read.
#include "autograd/gradcheck.h"

#include "autograd/testing.h"

namespace ag {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, GradcheckOptions opt) {
  testing::GradcheckResult r = testing::gradcheck(f, inputs, opt);
  return {r.passed, r.max_abs_err, r.passed ? std::string() : r.message};
}

}  // namespace ag
