// Memory-bound ops against memcpy, in one run: add, gelu, softmax and layer_norm, forward and
// forward+backward through the tape, as effective bandwidth (bytes each op must read and write
// divided by its time) beside a memcpy of the same buffer split over the same threads.
//
//   bench_ops [--n 4194304] [--cols 1024] [--reps 20]
#include <CLI/CLI.hpp>

#include <cstring>

#include "attograd.h"
#include "bench/bench_util.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: memory-bound ops vs memcpy (GB/s)"};
  int64_t n = int64_t(1) << 22, cols = 1024;
  int reps = 20;
  app.add_option("--n", n, "elements per tensor (f32)")->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "row length for softmax and layer_norm")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  n = (n + cols - 1) / cols * cols;
  const int64_t rows = n / cols;
  const double fb = double(n) * sizeof(float);  // bytes of one f32 tensor

  // memcpy of one tensor (read + write = 2 fb bytes), split over the same threads as the ops
  Tensor src = rand({n}), dst = empty({n});
  double t_memcpy = bench::median_seconds([&] {
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data<float>() + b, src.data<float>() + b, size_t(e - b) * sizeof(float));
    });
  }, reps);
  const double memcpy_gbs = 2 * fb / t_memcpy / 1e9;

  fmt::print("attograd bench_ops: {} f32 elements ({:.1f} MB per tensor), rows of {}, {} threads\n", n, fb / 1e6, cols,
             num_threads());
  fmt::print("memcpy (same threads): {:.1f} GB/s\n\n", memcpy_gbs);
  fmt::print("{:<28} {:>10} {:>10} {:>12}\n", "op", "ms", "GB/s", "vs memcpy");
  auto row = [&](const char* name, double secs, double tensors_moved) {
    double gbs = tensors_moved * fb / secs / 1e9;
    fmt::print("{:<28} {:>10.3f} {:>10.1f} {:>12.2f}\n", name, secs * 1e3, gbs, gbs / memcpy_gbs);
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
  // Bytes: forward reads its inputs and writes y; backward reads what it needs and writes dx.
  row("add forward", fwd([&] { return add(a, b); }), 3);                         // a, b -> y
  row("add forward+backward", fwd_bwd([&] { return add(a, b); }), 3 + 3);        // g -> da, db
  row("gelu forward", fwd([&] { return gelu(a); }), 2);                          // x -> y
  row("gelu forward+backward", fwd_bwd([&] { return gelu(a); }), 2 + 3);         // x, g -> dx
  row("softmax forward", fwd([&] { return softmax(a, -1); }), 2);                // x -> y
  row("softmax forward+backward", fwd_bwd([&] { return softmax(a, -1); }), 2 + 3);  // y, g -> dx
  row("layer_norm forward", fwd([&] { return layer_norm(a, {cols}, w, bias); }), 2);
  row("layer_norm forward+backward", fwd_bwd([&] { return layer_norm(a, {cols}, w, bias); }), 2 + 3);  // x, g -> dx
  fmt::print("\nTarget: >= 0.6 of memcpy for each op (forward and forward+backward).\n");
  return 0;
}
