// What the CPU kernels that use AVX-512 intrinsics share (core/cpu/gemm.cpp, core/cpu/attention.cpp):
// the target attribute of functions that use AVX512-BF16, and lane masks. Only on x86-64; the
// callers check at run time that the CPU has the instructions (cpu_has_bf16, sbgemm_native).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

// A function that may use AVX512-BF16 (VDPBF16PS) besides AVX-512 F, BW, VL and FMA.
#define AG_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

namespace ag::cpu {

// A mask of the first n lanes of 16 (none for n <= 0, all for n >= 16).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

}  // namespace ag::cpu
#endif
