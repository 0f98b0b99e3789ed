#pragma once
// Kernel dispatch: the whole backend abstraction is this one macro. KERNEL(dev, fn, args...)
// calls cpu::fn(args...) for CPU tensors. For a CUDA tensor this is the slot of cuda::fn, with the
// same signature: until the GPU backend provides its kernels, it raises an ag::Error naming the
// kernel and the device (never a silent fallback to the CPU).
#include "core/dtype.h"
#include "core/kernels.h"

namespace ag {

inline constexpr bool kHasCuda = ATTOGRAD_WITH_CUDA;

[[noreturn]] inline void no_cuda_kernel(const char* kernel, Device device) {
  fail("{}: no CUDA kernel for this op in this build (tensor on {}); move the tensor to the cpu",
       kernel, device);
}

}  // namespace ag

#define KERNEL(dev, fn, ...)                     \
  do {                                           \
    if ((dev).is_cuda())                         \
      ::ag::no_cuda_kernel(#fn, (dev));          \
    else                                         \
      ::ag::cpu::fn(__VA_ARGS__);                \
  } while (0)
