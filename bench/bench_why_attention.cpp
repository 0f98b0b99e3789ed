// Why self-attention (docs/math/why-attention.md): a self-attention layer, a recurrent layer and a
// 1-D convolution of the same width d, each built from attograd ops, compared as section 4 of
// "Attention Is All You Need" compares them:
//
//   cost        forward FLOPs of one layer as nn::summarize counts them from the recorded ops, beside
//               the formula; and the time of one forward + backward, against the sequence length n
//   sequential  the longest chain of dependent ops on the tape of one layer: ops that must run one
//               after another, however many cores there are
//   path        the fewest stacked layers after which output n-1 depends on input 0, read from the
//               gradient d sum(y_{n-1}) / d x_0: exactly zero while no path exists, nonzero after
//
//   bench_why_attention [--n 64,128,256,512,1024,2048] [--d 64] [--heads 4] [--batch 1] [--kernel 3]
//                       [--reps 5] [--path-n 8,16,32,64,128] [--path-d 16] [--threads N] [--out DIR]
//   bench_why_attention --plot-only FILE.jsonl --svg FILE.svg
//
// The layers, x (B, n, d) -> y (B, n, d):
//   attention     nn::MultiHeadAttention(d, heads), no mask: y = softmax(q k^T / sqrt(hs)) v W^O
//   recurrent     h_t = tanh(x_t W^T + b + h_{t-1} U^T), h_{-1} = 0: one linear over every position,
//                 then n steps of linear, add and tanh in a loop
//   conv          causal, kernel k: y_i = b + sum_{j<k} W_j x_{i-j}, zeros before position 0; the k
//                 shifted copies of x (narrow views of x padded in front) concatenated along the
//                 features, then one linear of width k d (unfold, then a matrix product)
//   conv-dilated  the same with dilation k^l in layer l (path only): the reach multiplies by k
// Time: the median over --reps rounds; each round runs the three layers one after the other, the
// starting layer rotating, so that a load that comes and goes on the machine reaches all three.
//
// Output: tables; with --out DIR also DIR/why-attention.jsonl (one JSON line per layer and n) and
// DIR/why-attention.svg. --plot-only redraws the SVG from such a JSONL file without measuring.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "nn/attention.h"
#include "nn/summary.h"

using namespace ag;
using nlohmann::json;

namespace {

// h_t = tanh(x_t W^T + b + h_{t-1} U^T): the input's part for every position in one product (no
// step depends on it), then the n steps, each waiting for the one before.
struct Recurrent : nn::Module {
  Tensor W, U, b;
  Recurrent(int64_t d, Generator* g) {
    const double s = 1.0 / std::sqrt(double(d));
    W = register_parameter("W", randn({d, d}, DType::f32, g, 0, s));
    U = register_parameter("U", randn({d, d}, DType::f32, g, 0, s));
    b = register_parameter("b", zeros({d}));
  }
  Tensor forward(const Tensor& x) {
    const int64_t B = x.size(0), n = x.size(1), d = x.size(2);
    const Tensor xw = linear(x, W, b);  // (B, n, d)
    Tensor h = zeros({B, d});
    std::vector<Tensor> hs;
    hs.reserve(size_t(n));
    for (int64_t t = 0; t < n; ++t) {
      h = tanh(xw.select(1, t) + linear(h, U));
      hs.push_back(h);
    }
    return stack(hs, 1);
  }
};

// Causal 1-D convolution: y_i = b + sum_{j<k} W_j x_{i - j dil}. x padded with (k-1) dil zero rows
// in front; window j is the narrow view starting at j dil, so position i of window j is
// x_{i - (k-1-j) dil}; the k windows side by side make (B, n, k d), and one linear mixes them.
struct Conv : nn::Module {
  Tensor W, b;
  int64_t k, dil;
  Conv(int64_t d, int64_t k, int64_t dil, Generator* g) : k(k), dil(dil) {
    W = register_parameter("W", randn({d, k * d}, DType::f32, g, 0, 1.0 / std::sqrt(double(k * d))));
    b = register_parameter("b", zeros({d}));
  }
  Tensor forward(const Tensor& x) {
    const int64_t B = x.size(0), n = x.size(1), d = x.size(2);
    const Tensor padded = cat({zeros({B, (k - 1) * dil, d}), x}, 1);
    std::vector<Tensor> windows;
    for (int64_t j = 0; j < k; ++j) windows.push_back(padded.narrow(1, j * dil, n));
    return linear(cat(windows, 2), W, b);
  }
};

struct Shapes {
  int64_t B, d, heads, k;
  int64_t n_max = 1 << 20;  // the longest sequence the layers see (bounds the dilation)
};

// One layer of a kind, as a module (for summarize and zero_grad) and its forward.
struct Layer {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;
};

Layer make_layer(const std::string& kind, const Shapes& s, int64_t index, Generator* g) {
  if (kind == "attention") {
    auto m =
        std::make_shared<nn::MultiHeadAttention>(s.d, s.heads, nn::MultiHeadAttention::Options{.generator = g});
    return {m, [m](const Tensor& x) { return m->forward(x).out; }};
  }
  if (kind == "recurrent") {
    auto m = std::make_shared<Recurrent>(s.d, g);
    return {m, [m](const Tensor& x) { return m->forward(x); }};
  }
  int64_t dil = 1;
  if (kind == "conv-dilated")  // k^index, held below n: a larger dilation reads only padding
    for (int64_t l = 0; l < index && dil < s.n_max; ++l) dil *= s.k;
  auto m = std::make_shared<Conv>(s.d, s.k, dil, g);
  return {m, [m](const Tensor& x) { return m->forward(x); }};
}

// Forward FLOPs of one layer by the formula, in nn/summary.h's convention (2 per multiply-add,
// matrix products only; the pointwise ops add O(n d)):
//   attention   q, k, v and W^O: 4 projections of n d^2;  q k^T and p v: 2 n^2 d
//   recurrent   x W^T for every position and h U^T at every step: 2 n d^2
//   conv        one product (n, k d) x (k d, d): k n d^2
double formula_flops(const std::string& kind, int64_t B, int64_t n, const Shapes& s) {
  const double N = double(n), D = double(s.d), mult_adds = kind == "attention"   ? 4 * N * D * D + 2 * N * N * D
                                                           : kind == "recurrent" ? 2 * N * D * D
                                                                                 : double(s.k) * N * D * D;
  return 2 * double(B) * mult_adds;
}

// The longest chain of recorded ops behind y: how many ops must run one after another.
int64_t tape_depth(const Tensor& y) {
  if (!y.grad_fn()) return 0;
  std::unordered_map<const Node*, int64_t> depth;
  struct Frame {
    const Node* node;
    size_t next;
  };
  std::vector<Frame> stack{{y.grad_fn().get(), 0}};
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next < f.node->next.size()) {
      const Node* in = f.node->next[f.next++].node.get();
      if (in && !depth.count(in)) stack.push_back({in, 0});
      continue;
    }
    int64_t d = 0;
    for (const Edge& e : f.node->next)
      if (e.node) d = std::max(d, depth.at(e.node.get()));
    depth[f.node] = d + 1;
    stack.pop_back();
  }
  return depth.at(y.grad_fn().get());
}

const std::vector<std::string> kCostKinds = {"attention", "recurrent", "conv"};
const std::vector<std::string> kPathKinds = {"attention", "recurrent", "conv", "conv-dilated"};

// ---- cost: FLOPs, tape depth and time against n --------------------------------------------------

std::vector<json> measure_cost(const std::vector<int64_t>& ns, const Shapes& s, int reps) {
  std::vector<json> rows;
  fmt::print("cost of one layer, B {} d {} heads {} kernel {}, f32, {} threads; forward + backward time, median of {} "
             "alternating rounds\n",
             s.B, s.d, s.heads, s.k, num_threads(), reps);
  fmt::print("| {:>5} | {:<9} | {:>12} | {:>12} | {:>8} | {:>10} | {:>9} |\n", "n", "layer", "FLOPs", "formula",
             "ratio", "tape depth", "ms");
  fmt::print("|{:->7}|{:-<11}|{:->14}|{:->14}|{:->10}|{:->12}|{:->11}|\n", ":", "", ":", ":", ":", ":", ":");
  for (int64_t n : ns) {
    Generator g(0);
    std::map<std::string, Layer> layers;
    for (const auto& kind : kCostKinds) layers[kind] = make_layer(kind, s, 0, &g);
    Tensor x = randn({s.B, n, s.d}, DType::f32, &g).set_requires_grad(true);
    const Tensor grad_out = randn({s.B, n, s.d}, DType::f32, &g);
    std::map<std::string, json> row;
    for (const auto& kind : kCostKinds) {
      Layer& l = layers[kind];
      const nn::ModelSummary sum = nn::summarize(*l.module, [&] { return l.forward(x); }, s.B, n);
      const Tensor y = l.forward(x);
      row[kind] = {{"part", "cost"},     {"kind", kind},
                   {"n", n},             {"B", s.B},
                   {"d", s.d},           {"heads", s.heads},
                   {"kernel", s.k},      {"threads", num_threads()},
                   {"flops", sum.forward_flops()}, {"flops_formula", formula_flops(kind, s.B, n, s)},
                   {"tape_depth", tape_depth(y)}};
    }
    auto step = [&](const std::string& kind) {
      Layer& l = layers[kind];
      l.module->zero_grad();
      x.set_grad(Tensor());
      l.forward(x).backward(grad_out);
    };
    std::map<std::string, std::vector<double>> secs;
    for (const auto& kind : kCostKinds) step(kind);  // warm-up
    for (int r = 0; r < reps; ++r)
      for (size_t i = 0; i < kCostKinds.size(); ++i) {
        const std::string& kind = kCostKinds[(i + size_t(r)) % kCostKinds.size()];
        secs[kind].push_back(bench::seconds_of([&] { step(kind); }));
      }
    for (const auto& kind : kCostKinds) {
      json& j = row[kind];
      j["ms"] = bench::median(secs[kind]) * 1e3;
      j["reps"] = reps;
      const double flops = j["flops"].get<double>(), formula = j["flops_formula"].get<double>();
      fmt::print("| {:>5} | {:<9} | {:>12.4g} | {:>12.4g} | {:>8.4f} | {:>10} | {:>9.3f} |\n", n, kind, flops,
                 formula, flops / formula, j["tape_depth"].get<int64_t>(), j["ms"].get<double>());
      rows.push_back(j);
    }
    std::fflush(stdout);
  }
  return rows;
}

// ---- path: the fewest layers that connect input 0 to output n-1 ---------------------------------

// For a stack of layers of one kind over x (1, n, d): the first L at which d sum(y_L[n-1]) / d x_0
// is nonzero, with the earliest input position output n-1 reaches one layer before, the gradient's
// norm, and the tape depth of y_L.
json measure_path(const std::string& kind, int64_t n, const Shapes& s, int64_t max_layers) {
  Generator g(1);
  Tensor x = randn({1, n, s.d}, DType::f32, &g).set_requires_grad(true);
  std::vector<Layer> stack;
  Tensor y = x;
  int64_t reach_before = n - 1;  // output n-1 sees itself with no layer at all
  for (int64_t L = 1; L <= max_layers; ++L) {
    stack.push_back(make_layer(kind, s, L - 1, &g));
    y = stack.back().forward(y);
    x.set_grad(Tensor());
    sum(y.select(1, n - 1)).backward(Tensor(), /*retain_graph=*/true);
    const std::vector<float> dx = x.grad().to_vector<float>();  // (1, n, d), row-major
    int64_t reach = n;
    for (int64_t i = 0; i < n && reach == n; ++i)
      for (int64_t c = 0; c < s.d; ++c)
        if (dx[size_t(i * s.d + c)] != 0.0f) {
          reach = i;
          break;
        }
    if (reach == 0) {
      double norm = 0;
      for (int64_t c = 0; c < s.d; ++c) norm += double(dx[size_t(c)]) * double(dx[size_t(c)]);
      return {{"part", "path"},      {"kind", kind},           {"n", n},
              {"d", s.d},            {"kernel", s.k},          {"layers", L},
              {"reach_before", reach_before}, {"grad_x0_norm", std::sqrt(norm)}, {"tape_depth", tape_depth(y)}};
    }
    reach_before = reach;
  }
  return {{"part", "path"}, {"kind", kind}, {"n", n}, {"d", s.d}, {"kernel", s.k}, {"layers", nullptr},
          {"reach_before", reach_before}};
}

std::vector<json> measure_paths(const std::vector<int64_t>& ns, const Shapes& s) {
  std::vector<json> rows;
  fmt::print("\npath from input 0 to output n-1, d {} kernel {}, batch 1: the fewest stacked layers with "
             "d sum(y_(n-1)) / d x_0 != 0\n",
             s.d, s.k);
  fmt::print("| {:>5} | {:<12} | {:>6} | {:>26} | {:>12} | {:>10} |\n", "n", "layer", "layers",
             "earliest input, L-1 layers", "|grad x_0|", "tape depth");
  fmt::print("|{:->7}|{:-<14}|{:->8}|{:->28}|{:->14}|{:->12}|\n", ":", "", ":", ":", ":", ":");
  for (int64_t n : ns)
    for (const auto& kind : kPathKinds) {
      Shapes sn = s;
      sn.n_max = n;
      const json j = measure_path(kind, n, sn, n);
      if (j["layers"].is_null())
        fmt::print("| {:>5} | {:<12} | {:>6} | {:>26} | {:>12} | {:>10} |\n", n, kind, "none", "", "", "");
      else
        fmt::print("| {:>5} | {:<12} | {:>6} | {:>26} | {:>12.4g} | {:>10} |\n", n, kind, j["layers"].get<int64_t>(),
                   j["reach_before"].get<int64_t>(), j["grad_x0_norm"].get<double>(), j["tape_depth"].get<int64_t>());
      rows.push_back(j);
    }
  return rows;
}

// ---- the picture ---------------------------------------------------------------------------------

// Three log-log charts against n: the time of forward + backward, the forward FLOPs (counted, and
// the formula dashed), and the longest chain of ops of the stack that connects input 0 to output n-1.
std::string draw(const std::vector<json>& rows) {
  apps::LineChart time, flops, path;
  time.title = "forward + backward of one layer";
  time.y_label = "ms";
  flops.title = "forward FLOPs of one layer (dashed: formula)";
  flops.y_label = "FLOPs";
  path.title = "ops in a row from input 0 to output n-1";
  path.y_label = "longest chain on the tape";
  std::string caption = "Layers of width d.";
  for (apps::LineChart* c : {&time, &flops, &path}) {
    c->x_label = "sequence length n";
    c->log_x = c->log_y = true;
    c->width = 480;
    c->height = 420;
  }
  std::map<std::string, int> colour = {{"attention", 0}, {"recurrent", 1}, {"conv", 2}, {"conv-dilated", 3}};
  std::map<std::string, apps::Series> t, f, ff, p;
  for (const json& j : rows) {
    const std::string kind = j["kind"];
    const double n = j["n"].get<double>();
    if (!colour.count(kind)) continue;
    if (j["part"] == "cost") {
      if (caption == "Layers of width d.")
        caption = fmt::format("Layers of width d {} (attention: {} heads; conv: kernel {}), batch {}, f32, {} threads.",
                              j.value("d", 0), j.value("heads", 0), j.value("kernel", 0), j.value("B", 0),
                              j.value("threads", 0));
      for (auto* m : {&t, &f, &ff}) {
        auto& s = (*m)[kind];
        s.name = m == &ff ? kind + " (formula)" : kind;
        s.colour = colour[kind];
        s.dashed = m == &ff;
      }
      t[kind].x.push_back(n), t[kind].y.push_back(j.value("ms", NAN));
      f[kind].x.push_back(n), f[kind].y.push_back(j.value("flops", NAN));
      ff[kind].x.push_back(n), ff[kind].y.push_back(j.value("flops_formula", NAN));
    } else if (j["part"] == "path" && !j["layers"].is_null()) {
      auto& s = p[kind];
      s.name = kind, s.colour = colour[kind];
      s.x.push_back(n), s.y.push_back(j.value("tape_depth", NAN));
    }
  }
  for (const auto& [k, s] : t) time.series.push_back(s);
  for (const auto& [k, s] : f) flops.series.push_back(s), flops.series.push_back(ff[k]);
  for (const auto& [k, s] : p) path.series.push_back(s);
  return apps::svg_line_charts({time, flops, path}, 3, caption);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"attograd: self-attention, recurrent and convolution layers: cost, sequential ops and path length"};
  std::vector<int64_t> ns = {64, 128, 256, 512, 1024, 2048}, path_ns = {8, 16, 32, 64, 128};
  Shapes s{1, 64, 4, 3};
  int64_t path_d = 16;
  int reps = 5, threads = 0;
  std::string out_dir, plot_only, svg_path;
  cli.add_option("--n", ns, "sequence lengths of the cost tables")->delimiter(',')->check(apps::positive())
      ->capture_default_str();
  cli.add_option("--d", s.d, "width of every layer")->check(apps::positive())->capture_default_str();
  cli.add_option("--heads", s.heads, "attention heads (divides --d)")->check(apps::positive())->capture_default_str();
  cli.add_option("--batch", s.B, "sequences per forward (cost tables)")->check(apps::positive())->capture_default_str();
  cli.add_option("--kernel", s.k, "the convolution's kernel size k, at least 2")->check(CLI::Range(2, 64))
      ->capture_default_str();
  cli.add_option("--reps", reps, "timed rounds (median reported)")->check(apps::positive())->capture_default_str();
  cli.add_option("--path-n", path_ns, "sequence lengths of the path table (each at least 2)")->delimiter(',')
      ->check(CLI::Range(int64_t(2), int64_t(4096)))
      ->capture_default_str();
  cli.add_option("--path-d", path_d, "width of the layers of the path table")->check(apps::positive())
      ->capture_default_str();
  cli.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS, else the cores)")->check(apps::positive());
  cli.add_option("--out", out_dir, "write DIR/why-attention.jsonl and DIR/why-attention.svg");
  cli.add_option("--plot-only", plot_only, "draw the SVG (--svg) from this JSONL file, measuring nothing");
  cli.add_option("--svg", svg_path, "with --plot-only: where the SVG goes");
  if (const int rc = apps::parse_command_line(cli, argc, argv, "bench_why_attention"); rc >= 0) return rc;
  const auto usage = [](const std::string& msg) {
    fmt::print(stderr, "bench_why_attention: {}\n", msg);
    return 2;
  };
  if (s.d % s.heads != 0) return usage(fmt::format("--heads {} does not divide --d {}", s.heads, s.d));
  if (const int rc = bench::plot_only("bench_why_attention", plot_only, svg_path, {"part", "kind", "n"}, draw); rc >= 0)
    return rc;
  std::ofstream jsonl;
  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    jsonl.open(out_dir + "/why-attention.jsonl");
    if (!jsonl) return usage(fmt::format("--out: cannot write {}/why-attention.jsonl", out_dir));
  }
  if (threads > 0) set_num_threads(threads);

  std::vector<json> rows = measure_cost(ns, s, reps);
  Shapes ps = s;
  ps.d = path_d;
  ps.heads = path_d % s.heads == 0 ? s.heads : 1;
  ps.B = 1;
  for (json& j : measure_paths(path_ns, ps)) rows.push_back(std::move(j));
  if (jsonl.is_open()) {
    for (const json& j : rows) jsonl << j.dump() << "\n";
    jsonl.close();
    apps::write_file_atomic(out_dir + "/why-attention.svg", draw(rows));
    fmt::print("\nwrote {0}/why-attention.jsonl and {0}/why-attention.svg\n", out_dir);
  }
  return 0;
}
