#pragma once
// The end-of-run report the apps print and save, and the human formatting it (and the progress bar)
// uses: durations as H:MM:SS, sizes in KiB/MiB/GiB, counts and rates with k/M/G suffixes.
//
//   ConfusionMatrix cm(labels);  cm.add(truth, pred) per sample;  cm.accuracy(), cm.to_text()
//   RunReport r; r.wall_seconds = ...; r.samples = ...; r.peak_rss_bytes = peak_rss_bytes();
//   fmt::print(stderr, "{}", r.to_text());  write r.to_json() next to the metrics
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ag::apps {

// ---- human formatting (pure functions) -----------------------------------------------------
// format_duration(3725) == "1:02:05", (65) == "1:05", (5) == "0:05"; rounds to whole seconds;
// negative, NaN or infinite -> "--:--" (an ETA that is not known yet).
std::string format_duration(double seconds);
// format_bytes(512) == "512 B", (1536) == "1.5 KiB", (3 << 30) == "3.0 GiB" (powers of 1024).
std::string format_bytes(double bytes);
// Three significant digits with a k/M/G/T suffix (powers of 1000):
// format_count(999) == "999", (1234) == "1.23k", (12345678) == "12.3M"; below 1000 non-integers
// keep three significant digits ("2.5", "0.125").
std::string format_count(double n);
// A rate as tqdm shows it: >= 1 per second -> "12.3k tok/s"; below -> seconds per unit
// ("2.50 s/it"); zero, negative or non-finite -> "? it/s".
std::string format_rate(double per_second, std::string_view unit = "it");

// At most max_chars code points of UTF-8 text; a longer string keeps max_chars - 1 and ends in
// "…". Never cuts inside a multi-byte character.
std::string truncate_label(std::string_view s, size_t max_chars);
// The number of code points of UTF-8 text (bytes that do not continue a character).
size_t utf8_length(std::string_view s);

// Peak resident set size of this process in bytes (getrusage: ru_maxrss, which Linux gives in KiB).
int64_t peak_rss_bytes();

// ---- confusion matrix ----------------------------------------------------------------------
// counts[t * n + p] = how many samples of true class t were predicted as p (rows: truth).
struct ConfusionMatrix {
  int n = 0;
  std::vector<std::string> labels;  // n names
  std::vector<int64_t> counts;      // n * n, row-major

  explicit ConfusionMatrix(std::vector<std::string> class_names);
  explicit ConfusionMatrix(int num_classes);  // labels "0", "1", ...

  // One sample; raises ag::Error naming both values when a class is outside [0, n).
  void add(int64_t truth, int64_t pred);
  // A batch: equal lengths (else ag::Error with both lengths).
  void add(const std::vector<int64_t>& truth, const std::vector<int64_t>& pred);

  int64_t at(int truth, int pred) const { return counts[size_t(truth) * size_t(n) + size_t(pred)]; }
  int64_t total() const;
  int64_t correct() const;          // the diagonal
  double accuracy() const;          // correct / total; NaN when empty
  double recall(int c) const;       // at(c,c) / row c sum; NaN when the row is empty
  double precision(int c) const;    // at(c,c) / column c sum; NaN when the column is empty
  double f1(int c) const;           // harmonic mean of the two; NaN when either is
  double macro_f1() const;          // mean of f1 over classes with a defined f1

  // A table with the true class down the side, the predicted class along the top, then
  // per-class recall/precision; labels longer than 12 characters are truncated.
  std::string to_text() const;
  nlohmann::json to_json() const;   // {"labels": [...], "counts": [[...], ...], "accuracy": ...}
};

// ---- the final report ----------------------------------------------------------------------
struct RunReport {
  std::string app;                   // "vit", "textclf", "gpt"
  std::string device = "cpu";        // --device: "cpu", "cuda", "cuda:1"
  std::string precision = "fp32";    // --precision: "fp32" or "bf16" (autocast)
  double wall_seconds = 0;           // whole run
  double train_seconds = 0;          // time inside training steps (throughput divides by this)
  int64_t steps = 0;
  int64_t parameters = 0;
  double samples = 0;                // training samples seen
  double tokens = 0;                 // training tokens seen (0: not a sequence model)
  int64_t peak_rss_bytes = 0;          // peak_rss_bytes(): the whole process
  int64_t peak_tensor_bytes = 0;       // alloc_stats().peak_bytes_in_use: tensors only (0: not shown)
  bool interrupted = false;          // stopped by Ctrl-C / SIGTERM / --stop-at before the last step
  bool early_stopped = false;        // ended by --patience (no better validation metric)
  int64_t best_step = -1;            // the step of best.safetensors, the model tested (-1: none)
  int64_t skipped_steps = 0;         // updates skipped for a non-finite loss or gradient norm
  double loss_scale = 0;             // --precision fp16: the final loss scale (0: no scaling)
  int64_t loss_scale_skips = 0;      // fp16: updates skipped for a gradient overflow (scale halved)
  std::optional<double> accuracy;    // final evaluation accuracy in [0, 1]
  std::optional<ConfusionMatrix> confusion;
  std::vector<std::pair<std::string, double>> extra;  // more numbers: {"val_loss", 1.23}, ...
  // Compute (apps/common/diagnose.h): the model's forward FLOPs per training sample, by the
  // convention of nn::summarize (matmuls 2 K per output, attention's two products over the full
  // T x T, pointwise ops one per element); and the CPU's peak FLOP/s that MFU is relative to:
  // fused multiply-adds at full vector width on the threads the run uses (measured) or --peak-gflops.
  double forward_flops_per_sample = 0;  // 0: not measured (no FLOP or MFU lines)
  // the same per token, for models whose samples vary in length (0: count per sample)
  double forward_flops_per_token = 0;
  double peak_flops = 0;                // FLOP/s; 0: no MFU line
  std::string peak_source;              // how peak_flops was found, e.g. "FMA loop, 2 threads"

  double samples_per_second() const;  // samples / train_seconds; 0 when train_seconds is 0
  double tokens_per_second() const;
  // Training FLOP/s: 3 x forward FLOPs per sample x samples per second (backward ~ 2 x forward:
  // the gradients of both operands of every product). When both forward_flops_per_token and the
  // token count are known, 3 x FLOPs per token x tokens per second instead: a text classifier's
  // batches are padded to their own length, so a per-sample count measured on one batch would
  // be off by the ratio of lengths; only the real (unpadded) tokens count as useful work.
  double training_flops_per_second() const;
  // Model FLOPs utilisation: training_flops_per_second() / peak_flops; 0 when either is unknown.
  // Above 1 it is a measurement error (the peak was measured low): to_text says so instead of a
  // percentage, and to_json writes "mfu": null with the ratio as "mfu_above_peak".
  double mfu() const;

  std::string to_text() const;        // aligned "name: value" lines, then the confusion table
  nlohmann::json to_json() const;     // the same numbers, machine-readable
};

}  // namespace ag::apps
