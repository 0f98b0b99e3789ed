#pragma once
// The strided walk of the GPU elementwise kernels (cuda/pointwise.cu, cuda/core.cu): one thread per
// element of the output, which is contiguous in the layouts' shape, reading each operand through
// its layout (stride 0 = a broadcast dim).
//
// The host first builds the loop plan the CPU engine walks too (core/kernels/loop_plan.h,
// make_plan): dims of size 1 are dropped and neighbours merged where every operand is contiguous
// across them, so a contiguous operand set becomes one dim and costs no division per element; a
// transposed or broadcast one keeps only the dims it must. Thread i reads its operands at
// plan_offsets(p, i), from the same header.
#include <cstdint>

#include "core/kernels.h"
#include "core/kernels/loop_plan.h"
#include "cuda/common.cuh"

namespace ag::cuda {

template <int N>
using Plan = LoopPlan<N>;

}  // namespace ag::cuda
