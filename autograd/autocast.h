#pragma once
// Autocast: mixed precision for the ops where the FLOPs are, chosen per region of code
// (torch.autocast's role; the name and the per-thread scope follow it).
//
//   AutocastGuard bf16(Precision::bf16);   // until the end of the scope, on this thread:
//   Tensor y = model(x);                   //   matmul, linear and attention read their f32
//   y.backward();                          //   operands as bfloat16, accumulate in f32
//
// What bf16 autocast changes. bfloat16 keeps f32's 8 exponent bits and 8 of its 24 significant
// bits, so a value rounded to it has a relative error of at most 2^-8 (about 0.4%) and never
// overflows where f32 does not (but for the last half-unit below f32's largest value). Under the guard:
//   - matmul and linear round both operands to bf16 (round to nearest, ties to even) and
//     accumulate the products in f32; their backward GEMMs do the same with the gradient
//     (dA = round(g) round(B)^T, ...): GPU tensor cores run exactly this (cublasGemmEx, bf16
//     inputs, f32 compute), the CPU computes the same numbers in its f32 GEMM on rounded copies;
//   - scaled_dot_product_attention rounds q, k and v to bf16 and computes softmax and both
//     products in f32;
//   - everything else (norms, softmax, losses, the optimizer) stays f32, and so do the weights
//     (the "master weights"), the activations and the gradients: only the operands of the big
//     products lose precision. The outputs of matmul and linear are f32 (torch.autocast returns
//     bf16 ones): here no activation memory is saved, and the numbers are a little closer to f32.
// bf16 needs no loss scaling: its range is f32's. f64 tensors are never cast (gradient checks
// stay exact). The ops read the precision when they run forward and keep it for their backward,
// so backward needs no guard of its own.
//
// Speed: on a GPU the bf16 GEMMs run on tensor cores; on the CPU the rounding is an extra pass
// and the GEMM is the f32 one, so bf16 there is for checking what the numbers do, not for speed.
#include <cstdint>

#include "core/dtype.h"

namespace ag {

enum class Precision : uint8_t { fp32, bf16 };
inline constexpr const char* name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

// This thread's autocast precision: fp32 (no autocast) outside every guard.
Precision autocast_precision();
void set_autocast_precision(Precision p);
// Whether an op with operands of dtype t reads them as bfloat16 now: bf16 autocast and t == f32.
inline bool autocast_bf16(DType t) { return t == DType::f32 && autocast_precision() == Precision::bf16; }

// Sets the precision for its lifetime, then restores the previous one (guards nest).
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision p) : prev_(autocast_precision()) { set_autocast_precision(p); }
  ~AutocastGuard() { set_autocast_precision(prev_); }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Precision prev_;
};

}  // namespace ag
