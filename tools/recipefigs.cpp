// recipefigs: the figures of docs/math/vit-patches.md and docs/math/text-classification.md, as
// SVG in docs/img/. Nothing is trained here: the measured figures are drawn from the committed
// runs in docs/results/, and the padding figure from the library's own attention and autograd.
//
//   recipefigs [--root DIR] [--check] [--padding-report]
//
//   vit-patches.svg      vit against its patch size P: test accuracy, milliseconds per training
//                        step and forward FLOPs per image, over the tokens N = (28/P)^2 + 1
//                        (under kVitRuns: p<P>/ the training runs, timing/p<P>-r<R>/ the
//                        step-time runs); beside the FLOPs, the formula's two parts
//   textclf-padding.svg  a batch of three texts padded to T = 6: the key padding mask, one head's
//                        attention weights for the shortest text (padded keys get exactly 0), and
//                        the pooling weights d pooled_b / d h_bt = m_bt / len_b read from backward
//   textclf-size.svg     textclf's test accuracy against the labelled texts, for the encoder alone,
//                        the encoder with the bag path and the character n-gram naive Bayes
//                        (under kTextRuns: n<N>-<on|off>-s<S>/)
//
// --padding-report prints what the key padding mask and the masked mean do to a small, randomly
// initialised TextClassifier: how far each text's logits in a padded batch lie from its logits
// alone, and the largest gradient reaching a padded position, with both, one or neither.
// --check writes nothing: it draws every figure and compares it with the file in docs/img/, exits 1
// naming each one that differs or is missing, 0 when all match. DIR defaults to the source tree
// this binary was configured from.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "apps/textclf/model.h"
#include "attograd.h"
#include "data/text.h"
#include "tools/docpics/pictures.h"

#ifndef ATTOGRAD_SOURCE_DIR
#define ATTOGRAD_SOURCE_DIR "."
#endif

using namespace ag;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The committed runs the figures are drawn from (their command.txt says how each was made).
constexpr const char* kVitRuns = "docs/results/vit-patches-2026-12-07";
constexpr const char* kTextRuns = "docs/results/textclf-recipe-2026-12-07";
const double kNaN = std::numeric_limits<double>::quiet_NaN();

json read_json(const fs::path& path) {
  try {
    return json::parse(data::read_file_bytes(path.string()));
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return kNaN;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

// ---- vit-patches.svg -------------------------------------------------------------------------

// Forward FLOPs per image of apps/vit's model, from its matrix products (2 FLOPs a multiply-add):
// the patch projection, per block qkv, output projection and MLP (linear in N) and the two
// attention products Q K^T and P V (quadratic in N), then the head.
struct VitFlops {
  double linear = 0, attention = 0;
};
VitFlops vit_flops(const json& cfg) {
  const double S = cfg.at("image_size"), C = cfg.at("channels"), P = cfg.at("patch"), d = cfg.at("d_model"),
               L = cfg.at("n_layers"), m = cfg.at("mlp_hidden"), K = cfg.at("classes");
  const double patches = (S / P) * (S / P), N = patches + 1;
  VitFlops f;
  f.linear = 2 * patches * C * P * P * d + L * N * 2 * (4 * d * d + 2 * d * m) + 2 * d * K;
  f.attention = L * 4 * N * N * d;
  return f;
}

std::string vit_patches_svg(const fs::path& root) {
  const fs::path dir = root / kVitRuns;
  const std::vector<int> patches = {28, 14, 7, 4, 2};
  apps::LineChart acc, time, flops;
  acc.title = "test accuracy (best model by validation)";
  acc.x_label = "tokens N = (28/P)^2 + 1";
  acc.y_label = "test accuracy (%)";
  time.title = "training step, batch 128, 1 thread";
  time.x_label = acc.x_label;
  time.y_label = "ms per step";
  time.log_y = true;
  flops.title = "forward FLOPs per image";
  flops.x_label = acc.x_label;
  flops.y_label = "MFLOPs";
  flops.log_y = true;
  for (apps::LineChart* c : {&acc, &time, &flops}) {
    c->log_x = true;
    c->x_ticks = {2, 5, 17, 50, 197};
    c->width = 420;
    c->height = 340;
  }
  apps::Series acc_s{"2000 steps, seed 1", {}, {}, 0};
  apps::Series acc_s2{"2000 steps, seed 2", {}, {}, 0, true};
  apps::Series acc_long{"6000 steps (default), seed 1", {}, {}, 1};
  apps::Series time_s{"measured, median of 3 rounds", {}, {}, 0};
  apps::Series time_pred{"P = 7's time x FLOPs ratio", {}, {}, 0, true};
  apps::Series fl_meas{"measured (the report)", {}, {}, 0};
  apps::Series fl_lin{"linear parts (formula)", {}, {}, 1, true};
  apps::Series fl_att{"attention 4 N^2 d (formula)", {}, {}, 2, true};
  double t7 = kNaN, f7 = kNaN;
  struct Point {
    double N, ms, flops;
  };
  std::vector<Point> points;
  for (int P : patches) {
    const double N = (28.0 / P) * (28.0 / P) + 1;
    const std::vector<std::pair<apps::Series*, std::string>> accuracy_runs = {
        {&acc_s, ""}, {&acc_s2, "-s2"}, {&acc_long, "-6000"}};
    for (const auto& [series, name] : accuracy_runs) {
      const fs::path run = dir / fmt::format("p{}{}", P, name) / "report.json";
      if (!fs::exists(run)) continue;
      series->x.push_back(N);
      series->y.push_back(100.0 * read_json(run).at("accuracy").get<double>());
    }
    std::vector<double> ms;
    double fwd = kNaN;
    json cfg;
    for (int k = 1; fs::exists(dir / "timing" / fmt::format("p{}-r{}", P, k) / "report.json"); ++k) {
      const json r = read_json(dir / "timing" / fmt::format("p{}-r{}", P, k) / "report.json");
      ms.push_back(1000.0 * r.at("train_seconds").get<double>() / r.at("steps").get<double>());
      fwd = r.at("forward_flops_per_sample").get<double>();
      cfg = r.at("config");
    }
    if (ms.empty()) continue;
    points.push_back({N, median(ms), fwd});
    if (P == 7) t7 = median(ms), f7 = fwd;
    const VitFlops f = vit_flops(cfg);
    fl_meas.x.push_back(N), fl_meas.y.push_back(fwd / 1e6);
    fl_lin.x.push_back(N), fl_lin.y.push_back(f.linear / 1e6);
    fl_att.x.push_back(N), fl_att.y.push_back(f.attention / 1e6);
  }
  check(!points.empty(), "recipefigs: no timing runs under {}", dir.string());
  for (const Point& p : points) {
    time_s.x.push_back(p.N), time_s.y.push_back(p.ms);
    time_pred.x.push_back(p.N), time_pred.y.push_back(t7 * p.flops / f7);
  }
  time_pred.colour = 1;
  acc.series = {acc_s, acc_s2, acc_long};
  time.series = {time_s, time_pred};
  flops.series = {fl_meas, fl_lin, fl_att};
  return apps::svg_line_charts({acc, time, flops}, 3);
}

// ---- textclf-size.svg ------------------------------------------------------------------------

std::string textclf_size_svg(const fs::path& root) {
  const fs::path dir = root / kTextRuns;
  apps::LineChart c;
  c.x_label = "labelled texts (90% train, 10% validation)";
  c.y_label = "test accuracy (%)";
  c.log_x = true;
  c.x_ticks = {250, 500, 1000, 2000};
  c.width = 640;
  c.height = 380;
  apps::Series nb{"naive Bayes (char 1-5-grams)", {}, {}, 2, true};
  apps::Series on{"encoder + bag path", {}, {}, 0};
  apps::Series off{"encoder alone", {}, {}, 1};
  size_t seeds = 0;
  for (int n : {250, 500, 1000, 2000}) {
    std::vector<double> a_on, a_off, a_nb;
    for (int s = 1; s <= 9; ++s) {
      for (const char* path : {"on", "off"}) {
        const fs::path p = dir / fmt::format("n{}-{}-s{}", n, path, s) / "report.json";
        if (!fs::exists(p)) continue;
        const json r = read_json(p);
        (std::string(path) == "on" ? a_on : a_off).push_back(100.0 * r.at("accuracy").get<double>());
        a_nb.push_back(100.0 * r.at("baseline_nb_test_accuracy").get<double>());
      }
    }
    if (a_nb.empty()) continue;
    seeds = std::max(seeds, std::max(a_on.size(), a_off.size()));
    nb.x.push_back(n), nb.y.push_back(mean(a_nb));
    on.x.push_back(n), on.y.push_back(mean(a_on));
    off.x.push_back(n), off.y.push_back(mean(a_off));
  }
  check(!nb.x.empty(), "recipefigs: no textclf runs under {}", dir.string());
  c.title = fmt::format("computers vs people: test accuracy on 302 texts, mean of {} seeds", seeds);
  c.series = {on, off, nb};
  return apps::svg_line_chart(c);
}

// ---- textclf-padding.svg and --padding-report ------------------------------------------------

// Three texts of `kLens` tokens padded to kT: the batch of the padding figure and report.
constexpr int64_t kT = 6;
const std::vector<int64_t> kLens = {6, 3, 4};

// 1 where t < len_b, else 0: (B, T) f64
Tensor valid_mask(const std::vector<int64_t>& lens, int64_t T) {
  std::vector<double> m;
  for (int64_t len : lens)
    for (int64_t t = 0; t < T; ++t) m.push_back(t < len ? 1.0 : 0.0);
  return from_vector(m, {int64_t(lens.size()), T});
}

std::vector<std::string> position_labels(int64_t T) {
  std::vector<std::string> l;
  for (int64_t t = 0; t < T; ++t) l.push_back(fmt::format("t={}", t));
  return l;
}

std::vector<std::string> text_labels() {
  std::vector<std::string> l;
  for (size_t b = 0; b < kLens.size(); ++b) l.push_back(fmt::format("text {} (len {})", b, kLens[b]));
  return l;
}

// Values rounded to 1e-9, so that the last bits of exp and the products (which may differ between
// builds and machines) never change the file.
apps::Heatmap rounded(apps::Heatmap h) {
  for (double& v : h.values) v = std::round(v * 1e9) / 1e9 + 0.0;
  return h;
}

std::string textclf_padding_svg() {
  const auto B = int64_t(kLens.size());
  const Tensor lens = from_vector(kLens, {B});
  // 1. the key padding mask m_bt
  apps::Heatmap mask = apps::heatmap_from_tensor(valid_mask(kLens, kT), "mask m: 1 real, 0 padding",
                                                 text_labels(), position_labels(kT));
  // 2. one head's weights for text 1, with the mask: P = softmax(q k^T / sqrt(dk) + (-inf on padded keys))
  Generator gen(3);
  const Tensor q = randn({B, 1, kT, 4}, DType::f64, &gen), k = randn({B, 1, kT, 4}, DType::f64, &gen),
               v = randn({B, 1, kT, 4}, DType::f64, &gen);
  SdpaOptions o;
  o.key_padding_lengths = lens;
  o.return_weights = true;
  const Tensor P = scaled_dot_product_attention(q, k, v, o).weights;  // (B, 1, T, T)
  std::vector<std::string> queries, keys;
  for (int64_t t = 0; t < kT; ++t) {
    queries.push_back(fmt::format("q{}{}", t, t < kLens[1] ? "" : " pad"));
    keys.push_back(fmt::format("k{}{}", t, t < kLens[1] ? "" : " pad"));
  }
  apps::Heatmap weights = apps::heatmap_from_tensor(P.select(0, 1).select(0, 0),
                                                    "text 1: attention weights", queries, keys);
  // 3. the pooling weights: the gradient of pooled_b = sum_t m_bt h_bt / sum_t m_bt with respect to
  // h_bt, read from backward (one feature, d = 1, so d pooled_b / d h_bt is a number)
  const Tensor h = randn({B, kT}, DType::f64, &gen).set_requires_grad(true);
  const Tensor m = valid_mask(kLens, kT);
  const Tensor pooled = sum(mul(h, m), {1}) / sum(m, {1});  // (B)
  sum(pooled).backward();
  apps::Heatmap pool = apps::heatmap_from_tensor(h.grad(), "d pooled / d h = m / len",
                                                 text_labels(), position_labels(kT));
  apps::HeatmapOptions ho;
  ho.title = "three texts padded to T = 6: the mask, one head's weights for text 1, the pooling weights";
  ho.columns = 3;
  ho.cell = 30;
  ho.max_label = 16;
  ho.vmin = 0, ho.vmax = 1;
  return apps::svg_heatmaps({rounded(mask), rounded(weights), rounded(pool)}, ho);
}

// The classifier's forward written out as apps/textclf/model.cpp has it, with the key padding
// mask and the masked mean each switchable; both on is TextClassifier::forward (padding_report
// checks that they agree exactly). docs/math/text-classification.md quotes it.
// snippet-begin: classify
Tensor classify(apps::TextClassifier& model, const Tensor& e, const Tensor& lens, bool key_mask, bool masked_mean) {
  const int64_t T = e.size(1);
  Tensor h = e + model.pos->forward(T);
  nn::AttentionOptions o;
  if (key_mask) o.key_padding_lengths = lens;
  for (const auto& block : *model.blocks) h = block->forward(h, o);
  Tensor n = model.norm->forward(h);
  Tensor pooled;
  if (masked_mean) {
    const Tensor valid = lt(arange(0, double(T), 1, DType::i64).reshape({1, T}), lens.reshape({-1, 1}))
                             .to(DType::f32)
                             .unsqueeze(2);
    pooled = sum(n * valid, {1}) / lens.to(DType::f32).reshape({-1, 1});
  } else {
    pooled = mean(n, {1});
  }
  return model.head->forward(pooled);
}
// snippet-end: classify

int padding_report() {
  apps::TextClassifierConfig c;
  c.vocab = 20, c.max_len = 8, c.classes = 2, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 32;
  c.dropout = 0;
  Generator gen(1);
  apps::TextClassifier model(c, &gen);
  model.eval();
  const auto B = int64_t(kLens.size());
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < kT; ++t) ids.push_back(t < kLens[size_t(b)] ? 2 + (7 * b + 3 * t) % 18 : 0);
  const Tensor tokens = from_vector(ids, {B, kT}), lens = from_vector(kLens, {B});
  {  // the written-out forward is the model's own
    NoGradGuard no_grad;
    const double diff = max(abs(model.forward(tokens, lens) -
                                classify(model, model.tok->forward(tokens), lens, true, true)))
                            .item<double>();
    check(diff == 0, "recipefigs: the written-out forward differs from TextClassifier::forward by {}", diff);
  }
  double scale = 0;  // the size of the logits themselves, for scale
  for (int64_t b = 0; b < B; ++b) {
    NoGradGuard no_grad;
    const Tensor alone = model.forward(tokens.narrow(0, b, 1).narrow(1, 0, kLens[size_t(b)]), lens.narrow(0, b, 1));
    scale = std::max(scale, max(abs(alone)).item<double>());
  }
  fmt::print("TextClassifier d 16, 2 heads, 2 layers, seed 1, eval mode; texts of {} tokens padded to T = {}; "
             "the largest logit of a text alone, in absolute value: {:.3g}; L = the sum of the batch's logits\n",
             fmt::format("{}, {} and {}", kLens[0], kLens[1], kLens[2]), kT, scale);
  fmt::print("| key padding mask | masked mean | largest logit change, batch against alone | largest dL/de at a padded position |\n");
  fmt::print("| --- | --- | --- | --- |\n");
  for (const bool key_mask : {true, false})
    for (const bool masked_mean : {true, false}) {
      // each text alone, at its own length: nothing to mask
      double diff = 0;
      const Tensor e = model.tok->forward(tokens).detach().set_requires_grad(true);  // (B, T, d)
      const Tensor batch = classify(model, e, lens, key_mask, masked_mean);       // (B, K)
      for (int64_t b = 0; b < B; ++b) {
        NoGradGuard no_grad;
        const int64_t len = kLens[size_t(b)];
        const Tensor alone = classify(model, model.tok->forward(tokens.narrow(0, b, 1).narrow(1, 0, len)),
                                      lens.narrow(0, b, 1), false, false);
        diff = std::max(diff, max(abs(alone - batch.narrow(0, b, 1))).item<double>());
      }
      sum(batch).backward();
      const Tensor padded = sub(1.0, valid_mask(kLens, kT).to(DType::f32)).unsqueeze(2);  // (B, T, 1)
      const double grad = max(abs(e.grad() * padded)).item<double>();
      fmt::print("| {} | {} | {:.3g} | {:.3g} |\n", key_mask ? "yes" : "no", masked_mean ? "yes" : "no", diff, grad);
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Draws the figures of docs/math/vit-patches.md and text-classification.md into docs/img/."};
  std::string root = ATTOGRAD_SOURCE_DIR;
  bool check_only = false, report = false;
  app.add_option("--root", root, "the source tree")->capture_default_str();
  app.add_flag("--check", check_only, "write nothing; exit 1 when a figure in docs/img/ differs");
  app.add_flag("--padding-report", report, "print the padding mask and masked mean measurements, draw nothing");
  if (const int rc = apps::parse_command_line(app, argc, argv, "recipefigs"); rc >= 0) return rc;
  try {
    if (report) return padding_report();
    return docs::write_or_check("recipefigs", root,
                                {{"vit-patches.svg", vit_patches_svg(root)},
                                 {"textclf-padding.svg", textclf_padding_svg()},
                                 {"textclf-size.svg", textclf_size_svg(root)}},
                                check_only);
  } catch (const std::exception& ex) {
    fmt::print(stderr, "recipefigs: {}\n", ex.what());
    return 1;
  }
}
