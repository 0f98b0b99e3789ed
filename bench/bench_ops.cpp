// Memory-bound ops against memcpy, in one run: add, gelu, softmax and layer_norm, forward and
// forward+backward through the tape, a cast of f32 to bf16 and a sum over rows. Each op is
// reported as effective bandwidth (the bytes it must read and write, divided by its time) beside a
// memcpy that moves the same number of bytes (read half, write half) split over the same threads,
// so both sit in the same cache regime: on a CPU with a 32 MB L3, a 16 MB memcpy runs from the L3,
// a 64 MB one from DRAM.
//
//   bench_ops [--n 4194304] [--cols 1024] [--reps 30]
#include <CLI/CLI.hpp>

#include <cstring>
#include <map>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: memory-bound ops vs memcpy of the same bytes (GB/s)"};
  int64_t n = int64_t(1) << 22, cols = 1024;
  int reps = 30;
  app.add_option("--n", n, "elements per tensor (f32)")->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "row length for softmax and layer_norm")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_ops"); rc >= 0) return rc;
  n = (n + cols - 1) / cols * cols;
  const int64_t rows = n / cols;
  const double fb = double(n) * sizeof(float);  // bytes of one f32 tensor

  // Median time of a memcpy moving `tensors` tensors' worth of bytes (half read, half written).
  std::map<double, double> memcpy_cache;
  auto memcpy_seconds = [&](double tensors) {
    if (auto it = memcpy_cache.find(tensors); it != memcpy_cache.end()) return it->second;
    const int64_t m = int64_t(double(n) * tensors / 2);
    Tensor src = rand({m}), dst = zeros({m});
    double t = bench::median_seconds([&] {
      parallel_for(m, kGrain, [&](int64_t b, int64_t e) {
        std::memcpy(dst.data<float>() + b, src.data<float>() + b, size_t(e - b) * sizeof(float));
      });
    }, reps);
    return memcpy_cache[tensors] = t;
  };

  fmt::print("attograd bench_ops: {} f32 elements ({:.1f} MB per tensor), rows of {}, {} threads\n\n", n, fb / 1e6,
             cols, num_threads());
  fmt::print("{:<28} {:>8} {:>9} {:>9} {:>14} {:>10}\n", "op", "tensors", "ms", "GB/s", "memcpy GB/s", "ratio");
  auto row = [&](const char* name, double secs, double tensors) {
    double gbs = tensors * fb / secs / 1e9, ref = tensors * fb / memcpy_seconds(tensors) / 1e9;
    fmt::print("{:<28} {:>8} {:>9.3f} {:>9.1f} {:>14.1f} {:>10.2f}\n", name, tensors, secs * 1e3, gbs, ref, gbs / ref);
  };

  Tensor a = rand({rows, cols}).set_requires_grad(true), b = rand({rows, cols}).set_requires_grad(true);
  Tensor g = rand({rows, cols});
  Tensor w = ones({cols}).set_requires_grad(true), bias = zeros({cols}).set_requires_grad(true);
  auto fwd = [&](auto op) { return bench::median_seconds([&] { NoGradGuard ng; op(); }, reps); };
  auto fwd_bwd = [&](auto op) {
    return bench::median_seconds([&] {
      a.set_grad(Tensor()), b.set_grad(Tensor()), w.set_grad(Tensor()), bias.set_grad(Tensor());
      op().backward(g);
    }, reps);
  };
  // "tensors": how many full-size tensors the op must read or write. Forward: inputs + y.
  // Backward adds what it reads (g, and x or y) and writes (the input gradients).
  row("add forward", fwd([&] { return add(a, b); }), 3);                     // a, b -> y
  row("add forward+backward", fwd_bwd([&] { return add(a, b); }), 3 + 3);    // g -> da, db
  row("gelu forward", fwd([&] { return gelu(a); }), 2);                      // x -> y
  row("gelu forward+backward", fwd_bwd([&] { return gelu(a); }), 2 + 3);     // x, g -> dx
  row("softmax forward", fwd([&] { return softmax(a, -1); }), 2);            // x -> y
  row("softmax forward+backward", fwd_bwd([&] { return softmax(a, -1); }), 2 + 3);  // y, g -> dx
  row("layer_norm forward", fwd([&] { return layer_norm(a, {cols}, w, bias); }), 2);
  row("layer_norm forward+backward", fwd_bwd([&] { return layer_norm(a, {cols}, w, bias); }), 2 + 3);  // x, g -> dx
  // the copy of a linear's input that bf16 autocast keeps for backward: 4 bytes read, 2 written
  row("cast f32 -> bf16", fwd([&] { return a.to(DType::bf16); }), 1.5);
  // a bias gradient: the sum over every row, one value per column
  row("sum over rows", fwd([&] { return sum(a, {0}); }), 1);
  fmt::print("\nratio = op GB/s / memcpy GB/s for the same bytes; target >= 0.6.\n");
  return 0;
}
