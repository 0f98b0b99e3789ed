#pragma once
// Shared by every .cu file: the device's stream and cuBLAS handle, checked CUDA and cuBLAS calls,
// launch helpers. A failure raises ag::Error naming the call, the CUDA error string and the line.
//
// One stream per device, used by every kernel, cuBLAS call and copy of that device: work on a
// device is ordered by that stream alone, so a kernel may read what the previous one wrote with no
// synchronisation, and the host waits only when it copies a result back (cuda::copy).
// KERNEL() (core/dispatch.h) makes the tensor's device current before it calls a cuda:: kernel;
// kernels launch on stream() of the current device.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/memory.h"

namespace ag::cuda {

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess)
    raise(std::string("cuda: ") + call + " failed: " + cudaGetErrorName(err) + " (" +
          cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

inline void cublas_check(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS)
    raise(std::string("cublas: ") + call + " failed: " + cublasGetStatusName(st) + " (" +
          cublasGetStatusString(st) + ") at " + file + ":" + std::to_string(line));
}

int current_device();            // the device KERNEL() made current
cudaStream_t stream();           // the current device's stream (created at first use)
cublasHandle_t cublas();         // the current device's cuBLAS handle, bound to stream()

// Blocks of `threads` covering n elements, capped for grid-stride loops.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 32) b = 65535LL * 32;
  return unsigned(b);
}

}  // namespace ag::cuda

#define cudaCheck(call) ::ag::cuda::cuda_check((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) ::ag::cuda::cublas_check((call), #call, __FILE__, __LINE__)
// after every launch (a bad configuration is reported here; a fault in the kernel at the next sync)
#define kernelCheck() ::ag::cuda::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
