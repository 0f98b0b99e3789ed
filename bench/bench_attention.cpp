// Fused scaled_dot_product_attention against the same attention written with attograd's own ops
// (matmul, masked_fill, softmax, matmul) and against PyTorch (bench/torch_reference.py attention,
// when a Python with torch is found), forward + backward, in one run: median time and the peak
// memory each holds beyond its inputs.
//
//   bench_attention [--batch 32] [--heads 4] [--T 256] [--d 32] [--reps 10] [--device cpu|cuda]
//                   [--script PATH] [--json]
//
// --device cuda runs both sides on the GPU; each timed run ends when the GPU has finished it
// (ag::synchronize / torch.cuda.synchronize), and the memory is the device allocator's.
//
// --json prints one JSON line of our side only (no PyTorch run, no table), for bench/compare_pytorch.
//
// One more row, ours only: causal fused attention whose q and k first go through rope() (rotary
// positions, its own pass over q and k each way), against the fused row without it: what a RoPE
// fused into the attention kernel could save at most.
#include <CLI/CLI.hpp>
#include <cblas.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: fused attention vs unfused matmul-softmax-matmul"};
  int64_t B = 32, H = 4, T = 256, D = 32;
  int reps = 10;
  std::string script;
  bool json = false;
  int threads = 0;
  std::string device_name = "cpu";
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--heads", H, "heads")->check(CLI::PositiveNumber);
  app.add_option("--T", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--d", D, "head size")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--script", script, "bench/torch_reference.py (default: found next to this source)");
  app.add_flag("--json", json, "print one JSON line of attograd's results only (no PyTorch run, no table)");
  app.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS, else the cores)")->check(CLI::PositiveNumber);
  app.add_option("--device", device_name, "cpu or cuda (cuda:N): where both sides run")->capture_default_str();
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_attention"); rc >= 0) return rc;
  if (threads > 0) set_num_threads(threads);
  const std::optional<Device> parsed = bench::parse_device("bench_attention", device_name);
  if (!parsed) return 2;
  const Device dev = *parsed;

  Generator gen(0);
  auto leaf = [&] { return randn({B, H, T, D}, DType::f32, &gen).to(dev).set_requires_grad(true); };
  Tensor q = leaf(), k = leaf(), v = leaf();
  Tensor g = randn({B, H, T, D}, DType::f32, &gen).to(dev);
  Tensor future =
      gt(arange(0, double(T)).reshape({1, T}), arange(0, double(T)).reshape({T, 1})).to(dev);  // j > i
  const double scale = 1.0 / std::sqrt(double(D));

  auto fused = [&](bool causal) {
    SdpaOptions o;
    o.causal = causal;
    return scaled_dot_product_attention(q, k, v, o).out;
  };
  auto fused_rope = [&](bool causal) {
    SdpaOptions o;
    o.causal = causal;
    return scaled_dot_product_attention(rope(q), rope(k), v, o).out;
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
      synchronize(dev);
    };
    double secs = bench::median_seconds(step, reps, 2);
    q.set_grad(Tensor()), k.set_grad(Tensor()), v.set_grad(Tensor());
    const uint64_t base = alloc_stats(dev).bytes_in_use;
    reset_peak_bytes(dev);
    step();
    return std::pair{secs, double(alloc_stats(dev).peak_bytes_in_use - base)};
  };

  if (!json)
    fmt::print("attograd bench_attention: B {} H {} T {} d {}, f32, forward+backward, on {}, {} threads, "
             "OMP_WAIT_POLICY {}, OpenBLAS core {}\n",
             B, H, T, D, dev, num_threads(), bench::omp_wait_policy(), openblas_get_corename());
  if (!json)
    fmt::print("(one q/k/v tensor: {:.1f} MB; one T x T score tensor: {:.1f} MB)\n\n", B * H * T * D * 4 / 1e6,
             B * H * T * T * 4 / 1e6);
  struct Row {
    double fused_s, fused_bytes, unfused_s, unfused_bytes;
  };
  std::vector<Row> rows;
  for (bool causal : {false, true}) {
    auto [tf, mf] = measure(fused, causal);
    auto [tu, mu] = measure(unfused, causal);
    rows.push_back({tf, mf, tu, mu});
  }
  const double rope_s = measure(fused_rope, true).first;
  if (json) {
    nlohmann::json j;
    j["device"] = dev.str();
    j["threads"] = num_threads();
    for (bool causal : {false, true}) {
      const Row& r = rows[causal];
      j["results"][causal ? "causal" : "none"] = {{"ms", r.fused_s * 1e3},
                                                  {"peak_mb", r.fused_bytes / 1e6},
                                                  {"unfused_ms", r.unfused_s * 1e3},
                                                  {"unfused_peak_mb", r.unfused_bytes / 1e6}};
    }
    j["results"]["causal"]["rope_ms"] = rope_s * 1e3;
    fmt::print("{}\n", j.dump());
    return 0;
  }

  // PyTorch, same shapes, thread count and repetitions, after ours (so the two never overlap)
  auto torch = bench::torch_reference(
      bench::torch_script_path(__FILE__, argv[0], script), "attention",
      {"--batch", std::to_string(B), "--heads", std::to_string(H), "--T", std::to_string(T), "--d",
       std::to_string(D), "--threads", std::to_string(num_threads()), "--reps", std::to_string(reps), "--warmup", "2",
       "--device", dev.str()},
      {"none", "causal"});
  if (torch)
    fmt::print("PyTorch {} ({} threads), attention as: {}\n", (*torch)["torch"].get<std::string>(),
               (*torch)["threads"].get<int>(), (*torch)["impl"].get<std::string>());
  fmt::print("\n{:<8} {:>10} {:>12} {:>8} {:>10} {:>12} {:>14} {:>11} {:>13} {:>13}\n", "mask", "fused ms",
             "unfused ms", "speedup", "torch ms", "torch/fused", "torch/unfused", "fused MB", "unfused MB",
             "torch RSS MB");
  for (bool causal : {false, true}) {
    const Row& r = rows[causal];
    fmt::print("{:<8} {:>10.2f} {:>12.2f} {:>8.2f}", causal ? "causal" : "none", r.fused_s * 1e3, r.unfused_s * 1e3,
               r.unfused_s / r.fused_s);
    if (torch) {
      const auto& t = torch->at("results").at(causal ? "causal" : "none");
      const double ms = t["ms"].get<double>();
      fmt::print(" {:>10.2f} {:>12.2f} {:>14.2f}", ms, ms / (r.fused_s * 1e3), ms / (r.unfused_s * 1e3));
      fmt::print(" {:>11.1f} {:>13.1f} {:>13.1f}\n", r.fused_bytes / 1e6, r.unfused_bytes / 1e6,
                 t["peak_rss_mb"].get<double>());
    } else {
      fmt::print(" {:>10} {:>12} {:>14} {:>11.1f} {:>13.1f} {:>13}\n", "-", "-", "-", r.fused_bytes / 1e6,
                 r.unfused_bytes / 1e6, "-");
    }
  }
  fmt::print("\ncausal, fused, with rope() on q and k first: {:.2f} ms, {:+.1f}% over fused (the most a RoPE\n"
             "fused into the kernel could save)\n",
             rope_s * 1e3, 100.0 * (rope_s / rows[1].fused_s - 1.0));
  fmt::print("\nspeedup = unfused / fused; torch/x = PyTorch ms / attograd ms (> 1: attograd is faster).\n");
  fmt::print("fused/unfused MB: peak bytes held beyond the inputs (alloc_stats). torch RSS MB: growth of the\n"
             "PyTorch process's max RSS over its warm-up and timed runs (CPU torch keeps no allocator stats).\n");
  fmt::print("\nTarget: fused >= 2x faster than unfused, peak extra memory O(B*H*T*d).\n");
  return 0;
}
