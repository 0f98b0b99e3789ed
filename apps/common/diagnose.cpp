// The apps' model report, MFU and attention diagnostics (see diagnose.h).
#include "apps/common/diagnose.h"

#include <omp.h>
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "apps/common/plot.h"
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

// 8 fp32 lanes: 256-bit vectors where the build targets AVX (-march=native here; the compiler
// splits them into what the target has otherwise, which is then that build's peak). With FMA
// one instruction does the multiply and the add (C++20 mode does not contract a * b + c itself).
using v8 = float __attribute__((vector_size(32)));
inline v8 fma8(v8 a, v8 b, v8 c) {
#if defined(__FMA__) && defined(__AVX__)
  return v8(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c)));
#else
  return a * b + c;
#endif
}

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
    for (int l = 0; l < 8; ++l) s += acc[c][l];
  return s;
}
constexpr double kFlopsPerIter = 12 * 8 * 2;  // chains x lanes x (multiply + add)

}  // namespace

double measure_peak_flops(int threads, double seconds) {
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
  for (int rep = 0; rep < 3; ++rep) {  // the best of three: another process may take a core for a while
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
  if (d.peak_gflops > 0) {
    c.peak_flops = d.peak_gflops * 1e9;
    c.peak_source = "--peak-gflops";
  } else if (model.device().is_cuda()) {  // a CPU loop says nothing of a GPU: MFU only with --peak-gflops
    c.peak_source = "a GPU's peak is not measured: give --peak-gflops for an MFU";
  } else {
    // under mpirun the throughput is the job's: the peak is every rank's (this rank's times N)
    const int world = dist::world_size();
    c.peak_flops = measure_peak_flops() * world;
    c.peak_source = fmt::format("fp32 FMA loop, {} thread{}{}", num_threads(), num_threads() > 1 ? "s" : "",
                                world > 1 ? fmt::format(" x {} ranks", world) : std::string());
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
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/attention_diagnostics.json";
  write_file_atomic(file, attention_report_to_json(r).dump(2) + "\n");
  if (path) *path = file;
  return r;
}

}  // namespace ag::apps
