// The apps' model report, MFU and attention diagnostics (see diagnose.h).
#include "apps/common/diagnose.h"

#include <omp.h>
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "apps/common/threads.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "dist/dist.h"

namespace ag::apps {

void add_diagnose_options(CLI::App& cli, DiagnoseOptions& d) {
  cli.add_flag("--diagnose-attention", d.attention,
               "after training (or with --eval-only): per layer and head, the entropy, diagonal mass and head "
               "similarity of the attention on one batch, with warnings; also <run dir>/attention_diagnostics.json");
  cli.add_flag("--model-report", d.model_report,
               "print the per-layer table of parameters, activation memory and forward FLOPs at start");
  cli.add_option("--peak-gflops", d.peak_gflops, "the peak GFLOP/s that MFU is relative to (0: measure the CPU's; on a GPU, MFU needs it given)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
}

namespace {

// The widest fp32 vectors the build targets (-march=native here): 16 lanes (512 bits) with
// AVX-512, else 8 (256 bits, which the compiler splits into what the target has, that build's
// peak). With FMA one instruction does the multiply and the add (C++20 mode does not contract
// a * b + c itself).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
using v8 = float __attribute__((vector_size(64)));
inline v8 fma8(v8 a, v8 b, v8 c) { return v8(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c))); }
#else
constexpr int kLanes = 8;
using v8 = float __attribute__((vector_size(32)));
inline v8 fma8(v8 a, v8 b, v8 c) {
#if defined(__FMA__) && defined(__AVX__)
  return v8(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c)));
#else
  return a * b + c;
#endif
}
#endif

// `iters` rounds of 12 independent FMA chains: enough chains to cover the FMA latency (4 cycles)
// on two FMA pipes, so the loop runs at throughput. Returns a value that depends on every chain.
__attribute__((noinline)) float fma_chains(int64_t iters, float seed) {
  constexpr int kChains = 12;
  v8 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = v8{} + seed * float(c + 1);
  const v8 mul = v8{} + 0.999999f, add = v8{} + 1e-7f;
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = fma8(acc[c], mul, add);
  float s = 0;
  for (int c = 0; c < kChains; ++c)
    for (int l = 0; l < kLanes; ++l) s += acc[c][l];
  return s;
}
constexpr double kFlopsPerIter = 12 * kLanes * 2;  // chains x lanes x (multiply + add)

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(' '));
      return name;
    }
  return "unknown CPU";
}

}  // namespace

double measure_peak_flops(int threads, double seconds, int trials) {
  const int nt = threads > 0 ? threads : num_threads();
  using clock = std::chrono::steady_clock;
  // calibrate on one thread: how many rounds fill about `seconds`
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = clock::now();
    volatile float sink = fma_chains(iters, 1.0f);
    (void)sink;
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (dt >= seconds / 4 || iters > (int64_t(1) << 40)) {
      iters = std::max<int64_t>(1, int64_t(double(iters) * seconds / std::max(dt, 1e-9)));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < std::max(1, trials); ++rep) {  // the best: another process may hold a core a while
    const auto t0 = clock::now();
    float total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
    total += fma_chains(iters, 1.0f + float(omp_get_thread_num()));
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    volatile float sink = total;
    (void)sink;
    best = std::max(best, kFlopsPerIter * double(iters) * nt / dt);
  }
  return best;
}

std::string peak_flops_key(int threads) {
  return fmt::format("{}, {} fp32 lanes, {} thread{}", cpu_model_name(), kLanes, threads, threads == 1 ? "" : "s");
}

double best_peak_flops(const std::string& cache_file, const std::string& key, double measured) {
  nlohmann::json cache = nlohmann::json::object();
  {
    std::ifstream in(cache_file);
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded() && j.is_object()) cache = std::move(j);
    }
  }
  const auto it = cache.find(key);
  const double cached = it != cache.end() && it->is_number() && std::isfinite(it->get<double>()) ? it->get<double>() : 0;
  if (!(std::isfinite(measured) && measured > 0) || cached >= measured) return cached;
  cache[key] = measured;
  try {
    std::filesystem::create_directories(std::filesystem::path(cache_file).parent_path());
    write_file_atomic(cache_file, cache.dump(2) + "\n");
  } catch (const std::exception&) {  // a read-only home: the figure of this run stands alone
  }
  return measured;
}

double machine_peak_flops(std::string* source) {
  const int nt = auto_threads().active() ? auto_threads().cores() : num_threads();
  const double measured = measure_peak_flops(nt);
  const std::string file = default_cache_dir() + "/peak_flops.json";
  const double best = best_peak_flops(file, peak_flops_key(nt), measured);
  if (source)
    *source = fmt::format("fp32 FMA loop, {} thread{}, {}", nt, nt > 1 ? "s" : "",
                          best > measured ? fmt::format("the best measured on this machine ({:.0f}% of it now)",
                                                        100 * measured / best)
                                          : std::string("measured now"));
  return best;
}

void ComputeProfile::fill(RunReport& report) const {
  report.forward_flops_per_sample = summary.forward_flops_per_sample();
  report.forward_flops_per_token = summary.tokens > 0 ? summary.forward_flops_per_token() : 0;
  report.peak_flops = peak_flops;
  report.peak_source = peak_source;
}

ComputeProfile profile_model(nn::Module& model, const std::function<Tensor()>& forward, int64_t samples,
                             int64_t tokens_per_sample, const DiagnoseOptions& d, std::string* text) {
  ComputeProfile c;
  const bool was_training = model.is_training();
  model.eval();
  try {
    c.summary = nn::summarize(model, forward, samples, tokens_per_sample);
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  empty_cache(model.device());
  reset_peak_bytes(model.device());
  if (d.peak_gflops > 0) {
    c.peak_flops = d.peak_gflops * 1e9;
    c.peak_source = "--peak-gflops";
  } else if (model.device().is_cuda()) {  // a CPU loop says nothing of a GPU: MFU only with --peak-gflops
    c.peak_source = "a GPU's peak is not measured: give --peak-gflops for an MFU";
  } else {
    // under mpirun the throughput is the job's: the peak is every rank's (this rank's times N)
    const int world = dist::world_size();
    c.peak_flops = machine_peak_flops(&c.peak_source) * world;
    if (world > 1) c.peak_source += fmt::format(", x {} ranks", world);
  }
  if (text) {
    const nn::ModelSummary& s = c.summary;
    std::string line = fmt::format(
        "compute: {} forward FLOPs per sample{}, {} of activations for a batch of {}; {}",
        format_count(s.forward_flops_per_sample()),
        s.tokens > 0 ? fmt::format(" ({} per token)", format_count(s.forward_flops_per_token())) : "",
        format_bytes(double(s.root().activation_bytes)), samples,
        c.peak_flops > 0 ? fmt::format("peak {} FLOP/s ({})", format_count(c.peak_flops), c.peak_source)
                         : c.peak_source);
    *text = d.model_report ? s.to_text(3) + line : line + " (--model-report: per layer)";
  }
  return c;
}

nlohmann::json attention_report_to_json(const nn::AttentionReport& r) {
  nlohmann::json layers = nlohmann::json::array(), warnings = nlohmann::json::array();
  for (const nn::LayerAttentionStats& l : r.layers) {
    nlohmann::json heads = nlohmann::json::array(), sim = nlohmann::json::array();
    const size_t H = l.heads.size();
    for (size_t h = 0; h < H; ++h) {
      const nn::HeadAttentionStats& s = l.heads[h];
      heads.push_back({{"head", h},
                       {"entropy", s.entropy},
                       {"diagonal", s.diagonal},
                       {"uniform_diagonal", s.uniform_diagonal},
                       {"most_similar", s.most_similar},
                       {"max_similarity", s.max_similarity}});
      sim.push_back(std::vector<double>(l.similarity.begin() + std::ptrdiff_t(h * H),
                                        l.similarity.begin() + std::ptrdiff_t((h + 1) * H)));
    }
    layers.push_back({{"layer", l.layer},
                      {"shape", std::vector<int64_t>(l.shape.begin(), l.shape.end())},
                      {"rows", l.rows},
                      {"heads", heads},
                      {"similarity", sim}});
  }
  for (const nn::AttentionWarning& w : r.warnings)
    warnings.push_back({{"layer", w.layer}, {"check", w.check}, {"heads", w.heads}, {"message", w.message}});
  const nn::AttentionThresholds& t = r.thresholds;
  return {{"thresholds",
           {{"uniform_entropy", t.uniform_entropy},
            {"diagonal_mass", t.diagonal_mass},
            {"diagonal_over_uniform", t.diagonal_over_uniform},
            {"head_similarity", t.head_similarity}}},
          {"layers", layers},
          {"warnings", warnings}};
}

nn::AttentionReport write_attention_diagnostics(nn::Module& model, const std::function<void()>& forward,
                                                const std::string& dir, std::string* path) {
  const bool was_training = model.is_training();
  model.eval();
  nn::AttentionReport r;
  try {
    NoGradGuard no_grad;
    r = nn::diagnose_attention(model, forward);
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  empty_cache(model.device());
  reset_peak_bytes(model.device());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/attention_diagnostics.json";
  write_file_atomic(file, attention_report_to_json(r).dump(2) + "\n");
  if (path) *path = file;
  return r;
}

}  // namespace ag::apps
