#pragma once
// softplus: a primitive op written outside attograd, the way attograd writes its own.
// One name, four places (grep softplus_ finds all of them):
//   softplus.h          the spec: math, derivative, shapes (this file)
//   softplus.cpp        the front: checks -> kernel dispatch -> tape record
//   softplus_kernels.h  cpu:: and cuda:: kernels declared side by side
//   softplus_cpu.cpp    the CPU kernels;  softplus.cu  the CUDA kernels (builds with CUDA only)
// The walkthrough and the derivation: docs/extending.md.
#include "autograd/ops.h"

namespace ext {

// snippet-begin: spec
// softplus: a smooth relu, as torch.nn.functional.softplus(x, beta, threshold)
//   forward: y = log(1 + exp(beta x)) / beta,  and y = x where beta x > threshold
//   vjp:     dx = g * sigmoid(beta x),  and dx = g where beta x > threshold
//   shapes:  x [...] -> y of x's shape
//   saves:   x
//   note:    computed as (max(z, 0) + log1p(exp(-|z|))) / beta with z = beta x, which cannot
//            overflow; beta > 0; f32 or f64; the threshold only keeps PyTorch's values
//   math:    docs/extending.md#the-math
ag::Tensor softplus(const ag::Tensor& x, double beta = 1.0, double threshold = 20.0);
// snippet-end: spec

}  // namespace ext
