#pragma once
// Lets GCC vectorise expf/logf/tanhf/erff (and the double forms) inside `#pragma omp simd`
// loops by declaring the SIMD variants glibc's libmvec provides (what <math.h> itself does only
// under -ffast-math, which we avoid so NaN and Inf propagate exactly). libmvec's functions are
// accurate to 4 ulp. Include before any loop that calls std::exp/log/tanh/erf on a hot path.
#include <cmath>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) float erff(float) noexcept;
__attribute__((simd("notinbranch"))) double exp(double) noexcept;
__attribute__((simd("notinbranch"))) double log(double) noexcept;
__attribute__((simd("notinbranch"))) double tanh(double) noexcept;
__attribute__((simd("notinbranch"))) double erf(double) noexcept;
}
#endif
