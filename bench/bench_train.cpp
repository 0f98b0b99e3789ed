// One optimizer step of each sample model (apps/common/models.h) beside its PyTorch twin
// (bench/torch_models.py, via bench/torch_reference.py train) in one run, same shapes, fp32,
// dropout 0, synthetic data from a fixed seed:
//   forward, cross-entropy loss, backward, clip_grad_norm 1.0, AdamW step (lr 1e-3, wd 0.05), zero_grad.
//
//   V  ViT 28x28x1, patch 4 (49 patches + class token = 50 tokens), d 64, 4 heads, 4 layers, MLP 256,
//      10 classes, batch 128
//   G  GPT vocab 96, T 128, d 128, 4 heads, 4 layers, MLP 512, batch 32 (loss over all B*T positions)
//   C  TextClassifier vocab 20000, T 256, d 128, 4 heads, 2 layers, MLP 512, 2 classes, batch 32,
//      lengths uniform in [T/4, T] (the same lengths are passed to PyTorch), key padding
//
// Per config: median ms per step of both, the ratio (PyTorch ms / attograd ms), our peak memory
// (alloc_stats: the peak of live tensor bytes during one step, in total and beyond what was live
// before it; and the growth of the process's max RSS), PyTorch's max RSS growth, and the achieved
// GFLOP/s of our step. Model FLOPs per step (matmuls only; embeddings, LayerNorm, GELU, softmax,
// the loss and AdamW are not counted):
//   forward = sum over Linear layers of 2 * M * K * N   (M rows, K inputs, N outputs)
//           + per block 2 * (2 * B * T * T * d)          (q k^T and p v over all heads: H * hs = d;
//                                                         full T x T, masked entries included)
//   step    = 3 * forward                                (backward = two matmuls per forward matmul)
//
//   bench_train [--configs V,G,C] [--reps 10] [--warmup 3] [--threads N] [--script PATH]
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <malloc.h>
#include <sys/resource.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/models.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "optim/adam.h"
#include "optim/clip.h"

using namespace ag;

namespace {

// ---- peak memory of the process ----------------------------------------------------------------

double max_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

// As reset_max_rss in bench/torch_reference.py: hand malloc's free memory back, then reset the
// max-RSS mark to the current RSS ("5" > /proc/self/clear_refs, Linux >= 4.0). False if it cannot.
bool reset_max_rss() {
  malloc_trim(0);
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f);
}

// ---- the configs ----------------------------------------------------------------------------

struct Config {
  char key;          // V, G, C
  const char* name;  // ViT, GPT, TextClassifier
  int64_t B, T, d, hidden, layers;
};

// Forward FLOPs of the transformer blocks: qkv, proj, fc1, fc2 and the two attention products.
double block_flops(const Config& c) {
  const double M = double(c.B) * double(c.T), d = double(c.d), h = double(c.hidden), T = double(c.T);
  const double linears = 2 * M * d * (3 * d) + 2 * M * d * d + 2 * M * d * h + 2 * M * h * d;
  const double attention = 2 * (2 * double(c.B) * T * T * d);
  return double(c.layers) * (linears + attention);
}

struct Result {
  double secs = 0, peak_bytes = 0, step_bytes = 0, rss_bytes = 0, flops = 0, loss = 0;
  bool rss_reset = false;
};

// Times `step` (one whole optimizer step; returns the loss) as bench::median_seconds does, then
// measures memory: the max-RSS mark is reset after the first warm-up step, as the PyTorch side does,
// so buffers a training loop keeps after step 1 (AdamW state) are baseline. Our caching allocator
// is emptied first (empty_cache), as malloc_trim empties PyTorch's heap: otherwise the blocks
// step 1 cached would already be resident and later steps would show no growth at all.
template <class F>
Result measure(F&& step, int reps, int warmup) {
  Result r;
  step();
  empty_cache();
  r.rss_reset = reset_max_rss();
  const double rss_base = max_rss_bytes();
  for (int i = 1; i < warmup; ++i) step();
  r.secs = bench::median_seconds(step, reps, 0);
  r.rss_bytes = max_rss_bytes() - rss_base;
  const uint64_t before = alloc_stats().bytes_in_use;
  reset_peak_bytes();
  r.loss = step();
  r.peak_bytes = double(alloc_stats().peak_bytes_in_use);
  r.step_bytes = double(alloc_stats().peak_bytes_in_use - before);
  return r;
}

// One step on `model` for the batch that `loss_of` turns into a scalar loss.
template <class M, class L>
Result run(M& model, L&& loss_of, int reps, int warmup) {
  const auto params = model.parameters();
  optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.05});
  auto step = [&] {
    Tensor loss = loss_of();
    loss.backward();
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    opt.zero_grad();
    return loss.item<double>();
  };
  return measure(step, reps, warmup);
}

// Uniform integers in [low, high) as an i64 tensor, from `rng` (std::mt19937_64: the same on every
// platform, unlike std::uniform_int_distribution, so we draw with a plain modulus).
Tensor random_ints(std::mt19937_64& rng, int64_t low, int64_t high, const Shape& shape, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = low + int64_t(rng() % uint64_t(high - low));
  return from_vector<int64_t>(v, shape);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd: one training step (fwd, loss, bwd, clip, AdamW) of each sample model, beside PyTorch"};
  std::string configs = "V,G,C", script;
  int reps = 10, warmup = 3, threads = 0;
  app.add_option("--configs", configs, "comma-separated subset of V (ViT), G (GPT), C (TextClassifier)");
  app.add_option("--reps", reps, "timed steps (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS, else the cores)")
      ->check(CLI::PositiveNumber);
  app.add_option("--script", script, "bench/torch_reference.py (default: found next to this source)");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) set_num_threads(threads);

  const std::vector<Config> all = {{'V', "ViT", 128, 50, 64, 256, 4},
                                   {'G', "GPT", 32, 128, 128, 512, 4},
                                   {'C', "TextClassifier", 32, 256, 128, 512, 2}};
  std::vector<Config> chosen;
  {
    std::stringstream ss(configs);
    std::string item;
    while (std::getline(ss, item, ',')) {
      bool found = false;
      for (const auto& c : all)
        if (item.size() == 1 && (item[0] == c.key || item[0] == c.key + ('a' - 'A'))) {
          bool dup = false;
          for (const auto& k : chosen) dup = dup || k.key == c.key;
          if (!dup) chosen.push_back(c);
          found = true;
        }
      if (!found) {
        fmt::print(stderr, "bench_train: --configs: unknown config '{}' (expected V, G or C)\n", item);
        return 1;
      }
    }
  }

  fmt::print("attograd bench_train: one step = forward, cross-entropy, backward, clip_grad_norm 1.0, AdamW "
             "(lr 1e-3, wd 0.05), zero_grad; f32, dropout 0, {} threads, OMP_WAIT_POLICY {}, OpenBLAS core {}\n",
             num_threads(), bench::omp_wait_policy(), openblas_get_corename());

  std::vector<Result> results;
  std::vector<int64_t> clf_lengths;  // C's lengths, passed on to PyTorch
  for (const auto& c : chosen) {
    Generator gen(0);
    std::mt19937_64 rng(1234);
    Result r;
    if (c.key == 'V') {
      apps::ViTConfig cfg;
      cfg.patch = 4;  // image 28, channels 1, classes 10, d 64, 4 heads, 4 layers, MLP 256 are the defaults
      cfg.dropout = 0.0;
      apps::ViT model(cfg, &gen);
      Tensor images = randn({c.B, 1, 28, 28}, DType::f32, &gen);
      Tensor labels = random_ints(rng, 0, 10, {c.B}, c.B);
      r = run(model, [&] { return cross_entropy(model.forward(images), labels); }, reps, warmup);
      const double P = 49, K = 16;  // patches; pixels per patch
      r.flops = 3 * (block_flops(c) + 2 * double(c.B) * P * K * double(c.d) + 2 * double(c.B) * double(c.d) * 10);
    } else if (c.key == 'G') {
      apps::GPTConfig cfg;  // vocab 96, context 128, d 128, 4 heads, 4 layers, MLP 512
      cfg.dropout = 0.0;
      apps::GPT model(cfg, &gen);
      Tensor idx = random_ints(rng, 0, 96, {c.B, c.T}, c.B * c.T);
      Tensor targets = random_ints(rng, 0, 96, {c.B * c.T}, c.B * c.T);
      r = run(
          model, [&] { return cross_entropy(model.forward(idx).reshape({c.B * c.T, 96}), targets); }, reps, warmup);
      r.flops = 3 * (block_flops(c) + 2 * double(c.B * c.T) * double(c.d) * 96);
    } else {
      apps::TextClassifierConfig cfg;  // vocab 20000, max_len 256, 2 classes, d 128, 4 heads, 2 layers, MLP 512
      cfg.dropout = 0.0;
      apps::TextClassifier model(cfg, &gen);
      clf_lengths.assign(size_t(c.B), 0);
      std::vector<int64_t> tok(size_t(c.B * c.T), 0);  // 0 = padding after each length
      for (int64_t b = 0; b < c.B; ++b) {
        const int64_t lo = c.T / 4;
        clf_lengths[size_t(b)] = lo + int64_t(rng() % uint64_t(c.T - lo + 1));
        for (int64_t t = 0; t < clf_lengths[size_t(b)]; ++t) tok[size_t(b * c.T + t)] = 1 + int64_t(rng() % 19999);
      }
      Tensor tokens = from_vector<int64_t>(tok, {c.B, c.T});
      Tensor lengths = from_vector<int64_t>(clf_lengths, {c.B});
      Tensor labels = random_ints(rng, 0, 2, {c.B}, c.B);
      r = run(model, [&] { return cross_entropy(model.forward(tokens, lengths), labels); }, reps, warmup);
      r.flops = 3 * (block_flops(c) + 2 * double(c.B) * double(c.d) * 2);
    }
    results.push_back(r);
  }

  // PyTorch, same shapes, thread count and repetitions, after ours (so the two never overlap)
  std::string keys;
  std::vector<std::string> variants;
  for (const auto& c : chosen) {
    keys += std::string(keys.empty() ? "" : ",") + c.key;
    variants.push_back(std::string(1, c.key));
  }
  std::vector<std::string> args = {"--configs", keys,  "--threads", std::to_string(num_threads()), "--reps",
                                    std::to_string(reps), "--warmup", std::to_string(warmup)};
  if (!clf_lengths.empty()) {
    std::string l;
    for (int64_t x : clf_lengths) l += (l.empty() ? "" : ",") + std::to_string(x);
    args.insert(args.end(), {"--lengths", l});
  }
  auto torch = bench::torch_reference(bench::torch_script_path(__FILE__, argv[0], script), "train", args, variants);
  if (torch)
    fmt::print("PyTorch {} ({} threads), {}\n", (*torch)["torch"].get<std::string>(), (*torch)["threads"].get<int>(),
               (*torch)["impl"].get<std::string>());

  fmt::print("\n{:<16} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>9}\n", "config", "ag ms", "torch ms",
             "torch/ag", "ag GF/s", "GF/step", "ag peak", "ag step", "ag RSS+", "torch RSS+", "ag loss");
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Result& r = results[i];
    const double ms = r.secs * 1e3;
    fmt::print("{:<16} {:>8.2f}", fmt::format("{} {}", chosen[i].key, chosen[i].name), ms);
    if (torch) {
      const auto& t = torch->at("results").at(variants[i]);
      const double tms = t["ms"].get<double>();
      fmt::print(" {:>9.2f} {:>9.2f}", tms, tms / ms);
    } else {
      fmt::print(" {:>9} {:>9}", "-", "-");
    }
    fmt::print(" {:>8.1f} {:>8.2f} {:>9.1f} {:>9.1f} {:>10.1f}", r.flops / r.secs / 1e9, r.flops / 1e9,
               r.peak_bytes / 1e6, r.step_bytes / 1e6, r.rss_bytes / 1e6);
    if (torch)
      fmt::print(" {:>9.1f}", torch->at("results").at(variants[i])["peak_rss_mb"].get<double>());
    else
      fmt::print(" {:>9}", "-");
    fmt::print(" {:>9.4f}{}\n", r.loss, r.rss_reset ? "" : "  (RSS mark not reset)");
  }
  fmt::print("\ntorch/ag = PyTorch ms / attograd ms per step (> 1: attograd is faster). ag GF/s = model FLOPs per\n"
             "step / our median step time; GF/step = 3 x forward matmul FLOPs (2*M*K*N per Linear, 2*B*T*T*d\n"
             "for each of q k^T and p v per block). MB columns: ag peak = live tensor bytes at the peak of one\n"
             "step (alloc_stats, parameters, gradients and AdamW state included); ag step = that peak beyond\n"
             "what was live before the step; ag RSS+ / torch RSS+ = growth of each process's max RSS over the\n"
             "warm-up and timed steps after the first (the mark reset after step 1). ag loss: the loss of\n"
             "the last step, for orientation only.\n");
  return 0;
}
