// Gradient checkpointing of transformer blocks (docs/math/checkpointing.md): a stack of L
// TransformerBlocks (d 128, 4 heads, MLP 4d, causal) trained forward + backward plainly and with
// each block checkpointed (ag::checkpoint: recomputed in backward), at each L of --layers.
//
// Memory, from the allocator (exact, not noisy):
//   held   bytes in use once the stack's forward has returned, its output held: what the tape
//          keeps for backward. Formula, f32, N = B T tokens, H heads, MLP width m:
//            plain         L A,   A = (9 d + 2 m + H + 4) N floats   a block's saved activations
//            checkpointed  L d N floats                          each block's input (and the output)
//   peak   the most in use during forward + backward. Formula: plain L A + X; checkpointed
//          A + X + max(L d N, d N + (L - 1) P): one block's activations exist again while its
//          backward runs, beside the kept inputs (at the top block) or beside the gradients of the
//          P parameters of each block above (at the bottom block, the larger when P > d N). X, what
//          a block's backward allocates besides (its own parameters' gradients included), is the
//          plain peak at the smallest L measured minus L A.
// Time: the median of --reps steps of each mode, taken alternately (plain, checkpointed, plain,
// ...) so that a change in the machine's load reaches both; the formula's ratio is 4/3 (backward
// ~ 2 forwards, plus one more forward of every block).
//
//   bench_checkpoint [--layers 1,2,4,8] [--batch 32] [--T 128] [--d 128] [--reps 5] [--svg OUT]
// --svg OUT: the held and peak memory against L, measured (points) beside the formula (dashed).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "nn/transformer.h"

using namespace ag;

namespace {

struct Row {
  int64_t layers = 0;
  double held[2] = {0, 0}, peak[2] = {0, 0}, ms[2] = {0, 0};  // [plain, checkpointed], MB and ms
};

double mb(double bytes) { return bytes / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd: gradient checkpointing of a stack of transformer blocks, memory and time"};
  std::vector<int64_t> layer_counts{4};
  int64_t B = 32, T = 128, d = 128;
  int reps = 5;
  std::string svg;
  app.add_option("--layers", layer_counts, "transformer blocks in the stack; a list (1,2,4,8) measures each")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--T", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--d", d, "model width (4 heads, MLP 4d); a multiple of 4")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed steps of each mode (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--svg", svg, "write the memory against the layers, measured and formula, to this SVG file");
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_checkpoint"); rc >= 0) return rc;
  if (d % 4 != 0) {
    fmt::print(stderr, "bench_checkpoint: --d {}: 4 heads need a multiple of 4\n", d);
    return 2;
  }

  const int64_t H = 4, m = 4 * d, N = B * T;
  const double A = double((9 * d + 2 * m + H + 4) * N) * 4;  // bytes a block keeps, f32
  const double input = double(d * N) * 4;                    // one block's input (or output)
  const double P = double(4 * d * d + 2 * d * m + 9 * d + m) * 4;  // a block's parameters (or gradients)
  fmt::print("attograd bench_checkpoint: TransformerBlocks (d {}, {} heads, MLP {}, causal), B {} T {} (N = {} "
             "tokens), {} threads\n",
             d, H, m, B, T, N, num_threads());
  fmt::print("a block keeps (9 d + 2 m + H + 4) N = {} floats = {:.2f} MB for backward; its input is d N = {:.2f} "
             "MB\n\n",
             (9 * d + 2 * m + H + 4) * N, mb(A), mb(input));

  Generator gen(0);
  const Tensor x = randn({B, T, d}, DType::f32, &gen);  // allocated before every measurement
  std::vector<Row> rows;
  for (int64_t L : layer_counts) {
    std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
    for (int64_t i = 0; i < L; ++i)
      blocks.push_back(std::make_shared<nn::TransformerBlock>(
          d, H, nn::TransformerBlock::Options{.mlp_hidden = m, .causal = true, .generator = &gen}));
    check(double(blocks[0]->num_parameters()) * 4 == P, "bench_checkpoint: a block has {} parameters, the count {}",
          blocks[0]->num_parameters(), P / 4);
    uint64_t base = 0, held = 0;
    auto zero_grad = [&] {
      for (auto& b : blocks) b->zero_grad();
    };
    auto step = [&](bool ckpt) {
      zero_grad();
      Tensor h = x;
      for (auto& b : blocks) {
        nn::TransformerBlock* block = b.get();
        h = ckpt ? checkpoint([block](const Tensor& t) { return block->forward(t); }, h, block->parameters())
                 : b->forward(h);
      }
      held = alloc_stats().bytes_in_use - base;  // the output h held, as the loss needs it
      mean(mul(h, h)).backward();
    };
    Row r;
    r.layers = L;
    for (int mode : {0, 1}) {
      step(mode == 1);  // warm-up: the allocator's caches filled as in every later step
      zero_grad();      // the parameters' gradients are made in backward: counted in the peak
      base = alloc_stats().bytes_in_use;
      reset_peak_bytes();
      step(mode == 1);
      r.held[mode] = mb(double(held));
      r.peak[mode] = mb(double(alloc_stats().peak_bytes_in_use - base));
    }
    std::vector<double> t[2];
    for (int i = 0; i < reps; ++i)
      for (int mode : {0, 1}) t[mode].push_back(bench::seconds_of([&] { step(mode == 1); }));
    for (int mode : {0, 1}) r.ms[mode] = bench::median(t[mode]) * 1e3;
    rows.push_back(r);
  }

  // X: what a block's backward allocates beyond the activations, from the smallest stack measured
  const double X = rows.front().peak[0] * 1e6 - double(rows.front().layers) * A;
  auto peak_formula = [&](int mode, double L) {
    return mode == 0 ? L * A + X : A + X + std::max(L * input, input + (L - 1) * P);
  };
  fmt::print("{:>6} {:<13} {:>9} {:>11} {:>9} {:>11} {:>9}\n", "layers", "mode", "held MB", "formula MB", "peak MB",
             "formula MB", "step ms");
  for (const Row& r : rows) {
    const double L = double(r.layers);
    const double held_f[2] = {L * A, L * input}, peak_f[2] = {peak_formula(0, L), peak_formula(1, L)};
    for (int mode : {0, 1})
      fmt::print("{:>6} {:<13} {:>9.2f} {:>11.2f} {:>9.2f} {:>11.2f} {:>9.1f}\n", r.layers,
                 mode ? "checkpointed" : "plain", r.held[mode], mb(held_f[mode]), r.peak[mode], mb(peak_f[mode]),
                 r.ms[mode]);
  }
  fmt::print("\nX = {:.2f} MB (the plain peak at L = {} minus L A); P = 4 d^2 + 2 d m + 9 d + m = {:.2f} MB, a "
             "block's parameters\n",
             mb(X), rows.front().layers, mb(P));
  fmt::print("checkpointed / plain, step time (medians of {} alternating steps each; formula 4/3 = 1.33):", reps);
  for (const Row& r : rows) fmt::print(" L {}: {:.2f}", r.layers, r.ms[1] / r.ms[0]);
  fmt::print("\n");

  if (!svg.empty()) {
    apps::LineChart held, peak;
    held.title = fmt::format("kept for backward (B {} T {} d {})", B, T, d);
    peak.title = "peak during forward + backward";
    for (apps::LineChart* c : {&held, &peak}) c->x_label = "blocks L", c->y_label = "MB";
    for (int mode : {0, 1}) {
      const std::string name = mode ? "checkpointed" : "plain";
      apps::Series hm{name + ", measured", {}, {}, mode}, hf{name + ", formula", {}, {}, mode, true};
      apps::Series pm = hm, pf = hf;
      for (const Row& r : rows) {
        const double L = double(r.layers);
        for (apps::Series* s : {&hm, &hf, &pm, &pf}) s->x.push_back(L);
        hm.y.push_back(r.held[mode]), pm.y.push_back(r.peak[mode]);
        hf.y.push_back(mb(mode ? L * input : L * A));
        pf.y.push_back(mb(peak_formula(mode, L)));
      }
      held.series.push_back(hm), held.series.push_back(hf);
      peak.series.push_back(pm), peak.series.push_back(pf);
    }
    apps::write_file_atomic(svg, apps::svg_line_charts({held, peak}, 2));
    fmt::print("wrote {}\n", svg);
  }
  return 0;
}
