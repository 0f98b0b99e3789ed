#pragma once
// Caching allocators. A training step allocates the same activation sizes every step; handing
// those blocks back to libc would cost a page fault per fresh 4 KiB page the next step (glibc
// unmaps blocks of 32 MB and more on free). So freed blocks are kept per size class and reused:
// after the first step a steady-state step makes no system allocation and touches no fresh page.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/alloc_stats.h"
#include "core/dtype.h"

namespace ag {

// Size class a request of `bytes` is rounded to: 64-byte multiples up to 4 KiB, then four
// classes per power of two (at most 25% slack).
size_t alloc_size_class(size_t bytes);

// Allocates `bytes` (rounded to its size class, 64-byte aligned) on `device`. Never returns null;
// raises ag::Error when the memory cannot be had.
void* device_alloc(Device device, size_t bytes);
void device_free(Device device, void* ptr, size_t bytes);
// Copies `bytes` between any two devices (host<->device through the CUDA runtime).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

AllocStats alloc_stats(Device device = Device::cpu());
// Starts a new peak: peak_bytes_in_use becomes the current bytes_in_use (for measuring one step).
void reset_peak_bytes(Device device = Device::cpu());
// Gives every cached (free) block back to the system. The CPU cache also does it by itself before
// a new block larger than the memory the system has available (MemAvailable): Linux would grant
// the request and kill the process when the pages are touched, while the cache may hold the room.
// So a run's evaluation, whose sizes differ from its training step's, does not hold both sets of
// blocks when memory runs short.
void empty_cache(Device device = Device::cpu());
// For tests: what the CPU allocator takes as the memory the system has available (bytes); null
// restores /proc/meminfo's MemAvailable.
void set_available_memory_probe(uint64_t (*probe)());
// The MemAvailable line of a /proc/meminfo text in bytes ("MemAvailable:   123 kB" -> 123 * 1024),
// what the CPU allocator reads; UINT64_MAX (unknown, so no limit) when no such line is well formed,
// and for a count beyond 2^64 bytes.
uint64_t parse_meminfo_available(std::string_view text);
// Waits until `device` has finished all the work queued on it (kernels run asynchronously on a
// GPU); a no-op on the CPU, whose kernels have finished when they return. For timing.
void synchronize(Device device = Device::cpu());

}  // namespace ag
