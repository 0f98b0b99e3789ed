#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <sanitizer/asan_interface.h>  // ASAN_(UN)POISON_MEMORY_REGION: no-ops unless built with ASan

#include "cuda/memory.h"

namespace ag {

size_t alloc_size_class(size_t bytes) {
  if (bytes <= 4096) return bytes <= 64 ? 64 : (bytes + 63) & ~size_t(63);
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes));  // largest power of two <= bytes
  size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

namespace {

// Under AddressSanitizer (make test-sanitize) a cached block would hide our bugs: a read past a
// tensor's end into its size class's slack, or through a storage already released to the cache, is
// memory ASan saw handed out and never freed. So the cache poisons what is not in use: a block in
// the free list entirely, a block in use beyond the bytes requested. ASan then reports those
// accesses as use-after-poison at the faulting line. Without ASan both calls compile to nothing.
void hand_out(void* p, size_t bytes, size_t cls) {
  ASAN_POISON_MEMORY_REGION(p, cls);
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
}

// One free list per size class, under one mutex (allocations are per tensor, not per element).
struct CpuCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  AllocStats stats;

  void* alloc(size_t bytes) {
    size_t cls = alloc_size_class(bytes);
    {
      std::lock_guard lock(mu);
      auto it = free_blocks.find(cls);
      if (it != free_blocks.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats.cache_hits++;
        stats.bytes_cached -= cls;
        note_in_use(cls);
        hand_out(p, bytes, cls);
        return p;
      }
    }
    void* p = std::aligned_alloc(64, cls);
    if (!p) {
      empty();  // give the cache back and try once more before failing
      p = std::aligned_alloc(64, cls);
    }
    check(p != nullptr, "allocator: out of memory allocating {} bytes on cpu", cls);
    hand_out(p, bytes, cls);
    std::lock_guard lock(mu);
    stats.system_allocs++;
    note_in_use(cls);
    return p;
  }
  void note_in_use(size_t cls) {
    stats.bytes_in_use += cls;
    if (stats.bytes_in_use > stats.peak_bytes_in_use) stats.peak_bytes_in_use = stats.bytes_in_use;
  }
  void release(void* p, size_t bytes) {
    size_t cls = alloc_size_class(bytes);
    ASAN_POISON_MEMORY_REGION(p, cls);
    std::lock_guard lock(mu);
    free_blocks[cls].push_back(p);
    stats.bytes_in_use -= cls;
    stats.bytes_cached += cls;
  }
  void empty() {
    std::lock_guard lock(mu);
    for (auto& [cls, blocks] : free_blocks) {
      for (void* p : blocks) {
        ASAN_UNPOISON_MEMORY_REGION(p, cls);
        std::free(p);
      }
      stats.system_frees += blocks.size();
      stats.bytes_cached -= cls * blocks.size();
      blocks.clear();
    }
  }
};

CpuCache& cpu_cache() {
  static CpuCache* cache = new CpuCache;  // never destroyed: storages may outlive static teardown
  return *cache;
}

}  // namespace

void* device_alloc(Device device, size_t bytes) {
  if (device.is_cpu()) return cpu_cache().alloc(bytes);
  return cuda::device_alloc(device.index, alloc_size_class(bytes));
}

void device_free(Device device, void* ptr, size_t bytes) {
  if (!ptr) return;
  if (device.is_cpu()) return cpu_cache().release(ptr, bytes);
  cuda::device_free(device.index, ptr, alloc_size_class(bytes));
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cuda::copy(dst, dst_device.is_cuda() ? dst_device.index : -1, src,
             src_device.is_cuda() ? src_device.index : -1, bytes);
}

AllocStats alloc_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard lock(cpu_cache().mu);
    return cpu_cache().stats;
  }
  return cuda::alloc_stats(device.index);
}

void reset_peak_bytes(Device device) {
  if (device.is_cpu()) {
    std::lock_guard lock(cpu_cache().mu);
    cpu_cache().stats.peak_bytes_in_use = cpu_cache().stats.bytes_in_use;
    return;
  }
  cuda::reset_peak_bytes(device.index);
}

void empty_cache(Device device) {
  if (device.is_cpu()) return cpu_cache().empty();
  cuda::empty_cache(device.index);
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

}  // namespace ag
