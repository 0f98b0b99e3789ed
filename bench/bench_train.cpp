// One optimizer step of each sample model (apps/<app>/model.h) beside its PyTorch twin
// (bench/torch_models.py, via bench/torch_reference.py train) in one run, same shapes, fp32,
// dropout 0, synthetic data from a fixed seed:
//   forward, cross-entropy loss, backward, clip_grad_norm 1.0, AdamW step (lr 1e-3, wd 0.05), zero_grad.
//
//   V  ViT 28x28x1, patch 4 (49 patches + class token = 50 tokens), d 64, 4 heads, 4 layers, MLP 256,
//      10 classes, batch 128
//   G  GPT vocab 96, T 128, d 128, 4 heads, 4 layers, MLP 512, batch 32 (loss over all B*T positions)
//   C  TextClassifier vocab 20000, T 256, d 128, 4 heads, 2 layers, MLP 512, 2 classes, batch 32,
//      lengths uniform in [T/4, T] (the same lengths are passed to PyTorch), key padding
//   L  GPT-2 small's shape (only when asked for: a GPU config): vocab 50304, T 1024, d 768,
//      12 heads, 12 layers, MLP 3072, batch 8
//
// --device cuda runs both sides on the GPU (the model, the data and the optimizer state there; a
// step ends when its loss has been copied back to the host, which waits for the GPU).
//
// Per config: median ms per step of both, the ratio (PyTorch ms / attograd ms), our peak memory
// (alloc_stats: the peak of live tensor bytes during one step, in total and beyond what was live
// before it; and the growth of the process's max RSS), PyTorch's max RSS growth, and the achieved
// GFLOP/s of our step. Model FLOPs per step count the matmuls only (embeddings, LayerNorm, GELU,
// softmax, the loss and AdamW are not counted): the GEMMs of one step, listed by step_gemms():
//   per Linear (M rows, K inputs, N outputs)  y = x W^T, dX = dY W, dW = dY^T X    3 x 2*M*K*N
//   per block's attention (B*H heads, hs = d/H) S = Q K^T, O = P V, and in backward dP = dO V^T,
//                                                dV = P^T dO, dQ = dS K, dK = dS^T Q   6 x 2*T*T*hs per head
//                                                (full T x T, masked entries included)
//
// --paired (with --precision bf16) times, after the bf16 steps, pairs of one fp32 and one bf16 step
// of the same model back to back, and reports the median of the pairs' bf16 / fp32 ratios: the
// speed-up of bf16 measured where a drifting machine slows both sides of a pair alike.
//
// --roofline adds the GEMM-bound limit of each step: every GEMM of that list timed alone at its
// shape and transposes, at the same thread count, through ag::matmul and through OpenBLAS with its
// own threads (the faster of the two per GEMM), summed. "GEMM-bound %" = that sum / our step time:
// the share of the step a machine doing nothing but those matmuls at the measured sgemm speed
// would need. --json prints one JSON line of our side only (for bench/compare_pytorch).
//
// --deterministic sets ag::set_deterministic(true) (core/parallel.h), to measure what it costs.
// --profile N runs N more steps per config under ag::KernelProfiler (core/profile.h) and prints the
// kernels that take a step's time, beside PyTorch's CUDA kernels from torch.profiler over N steps
// (on the CPU: its ops); busy = kernel time / wall time tells a launch-bound step (low) from a
// kernel-bound one.
// --precision bf16 runs forward under ag::AutocastGuard (autograd/autocast.h: matmul, linear and
// attention on bf16 operands, f32 sums, f32 weights and AdamW) and PyTorch's forward under
// torch.autocast(dtype=torch.bfloat16); on a GPU the GEMMs then run on tensor cores on both sides.
// --bf16-gemm native|emulated picks how the CPU computes those products (ag::cpu::set_sbgemm_native).
//
//   bench_train [--configs V,G,C,L] [--device cpu|cuda] [--precision fp32|bf16] [--reps 10]
//               [--warmup 3] [--threads N] [--script PATH] [--roofline] [--json] [--deterministic]
//               [--profile N] [--profile-top 15] [--bf16-gemm native|emulated]
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <malloc.h>
#include <sys/resource.h>

#include <array>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "apps/common/run.h"
#include "apps/gpt/model.h"
#include "apps/textclf/model.h"
#include "apps/vit/model.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "core/kernels.h"
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
  char key;          // V, G, C, L
  const char* name;  // ViT, GPT, TextClassifier
  int64_t B, T, d, hidden, layers, heads;
};

// One GEMM of a training step: batch x ([M,K] @ [K,N]), operands read transposed by the flags (as
// ag::matmul gets them: a Linear's weight is stored (out, in), so y = x W^T has trans_b).
struct GemmShape {
  int64_t batch, M, K, N;
  bool ta, tb;
  double flops() const { return 2.0 * double(batch) * double(M) * double(K) * double(N); }
};

// The three GEMMs of a Linear (in -> out) over M rows: forward, dX, dW.
void add_linear(std::vector<GemmShape>& g, int64_t M, int64_t in, int64_t out) {
  g.push_back({1, M, in, out, false, true});   // y  = x W^T    [M,in] @ [in,out]
  g.push_back({1, M, out, in, false, false});  // dX = dY W     [M,out] @ [out,in]
  g.push_back({1, out, M, in, true, false});   // dW = dY^T X   [out,M] @ [M,in]
}

// Every GEMM of one training step of the transformer blocks plus the model's own Linears.
std::vector<GemmShape> step_gemms(const Config& c, const std::vector<std::array<int64_t, 3>>& extra_linears) {
  std::vector<GemmShape> g;
  const int64_t M = c.B * c.T, heads = c.heads, hs = c.d / heads, BH = c.B * heads, T = c.T;
  for (int64_t l = 0; l < c.layers; ++l) {
    add_linear(g, M, c.d, 3 * c.d);  // qkv
    add_linear(g, M, c.d, c.d);      // proj
    add_linear(g, M, c.d, c.hidden);  // fc1
    add_linear(g, M, c.hidden, c.d);  // fc2
    g.push_back({BH, T, hs, T, false, true});   // S  = Q K^T
    g.push_back({BH, T, T, hs, false, false});  // O  = P V
    g.push_back({BH, T, hs, T, false, true});   // dP = dO V^T
    g.push_back({BH, T, T, hs, true, false});   // dV = P^T dO
    g.push_back({BH, T, T, hs, false, false});  // dQ = dS K
    g.push_back({BH, T, T, hs, true, false});   // dK = dS^T Q
  }
  for (const auto& [m, in, out] : extra_linears) add_linear(g, m, in, out);
  return g;
}

double total_flops(const std::vector<GemmShape>& g) {
  double f = 0;
  for (const auto& s : g) f += s.flops();
  return f;
}

// The GEMM-bound time of a step: each distinct GEMM timed alone (median of `reps`), through
// ag::matmul and through OpenBLAS with its own threads, the faster one counted, times how often it
// occurs. Returns seconds.
double gemm_bound_seconds(const std::vector<GemmShape>& gemms, int reps) {
  NoGradGuard no_grad;
  Generator gen(7);
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool>, std::pair<int, double>> seen;
  for (const auto& s : gemms) {
    auto key = std::make_tuple(s.batch, s.M, s.K, s.N, s.ta, s.tb);
    auto it = seen.find(key);
    if (it != seen.end()) {
      ++it->second.first;
      continue;
    }
    // a stored (M,K) or, transposed, (K,M); b stored (K,N) or (N,K)
    Tensor a = randn(s.ta ? Shape{s.batch, s.K, s.M} : Shape{s.batch, s.M, s.K}, DType::f32, &gen);
    Tensor b = randn(s.tb ? Shape{s.batch, s.N, s.K} : Shape{s.batch, s.K, s.N}, DType::f32, &gen);
    const Tensor av = s.ta ? a.mT() : a, bv = s.tb ? b.mT() : b;
    const double ours = bench::median_seconds([&] { matmul(av, bv); }, reps, 2);
    std::vector<float> c(size_t(s.batch * s.M * s.N));
    const float *pa = a.data<float>(), *pb = b.data<float>();
    openblas_set_num_threads(num_threads());
    const double blas = bench::median_seconds(
        [&] {
          for (int64_t p = 0; p < s.batch; ++p)
            cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                        blasint(s.M), blasint(s.N), blasint(s.K), 1.f, pa + p * s.M * s.K,
                        blasint(s.ta ? s.M : s.K), pb + p * s.K * s.N, blasint(s.tb ? s.K : s.N), 0.f,
                        c.data() + p * s.M * s.N, blasint(s.N));
        },
        reps, 2);
    openblas_set_num_threads(1);  // back to attograd's setting (core/parallel.cpp)
    seen[key] = {1, std::min(ours, blas)};
  }
  double total = 0;
  for (const auto& [key, v] : seen) total += v.first * v.second;
  return total;
}

// The machine's sgemm peak as these benchmarks see it: one 1024^3 product, the faster of ag::matmul
// and OpenBLAS with its own threads, in GFLOP/s.
double sgemm_peak_gflops(int reps) {
  const GemmShape big{1, 1024, 1024, 1024, false, false};
  return big.flops() / gemm_bound_seconds({big}, reps) / 1e9;
}

struct Result {
  double secs = 0, peak_bytes = 0, step_bytes = 0, rss_bytes = 0, flops = 0, loss = 0, gemm_secs = 0;
  bool rss_reset = false;
  KernelReport profile;  // --profile: the kernel times of that many further steps (summed)
  int profile_steps = 0;
  // --paired: an fp32 step and a bf16 step of the same model, timed one after the other `pairs`
  // times (the order alternating): both medians and the median of each pair's bf16 / fp32 ratio
  int pairs = 0;
  double pair_fp32_secs = 0, pair_bf16_secs = 0, pair_ratio = 0;
};

// The timed pairs of --paired: one step under each precision (step(Precision) returns the loss),
// the first of a pair fp32 in even pairs and bf16 in odd ones. A pair's two steps run seconds
// apart at most, so a machine whose speed drifts over a run changes both alike: their ratio is
// steadier than the ratio of two medians taken in turn.
template <class F>
void measure_pairs(Result& r, F&& step, int pairs) {
  auto seconds = [&](Precision p) { return bench::seconds_of([&] { step(p); }); };
  step(Precision::fp32);  // the fp32 side's first step (the timed bf16 ones ran before)
  std::vector<double> f32, b16, ratio;
  for (int i = 0; i < pairs; ++i) {
    double tf = 0, tb = 0;
    if (i % 2 == 0) tf = seconds(Precision::fp32), tb = seconds(Precision::bf16);
    else tb = seconds(Precision::bf16), tf = seconds(Precision::fp32);
    f32.push_back(tf), b16.push_back(tb), ratio.push_back(tb / tf);
  }
  r.pairs = pairs;
  r.pair_fp32_secs = bench::median(f32), r.pair_bf16_secs = bench::median(b16), r.pair_ratio = bench::median(ratio);
}

// Times `step` (one whole optimizer step; returns the loss) as bench::median_seconds does, then
// measures memory: the max-RSS mark is reset after the first warm-up step, as the PyTorch side does,
// so buffers a training loop keeps after step 1 (AdamW state) are baseline. Our caching allocator
// is emptied first (empty_cache), as malloc_trim empties PyTorch's heap: otherwise the blocks
// step 1 cached would already be resident and later steps would show no growth at all.
// On a GPU the tensor bytes are those of the device's allocator.
// With profile_steps > 0, that many more steps then run under ag::KernelProfiler (core/profile.h):
// apart from the timed ones, whose times its events would disturb.
template <class F>
Result measure(F&& step, int reps, int warmup, Device dev, int profile_steps) {
  Result r;
  step();
  empty_cache(dev);
  r.rss_reset = reset_max_rss();
  const double rss_base = max_rss_bytes();
  for (int i = 1; i < warmup; ++i) step();
  r.secs = bench::median_seconds(step, reps, 0);
  r.rss_bytes = max_rss_bytes() - rss_base;
  const uint64_t before = alloc_stats(dev).bytes_in_use;
  reset_peak_bytes(dev);
  r.loss = step();
  r.peak_bytes = double(alloc_stats(dev).peak_bytes_in_use);
  r.step_bytes = double(alloc_stats(dev).peak_bytes_in_use - before);
  if (profile_steps > 0) {
    KernelProfiler prof;
    for (int i = 0; i < profile_steps; ++i) step();
    r.profile = prof.report();
    r.profile_steps = profile_steps;
  }
  return r;
}

// One step on `model` (moved to `dev` first) for the batch that `loss_of` turns into a scalar loss;
// loss.item() copies the loss to the host, so on a GPU a step is timed to its end.
// With `precision` bf16 the forward runs under autocast (backward keeps what each op recorded).
// With `paired` (and precision bf16), the timed pairs of measure_pairs follow, `reps` of them.
template <class M, class L>
Result run(M& model, L&& loss_of, int reps, int warmup, Device dev, Precision precision, int profile_steps,
           bool paired) {
  model.to(dev);
  const auto params = model.parameters();
  optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.05});
  auto step_as = [&](Precision p) {
    Tensor loss;
    {
      AutocastGuard autocast(p);
      loss = loss_of();
    }
    loss.backward();
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    opt.zero_grad();
    return loss.item<double>();
  };
  Result r = measure([&] { return step_as(precision); }, reps, warmup, dev, profile_steps);
  if (paired) measure_pairs(r, step_as, reps);
  return r;
}

// The kernel profile of one config, per step: ours, and PyTorch's when `torch` holds one (the
// torch.profiler summary of bench/torch_reference.py train --profile).
void print_profile(const Config& c, const Result& r, const nlohmann::json* torch, int top) {
  const double n = r.profile_steps;
  const Device::Type kind = r.profile.kernels.empty() ? Device::CPU : r.profile.kernels.front().device.type;
  const double busy = r.profile.kernel_ms(kind) / n, wall = r.profile.wall_ms / n;
  fmt::print("\nKernel profile of {} {} ({} steps, per step; the wall time includes the profiler's own cost):\n",
             c.key, c.name, r.profile_steps);
  fmt::print("  attograd: {:.2f} ms wall, {:.2f} ms in kernels ({:.0f}% busy), {:.0f} kernel calls\n", wall, busy,
             100 * busy / wall, double(r.profile.calls) / n);
  if (torch)
    fmt::print("  PyTorch:  {:.2f} ms wall, {:.2f} ms in kernels ({:.0f}% busy), {:.0f} kernel launches\n",
               (*torch)["wall_ms"].get<double>(), (*torch)["kernel_ms"].get<double>(),
               100 * (*torch)["kernel_ms"].get<double>() / (*torch)["wall_ms"].get<double>(),
               (*torch)["launches"].get<double>());
  fmt::print("  {:<34} {:>7} {:>9} {:>6}", "attograd kernel", "calls", "ms", "%");
  if (torch) fmt::print("   {:<50} {:>7} {:>9} {:>6}", "PyTorch kernel", "calls", "ms", "%");
  fmt::print("\n");
  const size_t ours = std::min(size_t(top), r.profile.kernels.size());
  const size_t theirs = torch ? std::min(size_t(top), (*torch)["kernels"].size()) : 0;
  for (size_t i = 0; i < std::max(ours, theirs); ++i) {
    if (i < ours) {
      const KernelTime& k = r.profile.kernels[i];
      fmt::print("  {:<34} {:>7.1f} {:>9.3f} {:>5.1f}%", k.name.substr(0, 34), double(k.calls) / n, k.ms / n,
                 100 * k.ms / n / wall);
    } else {
      fmt::print("  {:<34} {:>7} {:>9} {:>6}", "", "", "", "");
    }
    if (i < theirs) {
      const auto& k = (*torch)["kernels"][i];
      fmt::print("   {:<50} {:>7.1f} {:>9.3f} {:>5.1f}%", k["name"].get<std::string>().substr(0, 50),
                 k["calls"].get<double>(), k["ms"].get<double>(),
                 100 * k["ms"].get<double>() / (*torch)["wall_ms"].get<double>());
    }
    fmt::print("\n");
  }
}

nlohmann::json profile_json(const Result& r) {
  const double n = r.profile_steps;
  nlohmann::json j = {{"steps", r.profile_steps},
                      {"wall_ms", r.profile.wall_ms / n},
                      {"calls", double(r.profile.calls) / n}};
  double busy = 0;
  for (const KernelTime& k : r.profile.kernels) {
    j["kernels"].push_back({{"name", k.name}, {"device", k.device.str()}, {"calls", double(k.calls) / n},
                            {"ms", k.ms / n}});
    busy += k.ms / n;
  }
  j["kernel_ms"] = busy;
  return j;
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
  std::string configs = "V,G,C", script, device_name = "cpu", precision_name = "fp32";
  std::string bf16_gemm;
  int reps = 10, warmup = 3, threads = 0, profile = 0, profile_top = 15;
  bool roofline = false, json = false, deterministic = false, paired = false;
  app.add_option("--configs", configs,
                 "comma-separated subset of V (ViT), G (GPT), C (TextClassifier), L (GPT d 768, 12 layers, T 1024)")
      ->capture_default_str();
  app.add_option("--device", device_name, "cpu or cuda (cuda:N): where both sides run")->capture_default_str();
  app.add_option("--precision", precision_name,
                 "fp32, or bf16: forward under autocast on both sides (bf16 matmul operands, f32 sums)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--bf16-gemm", bf16_gemm,
                 "with --precision bf16 on the CPU: native (AVX512-BF16 products, ag::cpu::sbgemm) or emulated "
                 "(rounded copies, f32 GEMM); default: the library's choice")
      ->check(CLI::IsMember({"native", "emulated"}));
  app.add_option("--reps", reps, "timed steps (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS, else the cores)")
      ->check(CLI::PositiveNumber);
  app.add_option("--script", script, "bench/torch_reference.py (default: found next to this source)");
  app.add_flag("--roofline", roofline, "also time every GEMM of each step alone: the GEMM-bound limit");
  app.add_flag("--json", json, "print one JSON line of attograd's results only (no PyTorch run, no table)");
  app.add_option("--profile", profile,
                 "after the timed steps, run this many more under the kernel profiler (ag::KernelProfiler) and "
                 "print where a step's time goes, kernel by kernel (beside torch.profiler's kernels)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--profile-top", profile_top, "kernels listed per config with --profile")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--deterministic", deterministic, "ag::set_deterministic(true): the same bits at any thread count");
  app.add_flag("--paired", paired,
               "with --precision bf16: after the timed steps, --reps pairs of one fp32 and one bf16 step of the same "
               "model, back to back (order alternating); reports both medians and the median of the pairs' bf16 / "
               "fp32 ratios, which a machine whose speed drifts disturbs less than two separate runs");
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_train"); rc >= 0) return rc;
  if (threads > 0) set_num_threads(threads);
  if (deterministic) set_deterministic(true);
  if (!bf16_gemm.empty()) {
    if (bf16_gemm == "native" && !cpu::sbgemm_supported()) {
      fmt::print(stderr, "bench_train: --bf16-gemm native: this CPU has no AVX512-BF16 (avx512_bf16)\n");
      return 2;
    }
    cpu::set_sbgemm_native(bf16_gemm == "native");
  }
  const std::optional<Device> parsed = bench::parse_device("bench_train", device_name);
  if (!parsed) return 2;
  const Device dev = *parsed;
  const Precision precision = *parse_precision(precision_name);  // fp32 or bf16: CLI::IsMember above
  if (paired && precision != Precision::bf16) {
    fmt::print(stderr, "bench_train: --paired pairs bf16 steps with fp32 ones; it needs --precision bf16\n");
    return 2;
  }
  if (roofline && dev.is_cuda()) {
    fmt::print(stderr, "bench_train: --roofline times the CPU's GEMMs; it does not go with --device {}\n", dev);
    return 2;
  }

  const std::vector<Config> all = {{'V', "ViT", 128, 50, 64, 256, 4, 4},
                                   {'G', "GPT", 32, 128, 128, 512, 4, 4},
                                   {'C', "TextClassifier", 32, 256, 128, 512, 2, 4},
                                   {'L', "GPT", 8, 1024, 768, 3072, 12, 12}};
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
        fmt::print(stderr, "bench_train: --configs: unknown config '{}' (expected V, G, C or L)\n", item);
        return 2;
      }
    }
  }

  if (!json)
    fmt::print("attograd bench_train: one step = forward, cross-entropy, backward, clip_grad_norm 1.0, AdamW "
             "(lr 1e-3, wd 0.05), zero_grad; {}{}, dropout 0, on {}, {} threads, OMP_WAIT_POLICY {}, sgemm kernel {} "
               "(OpenBLAS core {}), deterministic {}\n",
               precision == Precision::bf16 ? "bf16 autocast" : "f32",
               precision != Precision::bf16 || dev.is_cuda() ? ""
               : cpu::sbgemm_native()                        ? " (native bf16 products)"
                                                             : " (emulated bf16 products)",
               dev, num_threads(), bench::omp_wait_policy(),
               cpu::sgemm_kernel_name(), openblas_get_corename(), is_deterministic() ? "on" : "off");

  std::vector<Result> results;
  std::vector<int64_t> clf_lengths;  // C's lengths, passed on to PyTorch
  for (const auto& c : chosen) {
    Generator gen(0);
    std::mt19937_64 rng(1234);
    Result r;
    std::vector<GemmShape> gemms;
    if (c.key == 'V') {
      apps::ViTConfig cfg;
      cfg.patch = 4;  // image 28, channels 1, classes 10, d 64, 4 heads, 4 layers, MLP 256 are the defaults
      cfg.dropout = 0.0;
      apps::ViT model(cfg, &gen);
      Tensor images = randn({c.B, 1, 28, 28}, DType::f32, &gen).to(dev);
      Tensor labels = random_ints(rng, 0, 10, {c.B}, c.B).to(dev);
      r = run(model, [&] { return cross_entropy(model.forward(images), labels); }, reps, warmup, dev, precision, profile,
              paired);
      const int64_t P = 49, K = 16;  // patches; pixels per patch
      gemms = step_gemms(c, {{{c.B * P, K, c.d}}, {{c.B, c.d, 10}}});  // patch projection, head
    } else if (c.key == 'G' || c.key == 'L') {
      apps::GPTConfig cfg;  // G: vocab 96, context 128, d 128, 4 heads, 4 layers, MLP 512 (the defaults)
      if (c.key == 'L') {
        cfg.vocab = 50304;
        cfg.context = c.T, cfg.d_model = c.d, cfg.n_heads = c.heads, cfg.n_layers = c.layers;
        cfg.mlp_hidden = c.hidden;
      }
      cfg.dropout = 0.0;
      const int64_t V = cfg.vocab;
      apps::GPT model(cfg, &gen);
      Tensor idx = random_ints(rng, 0, V, {c.B, c.T}, c.B * c.T).to(dev);
      Tensor targets = random_ints(rng, 0, V, {c.B * c.T}, c.B * c.T).to(dev);
      r = run(
          model, [&] { return cross_entropy(model.forward(idx).reshape({c.B * c.T, V}), targets); }, reps, warmup,
          dev, precision, profile, paired);
      gemms = step_gemms(c, {{{c.B * c.T, c.d, V}}});  // head
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
      Tensor tokens = from_vector<int64_t>(tok, {c.B, c.T}).to(dev);
      Tensor lengths = from_vector<int64_t>(clf_lengths, {c.B}).to(dev);
      Tensor labels = random_ints(rng, 0, 2, {c.B}, c.B).to(dev);
      r = run(model, [&] { return cross_entropy(model.forward(tokens, lengths), labels); }, reps, warmup, dev,
              precision, profile, paired);
      gemms = step_gemms(c, {{{c.B, c.d, 2}}});  // head on the pooled tokens
    }
    r.flops = total_flops(gemms);
    if (roofline) r.gemm_secs = gemm_bound_seconds(gemms, std::max(reps, 5));
    results.push_back(r);
  }

  if (json) {
    nlohmann::json j;
    j["device"] = dev.str();
    j["precision"] = precision_name;
    if (precision == Precision::bf16 && !dev.is_cuda()) j["bf16_gemm"] = cpu::sbgemm_native() ? "native" : "emulated";
    j["threads"] = num_threads();
    j["deterministic"] = is_deterministic();
    j["openblas_core"] = openblas_get_corename();
    j["gemm_kernel"] = cpu::sgemm_kernel_name();
    j["max_rss_mb"] = max_rss_bytes() / 1e6;
    if (roofline) j["sgemm_peak_gflops"] = sgemm_peak_gflops(std::max(reps, 5));
    for (size_t i = 0; i < chosen.size(); ++i) {
      const Result& r = results[i];
      j["results"][std::string(1, chosen[i].key)] = {
          {"config", chosen[i].name},  {"ms", r.secs * 1e3},          {"gflop_per_step", r.flops / 1e9},
          {"gflops", r.flops / r.secs / 1e9}, {"peak_mb", r.peak_bytes / 1e6}, {"step_mb", r.step_bytes / 1e6},
          {"rss_growth_mb", r.rss_bytes / 1e6}, {"loss", r.loss}, {"gemm_bound_ms", r.gemm_secs * 1e3}};
      if (r.profile_steps > 0) j["results"][std::string(1, chosen[i].key)]["profile"] = profile_json(r);
      if (r.pairs > 0)
        j["results"][std::string(1, chosen[i].key)]["paired"] = {{"pairs", r.pairs},
                                                                 {"fp32_ms", r.pair_fp32_secs * 1e3},
                                                                 {"bf16_ms", r.pair_bf16_secs * 1e3},
                                                                 {"bf16_over_fp32", r.pair_ratio}};
    }
    if (!clf_lengths.empty()) j["results"]["C"]["lengths"] = clf_lengths;
    fmt::print("{}\n", j.dump());
    return 0;
  }

  // PyTorch, same shapes, thread count and repetitions, after ours (so the two never overlap)
  std::string keys;
  std::vector<std::string> variants;
  for (const auto& c : chosen) {
    keys += std::string(keys.empty() ? "" : ",") + c.key;
    variants.push_back(std::string(1, c.key));
  }
  std::vector<std::string> args = {"--configs", keys,  "--threads", std::to_string(num_threads()), "--reps",
                                    std::to_string(reps), "--warmup", std::to_string(warmup), "--device", dev.str(),
                                    "--precision", precision_name};
  if (!clf_lengths.empty()) {
    std::string l;
    for (int64_t x : clf_lengths) l += (l.empty() ? "" : ",") + std::to_string(x);
    args.insert(args.end(), {"--lengths", l});
  }
  if (profile > 0) args.insert(args.end(), {"--profile", std::to_string(profile)});
  auto torch = bench::torch_reference(bench::torch_script_path(__FILE__, argv[0], script), "train", args, variants);
  if (torch)
    fmt::print("PyTorch {} ({} threads), {}\n", (*torch)["torch"].get<std::string>(), (*torch)["threads"].get<int>(),
               (*torch)["impl"].get<std::string>());

  fmt::print("\n{:<16} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>9}", "config", "ag ms", "torch ms",
             "torch/ag", "ag GF/s", "GF/step", "ag peak", "ag step", "ag RSS+", "torch RSS+", "ag loss");
  if (roofline) fmt::print(" {:>9} {:>7}", "GEMM ms", "bound");
  fmt::print("\n");
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
    fmt::print(" {:>9.4f}", r.loss);
    if (roofline) fmt::print(" {:>9.2f} {:>6.1f}%", r.gemm_secs * 1e3, 100 * r.gemm_secs / r.secs);
    fmt::print("{}\n", r.rss_reset ? "" : "  (RSS mark not reset)");
  }
  fmt::print("\ntorch/ag = PyTorch ms / attograd ms per step (> 1: attograd is faster). ag GF/s = model FLOPs per\n"
             "step / our median step time; GF/step = 3 x forward matmul FLOPs (2*M*K*N per Linear, 2*B*T*T*d\n"
             "for each of q k^T and p v per block). MB columns: ag peak = live tensor bytes at the peak of one\n"
             "step (alloc_stats, parameters, gradients and AdamW state included); ag step = that peak beyond\n"
             "what was live before the step; ag RSS+ / torch RSS+ = growth of each process's max RSS over the\n"
             "warm-up and timed steps after the first (the mark reset after step 1). ag loss: the loss of\n"
             "the last step, for orientation only.\n");
  for (size_t i = 0; i < chosen.size() && paired; ++i) {
    const Result& r = results[i];
    fmt::print("{} {}: paired (bf16 and fp32 steps back to back, {} pairs): fp32 {:.2f} ms, bf16 {:.2f} ms, "
               "bf16 / fp32 {:.3f} (median of the pairs' ratios)\n",
               chosen[i].key, chosen[i].name, r.pairs, r.pair_fp32_secs * 1e3, r.pair_bf16_secs * 1e3, r.pair_ratio);
  }
  for (size_t i = 0; i < chosen.size() && profile > 0; ++i) {
    const nlohmann::json* t = nullptr;
    if (torch && torch->at("results").at(variants[i]).contains("profile"))
      t = &torch->at("results").at(variants[i]).at("profile");
    print_profile(chosen[i], results[i], t, profile_top);
  }
  if (profile > 0)
    fmt::print("\nKernel profile: ag::KernelProfiler (core/profile.h) times each kernel call through KERNEL(): on a\n"
               "GPU by CUDA events around it (cuBLAS inside matmul included), on the CPU by the clock; PyTorch's\n"
               "side is torch.profiler's CUDA kernels (CPU ops on the CPU). busy = kernel time / wall time.\n");
  if (roofline)
    fmt::print("GEMM ms: the step's GEMMs timed alone (the faster of ag::matmul and OpenBLAS's own threads per\n"
               "GEMM), summed: the GEMM-bound limit; bound = that / our step time (target >= 50%).\n");
  return 0;
}
