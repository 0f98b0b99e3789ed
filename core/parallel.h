#pragma once
// Threads. attograd owns one pool, OpenMP's: elementwise ops, reductions and the other kernels
// split their outer loops over it, and matmul splits its GEMMs over it too, calling a
// single-threaded GEMM inside (its own sgemm for f32, OpenBLAS's dgemm for f64). OpenBLAS's own
// (busy-waiting) threads are therefore never used, so OpenBLAS threads and OpenMP threads never
// multiply or fight over the cores.
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace ag {

// Number of threads kernels use: OMP_NUM_THREADS when set, else the number of cores.
int num_threads();
void set_num_threads(int n);

// Makes parallel_for run inline on this thread while it lives: for helper threads (the data
// loader's) that must not open a second OpenMP team beside the training thread's.
class SerialScope {
 public:
  SerialScope() : prev_(active()) { active() = true; }
  ~SerialScope() { active() = prev_; }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;
  static bool& active() {
    static thread_local bool on = false;
    return on;
  }

 private:
  bool prev_;
};

// Runs body(begin, end) over [0, n) in one contiguous chunk per thread; inline when the range
// is smaller than `grain`, we are already inside a parallel region, or in a SerialScope. The chunking depends only
// on n and the thread count, never on timing. body must not throw: an exception cannot leave an
// OpenMP region (check arguments in the op front, before the kernel).
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  int nt = omp_in_parallel() || SerialScope::active() ? 1 : num_threads();
  if (grain < 1) grain = 1;
  int64_t max_chunks = (n + grain - 1) / grain;
  if (nt > max_chunks) nt = int(max_chunks);
  if (nt <= 1) {
    body(int64_t(0), n);
    return;
  }
  // The chunks are fixed by n and nt alone; OpenMP may grant fewer threads than asked (e.g.
  // OMP_DYNAMIC, thread limits), and then a thread takes several chunks, never other bounds.
  const int64_t chunk = (n + nt - 1) / nt;
#pragma omp parallel num_threads(nt)
  {
    for (int c = omp_get_thread_num(); c < nt; c += omp_get_num_threads()) {
      int64_t b = std::min<int64_t>(n, c * chunk), e = std::min<int64_t>(n, b + chunk);
      if (b < e) body(b, e);
    }
  }
}

// Elements below which an elementwise loop stays on one thread (forking costs ~ a few us).
inline constexpr int64_t kGrain = 32768;

}  // namespace ag
