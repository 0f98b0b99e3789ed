// Allocations and page faults per steady-state training step of a small MLP (784-256-256-10,
// batch 128, SGD): the caching allocator should serve every activation and gradient buffer from
// its cache after the first steps, so system allocations per step should be 0, and so should
// fresh page faults (first touches of new memory).
//
//   bench_alloc [--steps 20]
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "optim/sgd.h"

using namespace ag;

namespace {
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd: allocations per steady-state training step"};
  int steps = 20, warmup = 3;
  app.add_option("--steps", steps, "measured steps")->check(CLI::PositiveNumber);
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_alloc"); rc >= 0) return rc;

  Generator gen(0);
  auto param = [&](Shape s, double bound) { return rand(s, DType::f32, &gen, -bound, bound).set_requires_grad(true); };
  std::vector<Tensor> p = {param({784, 256}, 1 / 28.0), param({256}, 1 / 28.0), param({256, 256}, 1 / 16.0),
                           param({256}, 1 / 16.0),      param({256, 10}, 1 / 16.0), param({10}, 1 / 16.0)};
  optim::SGD opt(p, {.lr = 0.01, .momentum = 0.9});
  Tensor x = randn({128, 784}, DType::f32, &gen), y = randint(0, 10, {128}, &gen);
  auto step = [&] {
    Tensor h = relu(add(matmul(x, p[0]), p[1]));
    h = relu(add(matmul(h, p[2]), p[3]));
    Tensor loss = cross_entropy(add(matmul(h, p[4]), p[5]), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss.item<double>();
  };
  for (int i = 0; i < warmup; ++i) step();
  AllocStats s0 = alloc_stats();
  long f0 = minor_faults();
  double secs = bench::median_seconds(step, steps, 0);
  AllocStats s1 = alloc_stats();
  long f1 = minor_faults();
  fmt::print("attograd bench_alloc: MLP 784-256-256-10, batch 128, SGD, {} threads, {} measured steps\n",
             num_threads(), steps);
  fmt::print("median step              {:.3f} ms\n", secs * 1e3);
  fmt::print("system allocations/step  {:.2f}   (target 0)\n", double(s1.system_allocs - s0.system_allocs) / steps);
  fmt::print("cache hits/step          {:.1f}\n", double(s1.cache_hits - s0.cache_hits) / steps);
  fmt::print("minor page faults/step   {:.2f}\n", double(f1 - f0) / steps);
  fmt::print("bytes in use / cached    {:.2f} MB / {:.2f} MB\n", s1.bytes_in_use / 1e6, s1.bytes_cached / 1e6);
  return s1.system_allocs == s0.system_allocs ? 0 : 1;
}
