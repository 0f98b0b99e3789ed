#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace ag {

namespace {
int initial_threads() {
  // OpenBLAS runs single-threaded inside our own pool (see parallel.h).
  openblas_set_num_threads(1);
  const char* env = std::getenv("OMP_NUM_THREADS");
  int n = env ? std::atoi(env) : 0;
  return n > 0 ? std::min(n, max_threads()) : omp_get_num_procs();
}
std::atomic<int> g_threads{initial_threads()};  // read by parallel_for on any thread
bool initial_deterministic() {
  const char* env = std::getenv("ATTOGRAD_DETERMINISTIC");
  return env && env[0] && std::string_view(env) != "0";
}
std::atomic<bool> g_deterministic{initial_deterministic()};
}  // namespace

void set_deterministic(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool is_deterministic() { return g_deterministic.load(std::memory_order_relaxed); }

int num_threads() { return g_threads.load(std::memory_order_relaxed); }

int max_threads() { return std::max(16, 4 * omp_get_num_procs()); }

void set_num_threads(int n) {
  check(n >= 1 && n <= max_threads(), "set_num_threads: expected 1 <= n <= {} (4 x the {} processors), got {}",
        max_threads(), omp_get_num_procs(), n);
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
  openblas_set_num_threads(1);
}

}  // namespace ag
