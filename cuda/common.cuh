#pragma once
// Shared by every .cu file: checked CUDA and cuBLAS calls. A failure raises ag::Error naming the
// call, the CUDA error string and the source line.
#include <cuda_runtime.h>

#include <string>

#include "cuda/memory.h"

namespace ag::cuda {

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess)
    raise(std::string("cuda: ") + call + " failed: " + cudaGetErrorName(err) + " (" +
          cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace ag::cuda

#define cudaCheck(call) ::ag::cuda::cuda_check((call), #call, __FILE__, __LINE__)
