#pragma once
// Device memory of the CUDA backend: a caching allocator per GPU and host<->device copies.
// Plain C++ (no CUDA headers), so core/ can call it; defined in cuda/memory.cu when the CUDA
// backend is built and in core/no_cuda.cpp (raising a clear ag::Error) when it is not.
#include <cstddef>
#include <string>

#include "core/alloc_stats.h"

namespace ag::cuda {

bool available();        // true when the build has CUDA and a GPU is visible
int device_count();      // 0 without CUDA or GPU
void* device_alloc(int device, size_t bytes);
void device_free(int device, void* ptr, size_t bytes);
// device -1 means host memory; synchronous on the device's stream.
void copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes);
AllocStats alloc_stats(int device);
void empty_cache(int device);
void reset_peak_bytes(int device);
void synchronize(int device);  // waits for all work queued on the device

// Raises ag::Error (defined in C++, so .cu files need not see fmt or ag::Error).
[[noreturn]] void raise(const std::string& message);

}  // namespace ag::cuda
