#pragma once
// Precision: how the f32 operands of the big products (matmul, linear, attention) are read.
// fp32 reads them as they are; bf16 and fp16 round each operand to that 16-bit format first
// (pw::round_bf16, pw::round_fp16 in core/half.h) and sum the products in f32. Set per
// region of code by autocast (autograd/autocast.h) and carried to the kernels in cpu::Gemm. A header
// of its own, with no includes, because nvcc compiles the kernel headers that use it.
#include <cstdint>

namespace ag {

enum class Precision : uint8_t { fp32, bf16, fp16 };

inline constexpr const char* name(Precision p) {
  return p == Precision::bf16 ? "bf16" : p == Precision::fp16 ? "fp16" : "fp32";
}

}  // namespace ag
