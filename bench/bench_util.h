#pragma once
// Timing helpers shared by the benchmarks: median of repeated runs after warm-up.
#include <algorithm>
#include <chrono>
#include <vector>

namespace bench {

// Median wall time in seconds of fn() over `reps` runs after `warmup` runs.
template <class F>
double median_seconds(F&& fn, int reps = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace bench
