#pragma once
// Counters of a caching allocator (plain struct: also compiled by nvcc).
#include <cstdint>

namespace ag {

struct AllocStats {
  uint64_t system_allocs = 0;      // blocks obtained from the system (cache misses)
  uint64_t system_frees = 0;       // blocks given back (empty_cache)
  uint64_t cache_hits = 0;         // allocations served from the cache
  uint64_t bytes_in_use = 0;       // held by live storages
  uint64_t bytes_cached = 0;       // free and kept for reuse
  uint64_t peak_bytes_in_use = 0;
};

}  // namespace ag
