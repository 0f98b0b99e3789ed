// How attention for long sequences scales with T: forward + backward time and peak memory of one
// attention layer (B, T, d) -> (B, T, d), for every method of apps/longseq and its PyTorch version
// (bench/torch_reference.py longseq, the twins of bench/torch_models.py), in one run; a fitted
// log-log slope per method, and one SVG of both curves.
//
//   bench_longseq [--T 512,1024,2048,4096,8192,16384] [--methods all | m1,m2,...] [--d 64] [--heads 4]
//                 [--batch 1] [--threads N] [--no-torch] [--max-materialised-T 8192]
//                 [--out DIR] [--plot-only FILE.jsonl --svg FILE.svg]
//
// The methods, with apps/longseq's default settings (LongSeqConfig) unless said otherwise:
//   full            nn::MultiHeadAttention, the fused tiled kernel (O(T) memory, T^2 time)
//   materialised    the same on the composed path of scaled_dot_product_attention (need_weights):
//                   matmul, softmax, matmul, the T x T scores and weights stored (O(T^2) memory); only up to
//                   --max-materialised-T, which bounds its memory (about 4 B H T^2 x 4 bytes)
//   window          the fused kernel with SdpaOptions::window = 64 (keys within +-64)
//   sparse          a local-global block mask (blocks of 32, a band of +-1 block, 1 global block)
//   strided         a strided block mask (blocks of 32) with stride s = round(sqrt(n / 2)) blocks
//                   for n blocks, the stride that keeps the fewest blocks (O(T^1.5), Child et al.)
//   linformer       nn::LinformerAttention, k = 128
//   compressed      nn::MemoryCompressedAttention, stride 4 (T / 4 keys: T^2 / 4 time)
//   compressed-128  the same with stride T / 128: always 128 compressed keys (linear in T, and the
//                   compression's weight (s d x d) grows with T)
//   axial           nn::AxialAttention over a grid of h x w = T tokens (h = w, or h = w / 2)
// The PyTorch side runs in its fastest set-up here (bench::torch_fastest_env: OMP_WAIT_POLICY=PASSIVE,
// tcmalloc), each point a fresh process with torch.set_num_threads equal to ours.
// The PyTorch versions: full is F.scaled_dot_product_attention; window, sparse and strided the
// same with the dense T x T boolean mask of the pattern (what PyTorch offers for a custom mask
// without compiling); materialised the explicit math; linformer, compressed and axial the twins.
//
// Time: the median of forward + backward (y.backward(g), parameters and x requiring gradients)
// over 3 runs after one warm-up run (10 runs when a run takes under 0.1 s). Memory, attograd: the
// peak bytes held during one forward + backward beyond what was held before it (alloc_stats:
// activations, saved tensors, gradients); PyTorch: the growth of the process's max RSS (CPU torch
// keeps no allocator statistics), so the two memory curves compare loosely. Each PyTorch point is
// a fresh process, so a point that runs out of memory loses only itself.
//
// Output: a table, the fitted slope of log time vs log T between 2048 and 16384 for each method and
// side; with --out DIR also DIR/longseq.jsonl (one JSON line per method, side and T) and
// DIR/scaling.svg. --plot-only redraws the SVG from such a JSONL file without measuring.
#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "apps/longseq/model.h"
#include "attograd.h"
#include "bench/bench_util.h"

using namespace ag;
using nlohmann::json;

namespace {

const std::vector<std::string> kMethods = {"full",   "materialised", "window",         "sparse", "strided",
                                           "linformer", "compressed", "compressed-128", "axial"};

struct LayerShape {
  int64_t B, T, d, H;
};

// The axial grid of T tokens: h = w when T is a square, else h = w / 2 (T = 2 w^2); 0 x 0 otherwise.
std::pair<int64_t, int64_t> axial_grid(int64_t T) {
  const auto w = int64_t(std::llround(std::sqrt(double(T))));
  if (w * w == T) return {w, w};
  const auto h = int64_t(std::llround(std::sqrt(double(T) / 2)));
  if (2 * h * h == T) return {h, 2 * h};
  return {0, 0};
}

int64_t strided_stride(int64_t T, int64_t block) {
  const int64_t n = (T + block - 1) / block;
  return std::max<int64_t>(1, std::llround(std::sqrt(double(n) / 2)));
}

// One attention layer of a method at one shape: its module, and its forward.
struct Layer {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;
  std::string settings;                 // what the method was run with, for the JSON
  std::vector<std::string> torch_args;  // the same settings as options of torch_reference.py longseq
};

Layer make_layer(const std::string& method, const LayerShape& s, Generator* gen) {
  const apps::longseq::LongSeqConfig cfg;  // the app's default settings
  Layer l;
  if (method == "linformer") {
    auto m = std::make_shared<nn::LinformerAttention>(s.d, s.H, s.T, cfg.k,
                                                      nn::LinformerAttention::Options{.generator = gen});
    l = {m, [m](const Tensor& x) { return m->forward(x).out; }, fmt::format("k {}", cfg.k),
         {"--k", std::to_string(cfg.k)}};
  } else if (method == "compressed" || method == "compressed-128") {
    const int64_t stride = method == "compressed" ? cfg.stride : std::max<int64_t>(1, s.T / 128);
    auto m = std::make_shared<nn::MemoryCompressedAttention>(s.d, s.H, stride,
                                                             nn::MemoryCompressedAttention::Options{.generator = gen});
    l = {m, [m](const Tensor& x) { return m->forward(x).out; }, fmt::format("stride {}", stride),
         {"--stride", std::to_string(stride)}};
  } else if (method == "axial") {
    const auto [h, w] = axial_grid(s.T);
    check(h > 0, "bench_longseq: axial needs T = w^2 or 2 w^2, got T {}", s.T);
    auto m = std::make_shared<nn::AxialAttention>(s.d, s.H, h, w, nn::AxialAttention::Options{.generator = gen});
    l = {m, [m](const Tensor& x) { return m->forward(x); }, fmt::format("grid {} x {}", h, w),
         {"--grid", fmt::format("{},{}", h, w)}};
  } else {
    auto m = std::make_shared<nn::MultiHeadAttention>(s.d, s.H, nn::MultiHeadAttention::Options{.generator = gen});
    nn::AttentionOptions o;
    if (method == "window") {
      o.window = cfg.window;
      l.settings = fmt::format("window {}", cfg.window);
      l.torch_args = {"--window", std::to_string(cfg.window)};
    } else if (method == "sparse") {
      o.block_mask = nn::local_global_block_mask(s.T, cfg.block, cfg.window_blocks, cfg.global_blocks);
      o.block_size = cfg.block;
      l.settings = fmt::format("local-global, block {}, window_blocks {}, global_blocks {}", cfg.block,
                               cfg.window_blocks, cfg.global_blocks);
      l.torch_args = {"--block", std::to_string(cfg.block), "--window-blocks", std::to_string(cfg.window_blocks),
                      "--global-blocks", std::to_string(cfg.global_blocks)};
    } else if (method == "strided") {
      const int64_t stride = strided_stride(s.T, cfg.block);
      o.block_mask = nn::strided_block_mask(s.T, cfg.block, stride);
      o.block_size = cfg.block;
      l.settings = fmt::format("block {}, stride_blocks {}", cfg.block, stride);
      l.torch_args = {"--block", std::to_string(cfg.block), "--stride-blocks", std::to_string(stride)};
    }
    if (method == "materialised") o.need_weights = true;  // the composed path: T x T scores and weights stored
    l.module = m;
    l.forward = [m, o](const Tensor& x) { return m->forward(x, o).out; };
  }
  return l;
}

struct Point {
  double ms = 0, peak_mb = 0;
  int reps = 0;
  std::string settings;
  std::vector<std::string> torch_args;
};

Point measure_ours(const std::string& method, const LayerShape& s) {
  Generator gen(0);
  Layer layer = make_layer(method, s, &gen);
  Tensor x = randn({s.B, s.T, s.d}, DType::f32, &gen).set_requires_grad(true);
  const Tensor g = randn({s.B, s.T, s.d}, DType::f32, &gen);
  auto step = [&] {
    layer.module->zero_grad();
    x.set_grad(Tensor());
    layer.forward(x).backward(g);
  };
  // the warm-up run decides the repetitions
  const double first = bench::seconds_of(step);
  Point p;
  p.reps = first < 0.1 ? 10 : 3;
  p.ms = bench::median_seconds(step, p.reps, 0) * 1e3;
  layer.module->zero_grad();
  x.set_grad(Tensor());
  const uint64_t base = alloc_stats(Device::cpu()).bytes_in_use;
  reset_peak_bytes(Device::cpu());
  step();
  p.peak_mb = double(alloc_stats(Device::cpu()).peak_bytes_in_use - base) / 1e6;
  p.settings = layer.settings;
  p.torch_args = layer.torch_args;
  return p;
}

// ---- the slope and the plot -------------------------------------------------------------------

// Least-squares slope of log(ms) against log(T) over the points with lo <= T <= hi; NaN with fewer
// than two.
double fitted_slope(const std::map<int64_t, double>& ms_by_T, int64_t lo, int64_t hi) {
  std::vector<std::pair<double, double>> p;
  for (const auto& [T, ms] : ms_by_T)
    if (T >= lo && T <= hi && ms > 0) p.emplace_back(std::log(double(T)), std::log(ms));
  if (p.size() < 2) return NAN;
  double mx = 0, my = 0;
  for (const auto& [x, y] : p) mx += x, my += y;
  mx /= double(p.size()), my /= double(p.size());
  double sxy = 0, sxx = 0;
  for (const auto& [x, y] : p) sxy += (x - mx) * (y - my), sxx += (x - mx) * (x - mx);
  return sxx > 0 ? sxy / sxx : NAN;
}

// side -> method -> T -> record
using Results = std::map<std::string, std::map<std::string, std::map<int64_t, json>>>;

Results read_jsonl(const std::string& path) {
  std::ifstream in(path);
  check(bool(in), "bench_longseq: cannot read {}", path);
  Results r;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    check(!j.is_discarded() && j.contains("side") && j.contains("method") && j.contains("T"),
          "bench_longseq: {} line {}: not a result line", path, n);
    r[j["side"]][j["method"]][j["T"].get<int64_t>()] = j;
  }
  return r;
}

// The two log-log charts, time and memory against T, of every method and side: attograd solid,
// PyTorch dashed in the method's colour.
std::string draw(const Results& r) {
  std::string title = "One attention layer, f32.", torch = "PyTorch";
  for (const auto& [side, methods] : r) {
    if (methods.empty() || methods.begin()->second.empty()) continue;
    const json& j = methods.begin()->second.begin()->second;
    if (side == "attograd")
      title = fmt::format("One attention layer, B {}, d {}, {} heads, f32, {} threads.", j.value("B", 0),
                          j.value("d", 0), j.value("heads", 0), j.value("threads", 0));
    else
      torch = side;
  }
  apps::LineChart time, mem;
  time.title = "forward + backward time of one layer";
  time.x_label = mem.x_label = "sequence length T";
  time.y_label = "ms";
  mem.title = "peak memory of one forward + backward";
  mem.y_label = "MB beyond the inputs";
  time.log_x = time.log_y = mem.log_x = mem.log_y = true;
  time.width = mem.width = 640;
  time.height = mem.height = 560;
  std::vector<double> ticks;
  for (const auto& [side, methods] : r)
    for (const auto& [m, points] : methods)
      for (const auto& [T, j] : points)
        if (std::find(ticks.begin(), ticks.end(), double(T)) == ticks.end()) ticks.push_back(double(T));
  time.x_ticks = mem.x_ticks = ticks;
  for (size_t k = 0; k < kMethods.size(); ++k)
    for (const auto& [side, methods] : r) {
      const auto it = methods.find(kMethods[k]);
      if (it == methods.end()) continue;
      const bool ours = side == "attograd";
      apps::Series st{ours ? kMethods[k] : kMethods[k] + " (PyTorch)", {}, {}, int(k), !ours};
      apps::Series sm = st;
      for (const auto& [T, j] : it->second) {
        st.x.push_back(double(T)), st.y.push_back(j.value("ms", NAN));
        sm.x.push_back(double(T)), sm.y.push_back(j.value(ours ? "peak_mb" : "peak_rss_mb", NAN));
      }
      time.series.push_back(st), mem.series.push_back(sm);
    }
  std::string svg = apps::svg_line_charts({time, mem}, 2);
  // the caption: what the lines are
  const std::string caption = fmt::format(
      "<text x=\"12\" y=\"{}\" font-size=\"11\" font-family=\"sans-serif\">{} Solid: attograd; dashed: "
      "{} (memory: growth of max RSS).</text>\n",
      time.height - 2, apps::xml_escape(title), apps::xml_escape(torch));
  svg.insert(svg.rfind("</svg>"), caption);
  return svg;
}

void print_slopes(const Results& r) {
  fmt::print("\nfitted slope of log(ms) vs log(T), 2048 <= T <= 16384 (1: linear, 2: quadratic):\n");
  for (const auto& m : kMethods) {
    std::string line = fmt::format("  {:<15}", m);
    bool any = false;
    for (const auto& [side, methods] : r) {
      const auto it = methods.find(m);
      if (it == methods.end()) continue;
      std::map<int64_t, double> ms;
      for (const auto& [T, j] : it->second) ms[T] = j.value("ms", NAN);
      const double s = fitted_slope(ms, 2048, 16384);
      line += fmt::format("  {} {}", side, std::isfinite(s) ? fmt::format("{:.2f}", s) : "-");
      any = true;
    }
    if (any) fmt::print("{}\n", line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"attograd: attention methods for long sequences, time and memory against T, beside PyTorch"};
  std::vector<int64_t> Ts = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<std::string> methods = {"all"};
  int64_t d = 64, H = 4, B = 1, max_materialised = 8192;
  int threads = 0;
  bool no_torch = false;
  std::string out_dir, plot_only, svg_path, script;
  cli.add_option("--T", Ts, "sequence lengths")->delimiter(',')->check(apps::positive())->capture_default_str();
  cli.add_option("--methods", methods, fmt::format("all, or some of: {}", fmt::join(kMethods, ", ")))
      ->delimiter(',')
      ->capture_default_str();
  cli.add_option("--d", d, "model width")->check(apps::positive())->capture_default_str();
  cli.add_option("--heads", H, "heads (divides --d)")->check(apps::positive())->capture_default_str();
  cli.add_option("--batch", B, "batch")->check(apps::positive())->capture_default_str();
  cli.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS, else the cores)")
      ->check(apps::positive());
  cli.add_option("--max-materialised-T", max_materialised, "the longest T of the materialised method")
      ->check(apps::positive())
      ->capture_default_str();
  cli.add_flag("--no-torch", no_torch, "attograd only");
  cli.add_option("--script", script, "bench/torch_reference.py (default: found next to this source)");
  cli.add_option("--out", out_dir, "write DIR/longseq.jsonl and DIR/scaling.svg");
  cli.add_option("--plot-only", plot_only, "draw the SVG (--svg) from this JSONL file, measuring nothing");
  cli.add_option("--svg", svg_path, "with --plot-only: where the SVG goes");
  if (const int rc = apps::parse_command_line(cli, argc, argv, "bench_longseq"); rc >= 0) return rc;
  const auto usage = [](const std::string& msg) {
    fmt::print(stderr, "bench_longseq: {}\n", msg);
    return 2;
  };
  if (methods == std::vector<std::string>{"all"}) methods = kMethods;
  for (const auto& m : methods)
    if (std::find(kMethods.begin(), kMethods.end(), m) == kMethods.end())
      return usage(fmt::format("--methods: unknown method '{}' (expected all or some of {})", m, fmt::join(kMethods, ", ")));
  if (d % H != 0) return usage(fmt::format("--heads {} does not divide --d {}", H, d));
  if (!plot_only.empty()) {
    if (svg_path.empty()) return usage("--plot-only needs --svg FILE");
    try {
      const Results r = read_jsonl(plot_only);
      apps::write_file_atomic(svg_path, draw(r));
      print_slopes(r);
    } catch (const Error& e) {
      fmt::print(stderr, "{}\n", e.what());
      return 1;
    }
    return 0;
  }
  if (threads > 0) set_num_threads(threads);

  const std::string torch_script = bench::torch_script_path(__FILE__, argv[0], script);
  const std::string python = no_torch ? std::string() : bench::find_torch_python();
  if (!no_torch && python.empty()) fmt::print("PyTorch: not found (set ATTOGRAD_PYTHON to a Python that has torch)\n");
  const bool with_torch = !python.empty() && !torch_script.empty();
  const bench::TorchEnv torch_env = bench::torch_fastest_env();
  fmt::print("attograd bench_longseq: one attention layer, B {} d {} heads {}, f32, forward+backward, {} threads, "
             "OMP_WAIT_POLICY {}{}\n\n",
             B, d, H, num_threads(), bench::omp_wait_policy(),
             with_torch ? "; PyTorch with " + torch_env.describe : std::string());
  fmt::print("{:<15} {:>6} {:>10} {:>10} {:>12} {:>13} {:>9}  {}\n", "method", "T", "ms", "MB", "torch ms",
             "torch RSS MB", "torch/us", "settings");

  std::ofstream jsonl;
  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    jsonl.open(out_dir + "/longseq.jsonl");
    if (!jsonl) return usage(fmt::format("--out: cannot write {}/longseq.jsonl", out_dir));
  }
  Results results;
  for (const auto& m : methods)
    for (int64_t T : Ts) {
      if (m == "materialised" && T > max_materialised) continue;
      if (m == "axial" && axial_grid(T).first == 0) {
        fmt::print("{:<15} {:>6}  skipped: axial needs T = w^2 or 2 w^2\n", m, T);
        continue;
      }
      const LayerShape s{B, T, d, H};
      Point p;
      try {
        p = measure_ours(m, s);
      } catch (const Error& e) {
        fmt::print("{:<15} {:>6}  failed: {}\n", m, T, e.what());
        continue;
      }
      json ours = {{"side", "attograd"}, {"method", m},      {"T", T},           {"B", B},
                   {"d", d},             {"heads", H},       {"ms", p.ms},       {"peak_mb", p.peak_mb},
                   {"reps", p.reps},     {"settings", p.settings}, {"threads", num_threads()}};
      results["attograd"][m][T] = ours;
      if (jsonl.is_open()) jsonl << ours.dump() << "\n" << std::flush;
      std::string torch_cols = fmt::format("{:>12} {:>13} {:>9}", "-", "-", "-");
      if (with_torch) {
        std::vector<std::string> args = {"--method",  m,
                                         "--T",       std::to_string(T),
                                         "--batch",   std::to_string(B),
                                         "--d",       std::to_string(d),
                                         "--heads",   std::to_string(H),
                                         "--threads", std::to_string(num_threads()),
                                         "--reps",    std::to_string(p.reps),
                                         "--warmup",  "1"};
        args.insert(args.end(), p.torch_args.begin(), p.torch_args.end());
        const auto t = bench::torch_reference(torch_script, "longseq", args, {m}, torch_env.prefix, python);
        if (t) {
          const json& r = (*t)["results"][m];
          const std::string side = "torch " + (*t)["torch"].get<std::string>();
          json theirs = {{"side", side},          {"method", m},
                         {"T", T},                {"B", B},
                         {"d", d},                {"heads", H},
                         {"ms", r["ms"]},         {"peak_rss_mb", r["peak_rss_mb"]},
                         {"reps", p.reps},        {"impl", (*t)["impl"]},
                         {"threads", (*t)["threads"]}};
          results[side][m][T] = theirs;
          if (jsonl.is_open()) jsonl << theirs.dump() << "\n" << std::flush;
          torch_cols = fmt::format("{:>12.2f} {:>13.1f} {:>9.2f}", r["ms"].get<double>(),
                                   r["peak_rss_mb"].get<double>(), r["ms"].get<double>() / p.ms);
        }
      }
      fmt::print("{:<15} {:>6} {:>10.2f} {:>10.1f} {}  {}\n", m, T, p.ms, p.peak_mb, torch_cols, p.settings);
      std::fflush(stdout);
    }
  print_slopes(results);
  fmt::print("\nMB: attograd's peak bytes beyond the inputs (alloc_stats); torch RSS MB: growth of the PyTorch\n"
             "process's max RSS. torch/us > 1: attograd is faster.\n");
  if (!out_dir.empty()) {
    apps::write_file_atomic(out_dir + "/scaling.svg", draw(results));
    fmt::print("wrote {0}/longseq.jsonl and {0}/scaling.svg\n", out_dir);
  }
  return 0;
}
