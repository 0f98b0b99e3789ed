// The CPU elementwise engine (core/cpu/loops.h: map1/map2/map3) compiled once for every
// (functor, dtype) pair the op fronts use, listed in core/kernels/pointwise.h; the GPU's twin is
// cuda/pointwise.cu. The op fronts (autograd/ops/elementwise.cpp) see only the declarations
// (core/kernels/core.h, with their shapes) and call these copies, so autograd compiles none of the
// CPU's loops.
//
// vecmath.h defines the fast float math the functors call (fast_exp, fast_normal_cdf,
// fast_normal_pdf) and declares libmvec's vector forms of expf, logf, tanhf and erff, so the
// functors' loops vectorise here.
#include "core/cpu/vecmath.h"
#include "core/cpu/loops.h"
#include "core/kernels.h"

namespace ag::cpu {

AG_INSTANTIATE_POINTWISE_KERNELS

}  // namespace ag::cpu
