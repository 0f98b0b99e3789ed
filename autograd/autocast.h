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
//     inputs, f32 compute), the CPU computes the same numbers (sbgemm, or its f32 GEMM on rounded copies: below);
//   - scaled_dot_product_attention rounds q, k and v to bf16 and computes softmax and both
//     products in f32;
//   - everything else (norms, softmax, losses, the optimizer) stays f32, and so do the weights
//     (the "master weights"), the outputs and the gradients: only the operands of the big
//     products lose precision. The outputs of matmul and linear are f32 (torch.autocast returns
//     bf16 ones), so the numbers are a little closer to f32;
//   - what linear (its input) and the fused CPU attention (q, k, v) keep for backward is the
//     rounded operand itself, as a bf16 tensor (core/half.h): half those activations' memory, the
//     same numbers (docs/mixed-precision.md);
//   - in inference (grad mode off) linear reads a bf16 copy of its weight, rounded once and kept
//     while the weight is unchanged (autocast_bf16_weight below): the same numbers, half the bytes
//     per generated token.
// bf16 needs no loss scaling: its range is f32's. f64 tensors are never cast (gradient checks
// stay exact). The ops read the precision when they run forward and keep it for their backward,
// so backward needs no guard of its own.
//
// fp16 (Precision::fp16, round_fp16) works the same way with IEEE half operands: 11 significant
// bits (relative error <= 2^-11), but a range of only 6e-8 (smallest subnormal) to 65504. Values
// past 65504 become inf, gradients below 6e-8 become 0. Activations rarely leave that range;
// gradients do, since the backward GEMMs round the incoming gradient: scale the loss by a factor S
// before backward and divide the gradients by S before the step, adjusting S as overflows show up
// (optim::GradScaler, optim/grad_scaler.h, as torch.cuda.amp.GradScaler).
//
// Speed: on a GPU the bf16 GEMMs run on tensor cores. On a CPU with AVX512-BF16 (ag::cpu::sbgemm,
// core/kernels/matmul.h) matmul and linear round while packing their operands and multiply with
// VDPBF16PS, twice the f32 FMA's work per instruction. Elsewhere the CPU computes the same
// products in its f32 GEMM on rounded copies: the rounding is an extra pass, so bf16 there is
// for checking what the numbers do, not for speed.
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.h"
#include "core/precision.h"
#include "core/tensor.h"

namespace ag {

// This thread's autocast precision (core/precision.h): fp32 (no autocast) outside every guard.
Precision autocast_precision();
void set_autocast_precision(Precision p);
// How an op reads operands of dtype t now: the autocast precision for f32, fp32 (as they are)
// for anything else.
inline Precision autocast_operands(DType t) { return t == DType::f32 ? autocast_precision() : Precision::fp32; }

// What a tensor kept in a rounding precision's values is stored as: DType::bf16 for bf16,
// DType::f16 for fp16, and `otherwise` for fp32 (nothing rounded). The one rule for what linear's
// saved input, the fused attention's q, k, v and the KV cache hold under autocast.
inline DType stored_dtype(Precision p, DType otherwise = DType::f32) {
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : otherwise;
}

// The precision a --precision value names, spelled as name() spells it ("fp32", "bf16", "fp16");
// nothing for any other string.
inline std::optional<Precision> parse_precision(std::string_view s) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (s == name(p)) return p;
  return std::nullopt;
}

// Weights kept in bf16 for inference. Under bf16 autocast with grad mode off (evaluation,
// generation: nothing is recorded, so no weight changes between two products), the weight w that
// linear reads is rounded to bf16 once and the bf16 copy is kept, in this thread, for the next
// product that reads w: a generated token's products then read half the bytes and round nothing
// (cpu::sgemm_small_m_b16), and the same bits as rounding w as it is read. Returns that copy, or
// an undefined tensor where no copy is kept (another precision, grad mode on, w not an f32 CPU
// tensor that requires grad). A copy is valid while w's storage lives with the version it had
// (every in-place write bumps it: an optimizer step, load_state_dict, copy_); the copies are
// dropped when the precision changes and when a product runs under bf16 autocast with grad mode
// on (training: the weights change at every step, and the rounding happens in the packing);
// none are kept under NoBf16WeightCopiesGuard.
// Cost: a bf16 copy of each weight read, half its f32 bytes, while inference runs.
Tensor autocast_bf16_weight(const Tensor& w);
// How many weights have a bf16 copy kept in this thread (for tests).
int64_t autocast_bf16_weights_kept();

// Keeps no bf16 weight copies on this thread for its lifetime (guards nest): for a forward
// without grad that is part of training, ag::checkpoint's first pass, whose copies would only
// add half the weights' bytes to the step's memory until its backward drops them.
class NoBf16WeightCopiesGuard {
 public:
  NoBf16WeightCopiesGuard();
  ~NoBf16WeightCopiesGuard();
  NoBf16WeightCopiesGuard(const NoBf16WeightCopiesGuard&) = delete;
  NoBf16WeightCopiesGuard& operator=(const NoBf16WeightCopiesGuard&) = delete;

 private:
  bool prev_;
};

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
