#pragma once
// Kernel dispatch: the whole backend abstraction is this one macro. KERNEL(dev, fn, args...)
// calls cpu::fn(args...) for a CPU tensor, and for a CUDA tensor makes dev.index the current GPU
// and calls cuda::fn(args...): the same signature, from the same declaration in core/kernels/*.h
// (core/kernels.h reads each family header for both backends).
// In a build without the CUDA backend, a CUDA tensor raises an ag::Error naming the kernel and the
// device (never a silent fallback to the CPU). The cuda:: call sits in a discarded
// `if constexpr` branch there, so that build needs no definition of any cuda:: kernel.
// Each call is timed while a KernelProfiler is alive (core/profile.h); `decltype` of the argument
// list (unevaluated) is the type of its last argument, which names a map kernel's function.
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/profile.h"
#include "cuda/memory.h"  // set_device

namespace ag {

inline constexpr bool kHasCuda = ATTOGRAD_WITH_CUDA;

[[noreturn]] inline void no_cuda_kernel(const char* kernel, Device device) {
  fail("{}: no CUDA kernel for this op in this build (tensor on {}); move the tensor to the cpu",
       kernel, device);
}

}  // namespace ag

#define KERNEL(dev, fn, ...)                    \
  do {                                          \
    ::ag::detail::KernelScope ag_kernel_scope_( \
        #fn, (dev), typeid(decltype(__VA_ARGS__))); \
    if ((dev).is_cuda()) {                      \
      if constexpr (::ag::kHasCuda) {           \
        ::ag::cuda::set_device((dev).index);    \
        ::ag::cuda::fn(__VA_ARGS__);            \
      } else {                                  \
        ::ag::no_cuda_kernel(#fn, (dev));       \
      }                                         \
    } else {                                    \
      ::ag::cpu::fn(__VA_ARGS__);               \
    }                                           \
  } while (0)
