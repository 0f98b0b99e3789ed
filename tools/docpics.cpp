// docpics: draws the pictures of docs/math that the library computes exactly, as SVG in docs/img/.
//
//   docpics [--root DIR] [--check]
//
//   masks.svg        which keys each query sees under every mask of scaled_dot_product_attention
//                    (causal, key padding, window, causal + padding, and the block-sparse patterns of
//                    nn/sparse_patterns.h), read from the kernel's own weights: with all scores equal,
//                    a visible key gets 1 / (number of visible keys) and a hidden one exactly 0
//   positional.svg   the sinusoidal encoding PE (positions x dimensions) and PE PE^T, the dot product
//                    of two positions' encodings, which depends only on their offset
//   tape.svg         the tape of one attention head and its loss after backward, drawn with
//                    apps::svg_tape (tape.dot: the same graph for Graphviz, from graph_to_dot)
//
// The other pictures of the docs come from programs that train or measure (scaling.svg from
// build/walkthrough, the attention heatmaps from the apps); `make docs` runs those too.
//
// --check writes nothing: it draws every picture and compares it with the file in docs/img/,
// exits 1 naming each one that differs or is missing (the CTest "docs: pictures of docs/img are
// up to date"), 0 when all match. DIR defaults to the source tree this binary was configured from.
#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "data/text.h"
#include "nn/positional.h"
#include "nn/sparse_patterns.h"

#ifndef ATTOGRAD_SOURCE_DIR
#define ATTOGRAD_SOURCE_DIR "."
#endif

using namespace ag;

namespace {

constexpr int64_t kT = 16;  // the tokens of the mask pictures

// Which keys each query sees: 1 visible, 0 hidden, read from the weights of
// scaled_dot_product_attention with all scores equal (q = k = 0).
apps::Heatmap visibility(const std::string& title, SdpaOptions opt) {
  const Tensor q = zeros({1, 1, kT, 4}, DType::f64), v = zeros({1, 1, kT, 4}, DType::f64);
  opt.return_weights = true;
  const Tensor P = scaled_dot_product_attention(q, q, v, opt).weights.reshape({kT, kT});
  apps::Heatmap h = apps::heatmap_from_tensor(P, title);
  for (double& x : h.values) x = x > 0 ? 1.0 : 0.0;
  return h;
}

std::string masks_svg() {
  std::vector<apps::Heatmap> panels;
  SdpaOptions causal;
  causal.causal = true;
  panels.push_back(visibility("causal", causal));
  SdpaOptions padding;
  padding.key_padding_lengths = from_vector(std::vector<int64_t>{11}, {1});
  panels.push_back(visibility("key padding: 11 valid keys", padding));
  SdpaOptions both = causal;
  both.key_padding_lengths = padding.key_padding_lengths;
  panels.push_back(visibility("causal + padding", both));
  SdpaOptions window;
  window.window = 2;
  panels.push_back(visibility("window 2", window));
  SdpaOptions causal_window = causal;
  causal_window.window = 2;
  panels.push_back(visibility("causal window 2", causal_window));
  SdpaOptions local;
  local.block_mask = nn::local_global_block_mask(kT, 2, 1, 1);
  local.block_size = 2;
  panels.push_back(visibility("local+global (bs 2, w 1, g 1)", local));
  SdpaOptions strided;
  strided.block_mask = nn::strided_block_mask(kT, 2, 3);
  strided.block_size = 2;
  panels.push_back(visibility("strided (bs 2, s 3)", strided));
  SdpaOptions strided_causal = strided;
  strided_causal.causal = true;
  panels.push_back(visibility("strided + causal", strided_causal));
  apps::HeatmapOptions ho;
  ho.title = "key j (column) visible to query i (row): yellow = seen, purple = hidden";
  ho.columns = 4;
  ho.cell = 11;
  return apps::svg_heatmaps(panels, ho);
}

std::string positional_svg() {
  const int64_t T = 32, d = 32;
  const Tensor pe = nn::sinusoidal_positions(T, d, DType::f64);
  std::vector<apps::Heatmap> panels;
  panels.push_back(apps::heatmap_from_tensor(pe, "PE[pos, i]"));
  // PE_p . PE_q = sum over the d/2 frequencies of cos(w (p - q)), d/2 at p = q: the cosine similarity
  panels.push_back(apps::heatmap_from_tensor(mul(matmul(pe, pe.mT()), 2.0 / double(d)), "cos(PE_p, PE_q)"));
  // Rounded to 1e-9, so that the last bits of sin, cos and the dot products (which may differ
  // between builds, e.g. Release and the sanitizers' Debug) never change the file: a value that
  // should be 0 is 0, not +-1e-17.
  for (apps::Heatmap& h : panels)
    for (double& v : h.values) v = std::round(v * 1e9) / 1e9 + 0.0;
  apps::HeatmapOptions ho;
  ho.title = "sinusoids, T = d = 32: position x dimension, position x position";
  ho.vmin = -1, ho.vmax = 1;  // both panels lie in [-1, 1]
  ho.columns = 2;
  ho.cell = 7;
  return apps::svg_heatmaps(panels, ho);
}

// One attention head and a squared-error loss, composed from ops so that every step is a node.
struct TapeExample {
  Tensor x, Wq, Wk, Wv, y, L;
  LeafNames names;
};
TapeExample tape_example() {
  Generator gen(7);
  TapeExample e;
  e.x = randn({3, 4}, DType::f64, &gen).set_requires_grad(true);
  e.Wq = randn({4, 4}, DType::f64, &gen).set_requires_grad(true);
  e.Wk = randn({4, 4}, DType::f64, &gen).set_requires_grad(true);
  e.Wv = randn({4, 4}, DType::f64, &gen).set_requires_grad(true);
  e.y = randn({3, 4}, DType::f64, &gen);
  const Tensor q = matmul(e.x, e.Wq), k = matmul(e.x, e.Wk), v = matmul(e.x, e.Wv);
  const Tensor P = softmax(mul(matmul(q, k.mT()), 0.5), -1);
  e.L = mean(pow(sub(matmul(P, v), e.y), 2.0));
  e.names = {{"x", e.x}, {"Wq", e.Wq}, {"Wk", e.Wk}, {"Wv", e.Wv}};
  TrackGradNormsGuard track;
  e.L.backward();
  return e;
}

struct Picture {
  std::string file, text;
};
std::vector<Picture> draw_all() {
  const TapeExample e = tape_example();
  return {{"masks.svg", masks_svg()},
          {"positional.svg", positional_svg()},
          {"tape.svg", apps::svg_tape(e.L, e.names,
                                      "L = mean((softmax(0.5 (x Wq)(x Wk)^T) (x Wv) - y)^2) after backward")},
          {"tape.dot", graph_to_dot(e.L, e.names)}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Draws the exact pictures of docs/math into docs/img/ (or checks that they are current)."};
  std::string root = ATTOGRAD_SOURCE_DIR;
  bool check_only = false;
  app.add_option("--root", root, "the source tree")->capture_default_str();
  app.add_flag("--check", check_only, "write nothing; exit 1 when a picture in docs/img/ differs");
  if (const int rc = apps::parse_command_line(app, argc, argv, "docpics"); rc >= 0) return rc;
  try {
    const std::filesystem::path dir = std::filesystem::path(root) / "docs" / "img";
    int stale = 0;
    for (const Picture& p : draw_all()) {
      const std::filesystem::path path = dir / p.file;
      if (check_only) {
        if (!std::filesystem::exists(path) || data::read_file_bytes(path.string()) != p.text)
          ++stale, fmt::print(stderr, "docpics: docs/img/{} is out of date or missing; run `make docs`\n", p.file);
        continue;
      }
      std::filesystem::create_directories(dir);
      apps::write_file_atomic(path.string(), p.text);
      fmt::print("wrote docs/img/{}\n", p.file);
    }
    return stale ? 1 : 0;
  } catch (const std::exception& ex) {
    fmt::print(stderr, "docpics: {}\n", ex.what());
    return 1;
  }
}
