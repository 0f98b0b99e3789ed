// One TransformerBlock (nn/transformer.h: pre-LN, fused qkv, d 128, 4 heads, MLP 4d, GELU),
// forward + backward at B 32, T 128, f32, without and with the causal mask, beside its PyTorch twin
// (bench/torch_reference.py block, when a Python with torch is found) in one run: median ms,
// blocks per second, the ratio, and the peak memory each holds beyond its input.
//
//   bench_block [--batch 32] [--T 128] [--d 128] [--heads 4] [--reps 20] [--script PATH]
#include <CLI/CLI.hpp>
#include <cblas.h>

#include <string>
#include <vector>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "nn/transformer.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: one TransformerBlock forward+backward, beside PyTorch"};
  int64_t B = 32, T = 128, d = 128, H = 4;
  int reps = 20;
  std::string script;
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--T", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--d", d, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", H, "heads (must divide d)")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--script", script, "bench/torch_reference.py (default: found next to this source)");
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_block"); rc >= 0) return rc;
  if (d % H != 0) {
    fmt::print(stderr, "bench_block: --heads {} must divide --d {}\n", H, d);
    return 2;
  }

  Generator gen(0);
  Tensor x = randn({B, T, d}, DType::f32, &gen).set_requires_grad(true);  // as if from a layer below
  Tensor g = randn({B, T, d}, DType::f32, &gen);                           // fixed upstream gradient

  fmt::print("attograd bench_block: TransformerBlock d {} heads {} MLP {}, B {} T {}, f32, forward+backward, "
             "{} threads, OMP_WAIT_POLICY {}, OpenBLAS core {}\n",
             d, H, 4 * d, B, T, num_threads(), bench::omp_wait_policy(), openblas_get_corename());
  struct Row {
    double secs, bytes;
  };
  std::vector<Row> rows;
  for (bool causal : {false, true}) {
    nn::TransformerBlock block(d, H, {.mlp_hidden = 4 * d, .causal = causal, .generator = &gen});
    auto step = [&] {
      block.zero_grad();
      x.set_grad(Tensor());
      block.forward(x).backward(g);
    };
    const double secs = bench::median_seconds(step, reps, 2);
    block.zero_grad();
    x.set_grad(Tensor());
    const uint64_t base = alloc_stats().bytes_in_use;
    reset_peak_bytes();
    step();
    rows.push_back({secs, double(alloc_stats().peak_bytes_in_use - base)});
  }

  // PyTorch, same shapes, thread count and repetitions, after ours (so the two never overlap)
  auto torch = bench::torch_reference(
      bench::torch_script_path(__FILE__, argv[0], script), "block",
      {"--batch", std::to_string(B), "--T", std::to_string(T), "--d", std::to_string(d), "--heads", std::to_string(H),
       "--hidden", std::to_string(4 * d), "--threads", std::to_string(num_threads()), "--reps", std::to_string(reps),
       "--warmup", "2"},
      {"none", "causal"});
  if (torch)
    fmt::print("PyTorch {} ({} threads), {}\n", (*torch)["torch"].get<std::string>(), (*torch)["threads"].get<int>(),
               (*torch)["impl"].get<std::string>());
  fmt::print("\n{:<8} {:>8} {:>10} {:>10} {:>12} {:>12} {:>9} {:>13}\n", "mask", "ag ms", "ag blk/s", "torch ms",
             "torch blk/s", "torch/ag", "ag MB", "torch RSS MB");
  for (bool causal : {false, true}) {
    const Row& r = rows[causal];
    const double ms = r.secs * 1e3;
    fmt::print("{:<8} {:>8.2f} {:>10.1f}", causal ? "causal" : "none", ms, 1.0 / r.secs);
    if (torch) {
      const auto& t = torch->at("results").at(causal ? "causal" : "none");
      const double tms = t["ms"].get<double>();
      fmt::print(" {:>10.2f} {:>12.1f} {:>12.2f} {:>9.1f} {:>13.1f}\n", tms, 1e3 / tms, tms / ms, r.bytes / 1e6,
                 t["peak_rss_mb"].get<double>());
    } else {
      fmt::print(" {:>10} {:>12} {:>12} {:>9.1f} {:>13}\n", "-", "-", "-", r.bytes / 1e6, "-");
    }
  }
  fmt::print("\ntorch/ag = PyTorch ms / attograd ms (> 1: attograd is faster). ag MB: peak bytes held beyond the\n"
             "input (alloc_stats); torch RSS MB: growth of the PyTorch process's max RSS over its warm-up and\n"
             "timed runs (CPU torch keeps no allocator stats).\n");
  return 0;
}
