#include "core/allocator.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
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

uint64_t parse_meminfo_available(std::string_view text) {
  // each line "Name:<spaces>count<spaces>kB"; the first well-formed MemAvailable line counts
  constexpr std::string_view key = "MemAvailable:";
  auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.substr(0, key.size()) != key) continue;
    size_t i = key.size();
    while (i < line.size() && space(line[i])) ++i;
    const size_t digits = i;
    uint64_t kib = 0;
    bool overflow = false;
    for (; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) {
      const uint64_t d = uint64_t(line[i] - '0');
      overflow = overflow || kib > (UINT64_MAX - d) / 10;
      kib = kib * 10 + d;
    }
    if (i == digits || i == line.size() || !space(line[i])) continue;  // no count, or no space before the unit
    while (i < line.size() && space(line[i])) ++i;
    if (line.substr(i, 2) != "kB") continue;
    for (i += 2; i < line.size() && space(line[i]);) ++i;
    if (i != line.size()) continue;
    return overflow || kib > UINT64_MAX / 1024 ? UINT64_MAX : kib * 1024;
  }
  return UINT64_MAX;
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

// The memory the system can still give this process: MemAvailable of /proc/meminfo (free memory
// plus what the kernel can reclaim without swapping), or what set_available_memory_probe gives.
// Read at cache misses only (a steady training step has none); unknown (no /proc): unlimited.
std::atomic<uint64_t (*)()> g_available_probe{nullptr};
uint64_t meminfo_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return UINT64_MAX;
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return parse_meminfo_available(text);
}
uint64_t available_memory() {
  const auto probe = g_available_probe.load(std::memory_order_relaxed);
  return probe ? probe() : meminfo_available();
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
    // A block the system has no room for: give the cache back first. Linux overcommits, so a
    // request past the free memory still succeeds and the OOM killer strikes when its pages are
    // touched; the cached blocks are pages this process holds and uses no more (a training step's
    // activations, when an evaluation asks for other sizes), so they go before the request does.
    // Checked for blocks of 1 MiB and more, whose fresh pages cost more than reading the figure.
    if (cls >= (size_t(1) << 20) && cached_bytes() > 0 && cls > available_memory()) empty();
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
  uint64_t cached_bytes() {
    std::lock_guard lock(mu);
    return stats.bytes_cached;
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

void set_available_memory_probe(uint64_t (*probe)()) { g_available_probe.store(probe, std::memory_order_relaxed); }

void empty_cache(Device device) {
  if (device.is_cpu()) return cpu_cache().empty();
  cuda::empty_cache(device.index);
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

}  // namespace ag
