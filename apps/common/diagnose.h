#pragma once
// What the apps can say about a model beyond its loss: where its compute and memory go (the
// per-layer report of nn/summary.h, and MFU in the final report) and what its attention does
// (nn/diagnostics.h, with --diagnose-attention).
//
//   DiagnoseOptions d;  add_diagnose_options(cli, d);          --diagnose-attention, --model-report,
//                                                              --peak-gflops
//   ComputeProfile c = profile_model(model, forward, B, T, d); one forward at start: prints one line
//                                                              (or the whole table with --model-report)
//   c.fill(report);                                            forward FLOPs, peak, so MFU in the report
//   if (d.attention) write_attention_diagnostics(model, forward_one_batch, run_dir);
//
// MFU (model FLOPs utilisation) = training FLOP/s / peak FLOP/s, where
//   training FLOP/s = 3 x forward FLOPs per sample x samples per second
//     (forward FLOPs by nn::summarize's convention; backward counted as twice the forward)
//   peak FLOP/s     = what this CPU does with nothing but fused multiply-adds at the vector width
//     this build compiles for (512-bit with AVX-512, else 256-bit), on the threads the run may use
//     (under --threads 0, every core: the count follows the other processes' load, apps/common/threads.h):
//     measured at start by a short loop (measure_peak_flops: the best of 5 trials), and kept per
//     machine (machine_peak_flops: the best figure ever measured for this CPU model, vector width
//     and thread count, in <cache dir>/peak_flops.json), since a loop timed while another process
//     holds a core measures a fraction of the peak; or given with --peak-gflops (a datasheet's
//     number, say). On --device cuda nothing is measured: MFU appears only with --peak-gflops.
// So 100% would mean every cycle of every core doing a full-width FMA on model math. Matmuls
// reach well under that on small shapes; the softmax, norms and the optimizer none of it. A figure
// above 100% is impossible: the report then says the peak was wrong instead of printing it.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/common/report.h"
#include "nn/diagnostics.h"
#include "nn/summary.h"

namespace ag::apps {

struct DiagnoseOptions {
  bool attention = false;     // --diagnose-attention: after training (or --eval-only), one batch
  bool model_report = false;  // --model-report: the per-layer table at start (else one line)
  double peak_gflops = 0;     // --peak-gflops: the peak for MFU (0: measure the CPU's; none on a GPU)
};
// Registers the three options on an app's parser.
void add_diagnose_options(CLI::App& cli, DiagnoseOptions& d);

// The CPU's peak FLOP/s for fp32 fused multiply-adds on `threads` threads (0: the library's
// thread count): a loop of independent vector FMAs, no memory traffic, timed `trials` times for
// about `seconds` each; the best trial. Each FMA counts 2 FLOPs per lane.
double measure_peak_flops(int threads = 0, double seconds = 0.05, int trials = 5);

// What the FMA loop runs on here: "<CPU model name>, <lanes> fp32 lanes, <threads> threads" (the
// key of the per-machine cache).
std::string peak_flops_key(int threads);
// The best of `measured` and the figure `cache_file` (JSON: key -> FLOP/s) holds for `key`; a
// better `measured` is written back (atomically). A missing, unreadable or malformed cache file
// counts as empty and is replaced; one that cannot be written is left alone (the result stands).
double best_peak_flops(const std::string& cache_file, const std::string& key, double measured);
// measure_peak_flops on the threads the run may use, then best_peak_flops in
// <default_cache_dir()>/peak_flops.json. `source` (may be null) gets how it was found. The threads:
// the library's count, or under --threads 0 (apps/common/threads.h) every core the governor may
// take, since it changes the count during the run: MFU is then a share of those cores.
double machine_peak_flops(std::string* source = nullptr);

struct ComputeProfile {
  nn::ModelSummary summary;
  double peak_flops = 0;    // FLOP/s
  std::string peak_source;  // "--peak-gflops" or "FMA loop, N threads"
  // Sets the report's forward FLOPs per sample, peak and its source (MFU follows from them).
  void fill(RunReport& report) const;
};

// One forward of `model` through `forward` (a batch of `samples`, `tokens_per_sample` long; 0 for
// no sequence) in eval mode (restored afterwards, so no dropout draw changes the run), with
// nn::summarize; then the peak (--peak-gflops, or measured). Returns both and the line to print:
// with d.model_report the whole table, else one line of totals. The forward's blocks go back to the
// system and the device's peak restarts afterwards: that forward keeps a whole graph and runs no
// backward, more than a checkpointed training step holds, so the run's peak tensor bytes and
// rss_mb would otherwise be the probe's, not training's.
ComputeProfile profile_model(nn::Module& model, const std::function<Tensor()>& forward, int64_t samples,
                             int64_t tokens_per_sample, const DiagnoseOptions& d, std::string* text);

// The attention report as JSON:
//   {"thresholds": {...}, "layers": [{"layer", "shape", "rows", "heads": [{"head", "entropy",
//    "diagonal", "uniform_diagonal", "most_similar", "max_similarity"}], "similarity": [[...]]}],
//    "warnings": [{"layer", "check", "heads", "message"}]}
nlohmann::json attention_report_to_json(const nn::AttentionReport& r);

// --diagnose-attention: runs `forward` (one validation or test batch of `model`) in eval mode
// without recording, under an attention capture; returns the report, whose to_text() the app
// prints, after writing it to <dir>/attention_diagnostics.json (the returned path in *path).
nn::AttentionReport write_attention_diagnostics(nn::Module& model, const std::function<void()>& forward,
                                                const std::string& dir, std::string* path = nullptr);

}  // namespace ag::apps
