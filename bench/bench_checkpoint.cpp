// Gradient checkpointing of transformer blocks, in one run: a stack of TransformerBlocks
// (d 128, 4 heads, MLP 512, causal) trained forward + backward plainly and with each block
// checkpointed (recomputed in backward). Prints median step time and the peak memory held
// beyond the inputs.
//
//   bench_checkpoint [--layers 4] [--batch 32] [--T 128] [--reps 5]
#include <CLI/CLI.hpp>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "nn/transformer.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: gradient checkpointing, time and memory"};
  int64_t layers = 4, B = 32, T = 128, d = 128;
  int reps = 5;
  app.add_option("--layers", layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--T", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_checkpoint"); rc >= 0) return rc;

  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
  for (int64_t i = 0; i < layers; ++i) blocks.push_back(std::make_shared<nn::TransformerBlock>(d, 4, 4 * d, 0.0, true));
  Generator gen(0);
  Tensor x = randn({B, T, d}, DType::f32, &gen);
  auto step = [&](bool ckpt) {
    Tensor h = x;
    for (auto& b : blocks) {
      b->zero_grad();
      auto params = b->parameters();
      h = ckpt ? checkpoint([&](const Tensor& t) { return b->forward(t); }, h, params) : b->forward(h);
    }
    mean(mul(h, h)).backward();
  };
  fmt::print("attograd bench_checkpoint: {} TransformerBlocks (d {}, 4 heads, MLP {}, causal), B {} T {}, {} threads\n\n",
             layers, d, 4 * d, B, T, num_threads());
  fmt::print("{:<14} {:>10} {:>14}\n", "mode", "step ms", "peak MB");
  for (bool ckpt : {false, true}) {
    double secs = bench::median_seconds([&] { step(ckpt); }, reps, 1);
    const uint64_t base = alloc_stats().bytes_in_use;
    reset_peak_bytes();
    step(ckpt);
    fmt::print("{:<14} {:>10.1f} {:>14.1f}\n", ckpt ? "checkpointed" : "plain", secs * 1e3,
               double(alloc_stats().peak_bytes_in_use - base) / 1e6);
  }
  return 0;
}
