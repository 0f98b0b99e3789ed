// Fused scaled_dot_product_attention against the same attention written with attograd's own ops
// (matmul, masked_fill, softmax, matmul), forward + backward, in one run: median time and the peak
// memory each holds beyond its inputs.
//
//   bench_attention [--batch 32] [--heads 4] [--T 256] [--d 32] [--reps 10]
#include <CLI/CLI.hpp>

#include <cmath>
#include <limits>

#include "attograd.h"
#include "bench/bench_util.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: fused attention vs unfused matmul-softmax-matmul"};
  int64_t B = 32, H = 4, T = 256, D = 32;
  int reps = 10;
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--heads", H, "heads")->check(CLI::PositiveNumber);
  app.add_option("--T", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--d", D, "head size")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  Generator gen(0);
  Tensor q = randn({B, H, T, D}, DType::f32, &gen).set_requires_grad(true);
  Tensor k = randn({B, H, T, D}, DType::f32, &gen).set_requires_grad(true);
  Tensor v = randn({B, H, T, D}, DType::f32, &gen).set_requires_grad(true);
  Tensor g = randn({B, H, T, D}, DType::f32, &gen);
  Tensor future = gt(arange(0, double(T)).reshape({1, T}), arange(0, double(T)).reshape({T, 1}));  // j > i
  const double scale = 1.0 / std::sqrt(double(D));

  auto fused = [&](bool causal) {
    SdpaOptions o;
    o.causal = causal;
    return scaled_dot_product_attention(q, k, v, o).out;
  };
  auto unfused = [&](bool causal) {
    Tensor s = mul(matmul(q, k.mT()), scale);
    if (causal) s = masked_fill(s, future, -std::numeric_limits<double>::infinity());
    return matmul(softmax(s, -1), v);
  };
  // median ms of forward+backward, and the peak bytes held beyond the inputs during one step
  auto measure = [&](auto attn, bool causal) {
    auto step = [&] {
      q.set_grad(Tensor()), k.set_grad(Tensor()), v.set_grad(Tensor());
      attn(causal).backward(g);
    };
    double secs = bench::median_seconds(step, reps, 2);
    q.set_grad(Tensor()), k.set_grad(Tensor()), v.set_grad(Tensor());
    const uint64_t base = alloc_stats().bytes_in_use;
    reset_peak_bytes();
    step();
    return std::pair{secs, double(alloc_stats().peak_bytes_in_use - base)};
  };

  fmt::print("attograd bench_attention: B {} H {} T {} d {}, f32, forward+backward, {} threads\n", B, H, T, D,
             num_threads());
  fmt::print("(one q/k/v tensor: {:.1f} MB; one T x T score tensor: {:.1f} MB)\n\n", B * H * T * D * 4 / 1e6,
             B * H * T * T * 4 / 1e6);
  fmt::print("{:<8} {:>12} {:>12} {:>9} {:>16} {:>16}\n", "mask", "fused ms", "unfused ms", "speedup",
             "fused peak MB", "unfused peak MB");
  for (bool causal : {false, true}) {
    auto [tf, mf] = measure(fused, causal);
    auto [tu, mu] = measure(unfused, causal);
    fmt::print("{:<8} {:>12.2f} {:>12.2f} {:>9.2f} {:>16.1f} {:>16.1f}\n", causal ? "causal" : "none", tf * 1e3,
               tu * 1e3, tu / tf, mf / 1e6, mu / 1e6);
  }
  fmt::print("\nTarget: fused >= 2x faster than unfused, peak extra memory O(B*H*T*d).\n");
  return 0;
}
