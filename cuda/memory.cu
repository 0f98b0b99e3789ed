// Caching device allocator and copies (see cuda/memory.h). Freed blocks stay in a per-size-class
// free list so that a steady-state training step makes no cudaMalloc/cudaFree.
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

struct DeviceCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  AllocStats stats;
};

DeviceCache& cache(int device) {
  static std::vector<DeviceCache*> caches(64, nullptr);
  static std::mutex mu;
  std::lock_guard lock(mu);
  if (device < 0 || device >= int(caches.size())) raise("cuda: device index " + std::to_string(device) + " is out of range");
  if (!caches[device]) caches[device] = new DeviceCache;
  return *caches[device];
}

void check_device(int device) {
  int n = device_count();
  if (n == 0) raise("cuda:" + std::to_string(device) + ": no CUDA device is visible on this machine");
  if (device < 0 || device >= n)
    raise("cuda:" + std::to_string(device) + ": only " + std::to_string(n) + " CUDA device(s) present");
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool available() { return device_count() > 0; }

void* device_alloc(int device, size_t bytes) {
  check_device(device);
  DeviceCache& c = cache(device);
  {
    std::lock_guard lock(c.mu);
    auto it = c.free_blocks.find(bytes);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.stats.cache_hits++;
      c.stats.bytes_cached -= bytes;
      c.stats.bytes_in_use += bytes;
      if (c.stats.bytes_in_use > c.stats.peak_bytes_in_use) c.stats.peak_bytes_in_use = c.stats.bytes_in_use;
      return p;
    }
  }
  set_device(device);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    empty_cache(device);
    cudaCheck(cudaMalloc(&p, bytes));
  }
  std::lock_guard lock(c.mu);
  c.stats.system_allocs++;
  c.stats.bytes_in_use += bytes;
  if (c.stats.bytes_in_use > c.stats.peak_bytes_in_use) c.stats.peak_bytes_in_use = c.stats.bytes_in_use;
  return p;
}

void device_free(int device, void* ptr, size_t bytes) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mu);
  c.free_blocks[bytes].push_back(ptr);
  c.stats.bytes_in_use -= bytes;
  c.stats.bytes_cached += bytes;
}

// On the stream of the device involved, so the copy comes after every kernel queued there (a
// result is read back only once it is written), then, for the host, a wait on that stream alone.
void copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device >= 0 && src_device >= 0) {
    if (src_device != dst_device) synchronize(src_device);  // the source's writes are done
    set_device(dst_device);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(dst_device)));
    // across devices, wait: the source's stream must not reuse the source before it is read
    if (src_device != dst_device) cudaCheck(cudaStreamSynchronize(stream_of(dst_device)));
    return;
  }
  const int device = dst_device >= 0 ? dst_device : src_device;
  const cudaMemcpyKind kind = dst_device < 0 ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  set_device(device);
  cudaCheck(cudaMemcpyAsync(dst, src, bytes, kind, stream_of(device)));
  cudaCheck(cudaStreamSynchronize(stream_of(device)));
}

AllocStats alloc_stats(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mu);
  return c.stats;
}

void reset_peak_bytes(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mu);
  c.stats.peak_bytes_in_use = c.stats.bytes_in_use;
}

void empty_cache(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mu);
  set_device(device);
  for (auto& [bytes, blocks] : c.free_blocks) {
    for (void* p : blocks) cudaCheck(cudaFree(p));
    c.stats.system_frees += blocks.size();
    c.stats.bytes_cached -= bytes * blocks.size();
    blocks.clear();
  }
}

}  // namespace ag::cuda
