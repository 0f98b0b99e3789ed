#pragma once
// Device memory of the CUDA backend: a caching allocator per GPU and host<->device copies; the
// current device and each device's stream. Plain C++ (no CUDA headers), so core/ can call it and
// code outside attograd can include it (it is installed); defined in cuda/memory.cu and
// cuda/runtime.cu when the CUDA backend is built and in core/no_cuda.cpp (raising a clear
// ag::Error) when it is not.
#include <cstddef>
#include <string>

#include "core/alloc_stats.h"

namespace ag::cuda {

bool available();        // true when the build has CUDA and a GPU is visible
int device_count();      // 0 without CUDA or GPU
void* device_alloc(int device, size_t bytes);
void device_free(int device, void* ptr, size_t bytes);
// device -1 means host memory. Ordered on the device's stream (after every kernel launched there);
// a copy to or from the host returns once it is done. Device to device: on the destination's
// stream, after the source device's stream has finished.
void copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes);
AllocStats alloc_stats(int device);
void empty_cache(int device);
void reset_peak_bytes(int device);

// Makes `device` current on this thread (cudaSetDevice, skipped when it already is). KERNEL()
// (core/dispatch.h) calls it before every cuda:: kernel.
void set_device(int device);
// Waits until every kernel and copy queued on the device's stream has finished.
void synchronize(int device);
// The stream of `device` (created at first use), as a cudaStream_t cast to void* so that this
// header needs no CUDA headers: cast it back with static_cast<cudaStream_t>. attograd queues every
// kernel, cuBLAS call and copy of the device on this one stream (non-blocking: not ordered with the
// legacy default stream), and its caching allocator hands a freed block to the next allocation at
// once, ordered by this stream alone. A kernel of your own that reads or writes attograd's tensors
// must be launched on it, after set_device(device): on any other stream it may run before the op
// that wrote its input has finished, or while a block it still reads is reused.
void* stream(int device);
// Kernel timing (core/profile.h): an event recorded now on the device's stream (as void*, a
// cudaEvent_t), the milliseconds between two recorded events (waiting for the later one), and an
// event's release.
void* record_event(int device);
double event_elapsed_ms(void* start, void* end);
void destroy_event(void* event);
// TF32 for f32 GEMMs in cuBLAS (faster, ~10 mantissa bits): off by default, so GPU results match
// the CPU's to f32 rounding; the setting applies to every device.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Raises ag::Error (defined in C++, so .cu files need not see fmt or ag::Error).
[[noreturn]] void raise(const std::string& message);

}  // namespace ag::cuda
