// Human formatting, the confusion matrix and the final report (see report.h).
#include "apps/common/report.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace ag::apps {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e12) return "--:--";
  const long long s = std::llround(seconds);
  const long long h = s / 3600, m = (s / 60) % 60, sec = s % 60;
  if (h > 0) return fmt::format("{}:{:02}:{:02}", h, m, sec);
  return fmt::format("{}:{:02}", m, sec);
}

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes) || bytes < 0) return "? B";
  if (bytes < 1024) return fmt::format("{:.0f} B", bytes);
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes / 1024;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string format_count(double n) {
  if (!std::isfinite(n)) return fmt::format("{}", n);
  if (n < 0) return fmt::format("-{}", format_count(-n));
  if (n < 1000) {
    if (n == std::floor(n)) return fmt::format("{:.0f}", n);
    return fmt::format("{:.3g}", n);
  }
  static const char* suffix[] = {"k", "M", "G", "T", "P"};
  int u = 0;
  double v = n / 1000;
  // 999.96k would print as "1000k" with three digits; move it to the next unit first.
  while (v >= 999.5 && u < 4) v /= 1000, ++u;
  const int decimals = v < 10 ? 2 : v < 100 ? 1 : 0;
  return fmt::format("{:.{}f}{}", v, decimals, suffix[u]);
}

std::string format_rate(double per_second, std::string_view unit) {
  if (!std::isfinite(per_second) || per_second <= 0) return fmt::format("? {}/s", unit);
  if (per_second >= 1) {
    // Rates show three significant digits: 12.3, 123, 1.23k (format_count keeps integers exact).
    std::string v = per_second < 1000 ? fmt::format("{:.3g}", per_second) : format_count(per_second);
    return fmt::format("{} {}/s", v, unit);
  }
  return fmt::format("{:.2f} s/{}", 1.0 / per_second, unit);
}

std::string truncate_label(std::string_view s, size_t max_chars) {
  // Byte offsets where each code point starts (continuation bytes are 10xxxxxx).
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  if (starts.size() <= max_chars) return std::string(s);
  if (max_chars == 0) return "";
  return std::string(s.substr(0, starts[max_chars - 1])) + "\u2026";
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

// ---- confusion matrix ----------------------------------------------------------------------

ConfusionMatrix::ConfusionMatrix(std::vector<std::string> class_names)
    : n(int(class_names.size())), labels(std::move(class_names)), counts(size_t(n) * size_t(n), 0) {
  check(n > 0, "ConfusionMatrix: needs at least one class, got 0 labels");
}

ConfusionMatrix::ConfusionMatrix(int num_classes) : n(num_classes) {
  check(num_classes > 0, "ConfusionMatrix: needs at least one class, got {}", num_classes);
  for (int i = 0; i < n; ++i) labels.push_back(std::to_string(i));
  counts.assign(size_t(n) * size_t(n), 0);
}

void ConfusionMatrix::add(int64_t truth, int64_t pred) {
  check(truth >= 0 && truth < n && pred >= 0 && pred < n,
        "ConfusionMatrix::add: class out of range [0, {}): truth {}, prediction {}", n, truth, pred);
  ++counts[size_t(truth) * size_t(n) + size_t(pred)];
}

void ConfusionMatrix::add(const std::vector<int64_t>& truth, const std::vector<int64_t>& pred) {
  check(truth.size() == pred.size(), "ConfusionMatrix::add: {} labels but {} predictions", truth.size(),
        pred.size());
  for (size_t i = 0; i < truth.size(); ++i) add(truth[i], pred[i]);
}

int64_t ConfusionMatrix::total() const {
  int64_t t = 0;
  for (int64_t c : counts) t += c;
  return t;
}

int64_t ConfusionMatrix::correct() const {
  int64_t t = 0;
  for (int i = 0; i < n; ++i) t += at(i, i);
  return t;
}

double ConfusionMatrix::accuracy() const {
  const int64_t t = total();
  return t == 0 ? std::numeric_limits<double>::quiet_NaN() : double(correct()) / double(t);
}

double ConfusionMatrix::recall(int c) const {
  int64_t row = 0;
  for (int p = 0; p < n; ++p) row += at(c, p);
  return row == 0 ? std::numeric_limits<double>::quiet_NaN() : double(at(c, c)) / double(row);
}

double ConfusionMatrix::precision(int c) const {
  int64_t col = 0;
  for (int t = 0; t < n; ++t) col += at(t, c);
  return col == 0 ? std::numeric_limits<double>::quiet_NaN() : double(at(c, c)) / double(col);
}

double ConfusionMatrix::f1(int c) const {
  const double p = precision(c), r = recall(c);
  if (std::isnan(p) || std::isnan(r)) return std::numeric_limits<double>::quiet_NaN();
  return p + r == 0 ? 0.0 : 2 * p * r / (p + r);
}

double ConfusionMatrix::macro_f1() const {
  double sum = 0;
  int k = 0;
  for (int c = 0; c < n; ++c)
    if (double f = f1(c); !std::isnan(f)) sum += f, ++k;
  return k == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / k;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

namespace {
std::string percent_or_dash(double v) { return std::isnan(v) ? "-" : fmt::format("{:.1f}%", 100 * v); }
// Pads UTF-8 text to `width` code points (fmt pads by bytes for std::string).
std::string pad_left(const std::string& s, size_t width) {
  const size_t cps = utf8_length(s);
  return cps >= width ? s : std::string(width - cps, ' ') + s;
}
}  // namespace

std::string ConfusionMatrix::to_text() const {
  std::vector<std::string> names;
  size_t label_w = 5;  // "truth"
  for (const auto& l : labels) {
    names.push_back(truncate_label(l, 12));
    label_w = std::max(label_w, utf8_length(names.back()));
  }
  int64_t max_count = 1;
  for (int64_t c : counts) max_count = std::max(max_count, c);
  size_t cell_w = std::to_string(max_count).size();
  for (const auto& s : names) cell_w = std::max(cell_w, utf8_length(s));
  cell_w += 1;

  std::string out = fmt::format("confusion matrix (rows: true class, columns: predicted), accuracy {}\n",
                                percent_or_dash(accuracy()));
  out += pad_left("truth", label_w);
  for (const auto& s : names) out += pad_left(s, cell_w);
  out += "   recall precision\n";
  for (int t = 0; t < n; ++t) {
    out += pad_left(names[size_t(t)], label_w);
    for (int p = 0; p < n; ++p) out += pad_left(std::to_string(at(t, p)), cell_w);
    out += fmt::format(" {:>8} {:>9}\n", percent_or_dash(recall(t)), percent_or_dash(precision(t)));
  }
  return out;
}

nlohmann::json ConfusionMatrix::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (int t = 0; t < n; ++t) {
    nlohmann::json row = nlohmann::json::array();
    for (int p = 0; p < n; ++p) row.push_back(at(t, p));
    rows.push_back(row);
  }
  nlohmann::json j = {{"labels", labels}, {"counts", rows}, {"total", total()}, {"correct", correct()}};
  const double acc = accuracy();
  j["accuracy"] = std::isnan(acc) ? nlohmann::json(nullptr) : nlohmann::json(acc);
  return j;
}

// ---- run report ----------------------------------------------------------------------------

double RunReport::samples_per_second() const { return train_seconds > 0 ? samples / train_seconds : 0; }
double RunReport::tokens_per_second() const { return train_seconds > 0 ? tokens / train_seconds : 0; }
double RunReport::training_flops_per_second() const {
  if (forward_flops_per_token > 0 && tokens > 0) return 3.0 * forward_flops_per_token * tokens_per_second();
  return 3.0 * forward_flops_per_sample * samples_per_second();
}
double RunReport::mfu() const { return peak_flops > 0 ? training_flops_per_second() / peak_flops : 0; }

std::string RunReport::to_text() const {
  std::vector<std::pair<std::string, std::string>> rows;
  rows.reserve(17 + extra.size());  // also keeps GCC 12 from a false -Warray-bounds in the growth path
  rows.emplace_back("app", app + (interrupted ? " (interrupted)" : early_stopped ? " (stopped early: --patience)" : ""));
  rows.emplace_back("device", device + (precision == "fp32" ? std::string(", fp32")
                                                            : ", " + precision + " autocast (matmul, linear, attention)"));
  if (loss_scale > 0)
    rows.emplace_back("loss scale", fmt::format("{:g} at the end, {} updates skipped for an fp16 overflow", loss_scale,
                                                loss_scale_skips));
  rows.emplace_back("wall time", format_duration(wall_seconds));
  rows.emplace_back("training time", format_duration(train_seconds));
  rows.emplace_back("steps", fmt::format("{}", steps));
  if (best_step >= 0) rows.emplace_back("best model", fmt::format("step {} (by validation; tested)", best_step));
  rows.emplace_back("parameters", fmt::format("{} ({})", parameters, format_count(double(parameters))));
  rows.emplace_back("samples", format_count(samples));
  rows.emplace_back("throughput", format_rate(samples_per_second(), "samples"));
  if (tokens > 0) {
    rows.emplace_back("tokens", format_count(tokens));
    rows.emplace_back("token throughput", format_rate(tokens_per_second(), "tok"));
  }
  rows.emplace_back("peak memory (RSS)", format_bytes(double(peak_rss_bytes)));
  if (peak_tensor_bytes > 0) rows.emplace_back("peak tensor memory", format_bytes(double(peak_tensor_bytes)));
  if (forward_flops_per_sample > 0) {
    const bool per_token = forward_flops_per_token > 0 && tokens > 0;
    rows.emplace_back("forward FLOPs", per_token ? format_count(forward_flops_per_token) + " per token"
                                                 : format_count(forward_flops_per_sample) + " per sample");
    rows.emplace_back("training FLOP/s", format_count(training_flops_per_second()) +
                                             (per_token ? " (3 x forward, real tokens)" : " (3 x forward)"));
  }
  if (mfu() > 1)  // impossible: the peak is wrong, and so would be any figure printed against it
    rows.emplace_back("MFU", fmt::format("not known: the training FLOP/s are {:.0f}% of the {}FLOP/s peak ({}), "
                                         "above 100%, so that peak was measured low (another process on the "
                                         "cores?); --peak-gflops gives the right one",
                                         100 * mfu(), format_count(peak_flops), peak_source));
  else if (mfu() > 0)
    rows.emplace_back("MFU", fmt::format("{:.1f}% of a {}FLOP/s peak ({})", 100 * mfu(), format_count(peak_flops),
                                         peak_source));
  if (skipped_steps > 0) rows.emplace_back("skipped steps", fmt::format("{} (non-finite loss or gradient norm)", skipped_steps));
  if (accuracy) rows.emplace_back("accuracy", fmt::format("{:.2f}%", 100 * *accuracy));
  for (const auto& [name, value] : extra) rows.emplace_back(name, fmt::format("{:.6g}", value));

  size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.first.size());
  std::string out;
  for (const auto& [name, value] : rows) out += fmt::format("{:>{}}: {}\n", name, w, value);
  if (confusion) out += confusion->to_text();
  return out;
}

nlohmann::json RunReport::to_json() const {
  nlohmann::json j = {{"app", app},
                      {"device", device},
                      {"precision", precision},
                      {"interrupted", interrupted},
                      {"early_stopped", early_stopped},
                      {"wall_seconds", wall_seconds},
                      {"train_seconds", train_seconds},
                      {"steps", steps},
                      {"parameters", parameters},
                      {"samples", samples},
                      {"tokens", tokens},
                      {"samples_per_second", samples_per_second()},
                      {"tokens_per_second", tokens_per_second()},
                      {"peak_rss_bytes", peak_rss_bytes},
                      {"peak_tensor_bytes", peak_tensor_bytes},
                      {"skipped_steps", skipped_steps}};
  if (loss_scale > 0) j["loss_scale"] = loss_scale, j["loss_scale_skips"] = loss_scale_skips;
  if (best_step >= 0) j["best_step"] = best_step;
  if (forward_flops_per_sample > 0) {
    j["forward_flops_per_sample"] = forward_flops_per_sample;
    if (forward_flops_per_token > 0) j["forward_flops_per_token"] = forward_flops_per_token;
    j["training_flops_per_second"] = training_flops_per_second();
  }
  if (peak_flops > 0) {
    j["peak_flops"] = peak_flops;
    j["peak_source"] = peak_source;
    // above 1 the peak was wrong: no MFU, and the ratio kept apart for whoever investigates
    if (mfu() > 1)
      j["mfu"] = nullptr, j["mfu_above_peak"] = mfu();
    else
      j["mfu"] = mfu();
  }
  if (accuracy) j["accuracy"] = *accuracy;
  if (confusion) j["confusion"] = confusion->to_json();
  for (const auto& [name, value] : extra)
    j[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  return j;
}

}  // namespace ag::apps
