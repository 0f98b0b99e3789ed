#pragma once
// Threads. attograd owns one pool, OpenMP's: elementwise ops, reductions and the other kernels
// split their outer loops over it, and matmul splits its GEMMs over it too, calling a
// single-threaded GEMM inside (its own sgemm for f32, OpenBLAS's dgemm for f64). OpenBLAS's own
// (busy-waiting) threads are therefore never used, so OpenBLAS threads and OpenMP threads never
// multiply or fight over the cores.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ag {

// Number of threads kernels use: OMP_NUM_THREADS when set, else the number of cores.
int num_threads();
void set_num_threads(int n);  // 1 <= n <= max_threads(), else ag::Error
// The most threads set_num_threads accepts: 4 x the processors OpenMP sees, and at least 16. More
// would only oversubscribe the cores, and an OpenMP team of thousands of threads (a stack each) can
// exhaust memory or hang while it starts. OMP_NUM_THREADS above it is clamped to it.
int max_threads();

// Deterministic mode (default off; ATTOGRAD_DETERMINISTIC=1 sets it at start). On the CPU, attograd's own kernels
// give the same bits for the same inputs and seed at any thread count in either mode: each output element is computed
// by one thread in a fixed order, and a sum over a split range adds blocks fixed by the sizes (parallel_blocks). The
// switch covers OpenBLAS, whose results depend on the rows of C a call is given (a dgemm cut at row 1 or 3 of C
// gives other bits): f64 matmul (dgemm), f32 matmul under ATTOGRAD_GEMM=openblas. With it on, matmul cuts C into
// pieces fixed by the sizes, not by the thread count (core/cpu/matmul.cpp). The f32 training path on attograd's
// sgemm runs the same code either way, so it costs nothing there. There are no GPU kernels yet.
// Tested in tests/core/test_determinism.cpp: 1, 2, 3 and 4 threads, outputs and gradients compared with memcmp.
void set_deterministic(bool on);
bool is_deterministic();

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

namespace detail {
// Runs one chunk. Every chunk of a parallel_for, on the calling thread or in the OpenMP region,
// goes through this one function, so the body is compiled once: inlined into both places, GCC
// could vectorise the two copies differently (peel for alignment in one, call libm instead of
// libmvec in the other) and round differently. noipa (GCC): not inlined, and no clone specialised
// for the inline call's begin = 0 either; clang has only noinline (and does not clone by default).
#if defined(__clang__)
#define AG_ONE_COPY __attribute__((noinline))
#else
#define AG_ONE_COPY __attribute__((noipa))
#endif
template <class F>
AG_ONE_COPY void run_chunk(F& body, int64_t b, int64_t e) {
  body(b, e);
}
}  // namespace detail

// Runs body(begin, end) over [0, n) in one contiguous chunk per thread; inline when the range
// is smaller than `grain`, we are already inside a parallel region, or in a SerialScope. The chunking depends only
// on n and the thread count, never on timing. body must not throw: an exception cannot leave an
// OpenMP region (check arguments in the op front, before the kernel).
//
// Determinism: results must not depend on the thread count. So a body computes each output
// element in one place whatever the chunk it falls in (rows whole; a sum over a range of
// elements split into blocks fixed by n: parallel_blocks), and a flat vectorised loop
// over elements uses parallel_for_elements, whose chunk bounds keep every element in the same
// lane of the same kind of loop.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  int nt = omp_in_parallel() || SerialScope::active() ? 1 : num_threads();
  if (grain < 1) grain = 1;
  int64_t max_chunks = (n + grain - 1) / grain;
  if (nt > max_chunks) nt = int(max_chunks);
  if (nt <= 1) {
    detail::run_chunk(body, int64_t(0), n);
    return;
  }
  // The chunks are fixed by n and nt alone; OpenMP may grant fewer threads than asked (e.g.
  // OMP_DYNAMIC, thread limits), and then a thread takes several chunks, never other bounds.
  const int64_t chunk = (n + nt - 1) / nt;
#pragma omp parallel num_threads(nt)
  {
    for (int c = omp_get_thread_num(); c < nt; c += omp_get_num_threads()) {
      int64_t b = std::min<int64_t>(n, c * chunk), e = std::min<int64_t>(n, b + chunk);
      if (b < e) detail::run_chunk(body, b, e);
    }
  }
}

// Chunk bounds of parallel_for_elements fall on multiples of this many elements: a multiple of
// every vector width (16 floats in AVX-512, unrolled), so a vectorised loop over a chunk runs its
// vector body over the whole chunk and leaves a scalar tail only at n. Why it matters: libmvec's
// exp, log, tanh, erf (the vector loop) and libm's (the scalar tail) may round one element
// differently, so a tail that moved with the thread count would change the results.
inline constexpr int64_t kVecBlock = 64;

// parallel_for over the elements [0, n) of a flat loop, with chunk bounds on multiples of
// kVecBlock (see there). Same inline rule as parallel_for for n <= grain.
template <class F>
void parallel_for_elements(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  const int64_t blocks = (n + kVecBlock - 1) / kVecBlock;
  parallel_for(blocks, (std::max<int64_t>(grain, 1) + kVecBlock - 1) / kVecBlock, [&](int64_t b, int64_t e) {
    body(b * kVecBlock, std::min(n, e * kVecBlock));
  });
}

// A reduction over [0, n) whose result does not depend on the thread count: the range is cut
// into fixed blocks [k block, (k+1) block) (the last one shorter), fixed by n and block alone,
// partial(begin, end) reduces each block (blocks run in parallel), and the partials come back in
// block order for the caller to combine in that order.
template <class T, class F>
std::vector<T> parallel_blocks(int64_t n, int64_t block, F&& partial) {
  const int64_t nb = n > 0 ? (n + block - 1) / block : 0;
  std::vector<T> out(static_cast<size_t>(nb));
  parallel_for(nb, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) out[size_t(k)] = partial(k * block, std::min(n, (k + 1) * block));
  });
  return out;
}

// Elements below which an elementwise loop stays on one thread (forking costs ~ a few us).
inline constexpr int64_t kGrain = 32768;

}  // namespace ag
