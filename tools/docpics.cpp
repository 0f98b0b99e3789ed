// docpics: draws the pictures of docs/math that the library computes exactly, and the schematic
// diagrams beside them, as SVG in docs/img/.
//
//   docpics [--root DIR] [--check]
//
//   masks.svg          which keys each query sees under every mask of scaled_dot_product_attention
//                      (causal, key padding, window, causal + padding, causal over a KV cache, and the
//                      block-sparse patterns of nn/sparse_patterns.h), read from the kernel's own
//                      weights: with all scores equal, a visible key gets 1 / (number of visible
//                      keys) and a hidden one exactly 0; query (row) and key (column) indices on
//                      every panel
//   positional.svg     the sinusoidal encoding PE (positions x dimensions) and PE PE^T, the dot product
//                      of two positions' encodings, which depends only on their offset
//   tape.svg           the tape of one attention head and its loss after backward, drawn with
//                      apps::svg_tape (tape.dot: the same graph for Graphviz, from graph_to_dot)
// The schematics (tools/docpics/schematics.h), drawn by hand but fed what the library does:
//   qkv.svg            one head's data flow, X -> Q, K, V -> S -> mask, softmax -> P -> O, with shapes
//   heads.svg          the fused qkv projection viewed as H heads, their attention, concat, W^O
//   online-softmax.svg the fused forward's query tile against its key tiles, with the running max,
//                      sum and rescale; the tile sizes read from core/cpu/attention.cpp (kBq, kBk)
//   kv-cache.svg       decoding steps side by side, the cache growing by one key and value each
//   linformer.svg      K and V projected along the sequence by E, F (r x T); the T x r scores
//   compressed.svg     memory-compressed attention's blocks, with the causal visibility read from
//                      nn::MemoryCompressedAttention's weights and local blocks from the fused op
//   axial.svg          a grid of tokens, rows then columns, and a query's reach read from the
//                      gradients of nn::AxialAttention (full and causal)
//   sparse.svg         the block masks of nn/sparse_patterns.h as block grids, from its functions
//                      (the causal ones from the fused op's weights)
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
#include <regex>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "data/text.h"
#include "nn/efficient_attention.h"
#include "nn/positional.h"
#include "nn/sparse_patterns.h"
#include "tools/docpics/pictures.h"
#include "tools/docpics/schematics.h"

#ifndef ATTOGRAD_SOURCE_DIR
#define ATTOGRAD_SOURCE_DIR "."
#endif

using namespace ag;

namespace {

constexpr int64_t kT = 16;  // the tokens of the mask pictures

std::vector<std::string> indices(int64_t n) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

// Which of T keys each of Tq queries (T by default) sees: 1 visible, 0 hidden, read from the
// weights of scaled_dot_product_attention with all scores equal (q = k = 0); rows and columns
// numbered.
apps::Heatmap visibility(const std::string& title, SdpaOptions opt, int64_t T = kT, int64_t Tq = -1) {
  if (Tq < 0) Tq = T;
  const Tensor q = zeros({1, 1, Tq, 4}, DType::f64), k = zeros({1, 1, T, 4}, DType::f64);
  opt.return_weights = true;
  const Tensor P = scaled_dot_product_attention(q, k, k, opt).weights.reshape({Tq, T});
  apps::Heatmap h = apps::heatmap_from_tensor(P, title, indices(Tq), indices(T));
  for (double& x : h.values) x = x > 0 ? 1.0 : 0.0;
  return h;
}

docpics::Cells cells(const std::string& title, int rows, int cols, const std::vector<double>& values) {
  docpics::Cells c;
  c.title = title, c.rows = rows, c.cols = cols;
  for (const double x : values) c.on.push_back(x != 0 ? 1 : 0);
  return c;
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
  panels.push_back(visibility("causal, 4 queries after 12 cached keys", causal, kT, 4));
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
  ho.columns = 3;  // three rows of three: the masks, the windows and the cache, the block patterns
  ho.cell = 14;    // indices of 9 px
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

// ---- what the schematics show of the library ----------------------------------------------

// A constant `constexpr int64_t NAME = VALUE;` of a source file, so that the picture of the fused
// kernel follows its tile sizes (and --check fails when they change).
int64_t source_constant(const std::filesystem::path& file, const std::string& name) {
  const std::string text = data::read_file_bytes(file.string());
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("constexpr int64_t " + name + " = ([0-9]+);")))
    throw std::runtime_error(fmt::format("no `constexpr int64_t {} = N;` in {}", name, file.string()));
  return std::stoll(m[1].str());
}

// Memory-compressed attention over T positions in blocks of s: which block each query sees under
// the causal mask, read from the layer's weights (a hidden block gets exactly 0); and the paper's
// local attention in blocks of s (a diagonal block mask with causal), read from the fused op.
std::string compressed_svg() {
  const int64_t T = 12, s = 3;
  Generator gen(3);
  nn::MemoryCompressedAttention layer(8, 1, s, {.dtype = DType::f64, .generator = &gen});
  nn::AttentionOptions opt;
  opt.causal = true, opt.need_weights = true;
  const Tensor w = layer.forward(randn({1, T, 8}, DType::f64, &gen), opt).weights;  // (1, 1, T, Tc)
  const int Tc = int(w.size(3));
  SdpaOptions local;
  local.causal = true;
  local.block_mask = nn::local_global_block_mask(T, s, 0, 0);
  local.block_size = s;
  return docpics::compressed_svg(int(T), int(s),
                                 cells("causal, T × T_{c}\nfrom the layer", int(T), Tc, w.reshape({T, Tc}).to_vector<double>()),
                                 cells("local attention in\nblocks of s, causal", int(T), int(T),
                                       visibility("", local, T).values));
}

// Axial attention on a rows x cols grid: the tokens output (qr, qc) depends on, read from the
// gradients of the layer (a token out of reach gets an exactly zero gradient).
docpics::Cells axial_reach(const std::string& title, int64_t rows, int64_t cols, int64_t q, bool causal) {
  Generator gen(5);
  nn::AxialAttention layer(8, 2, rows, cols, {.causal = causal, .dtype = DType::f64, .generator = &gen});
  const Tensor x = randn({1, rows * cols, 8}, DType::f64, &gen).set_requires_grad(true);
  sum(select(layer.forward(x), 1, q)).backward();
  const std::vector<double> g = sum(abs(x.grad()), {2}).reshape({rows * cols}).to_vector<double>();
  return cells(title, int(rows), int(cols), g);
}
std::string axial_svg() {
  const int64_t rows = 4, cols = 6, qr = 2, qc = 3;
  return docpics::axial_svg(int(rows), int(cols), int(qr), int(qc),
                            axial_reach("3. reach after both:\nthe whole grid", rows, cols, qr * cols + qc, false),
                            axial_reach("4. causal: reach after\nboth, r' ≤ r, c' ≤ c", rows, cols, qr * cols + qc, true));
}

// The block masks of nn/sparse_patterns.h over n = 16 blocks of bs = 4; with causal, the blocks
// in which the fused op gives some query a nonzero weight.
docpics::Cells block_cells(const std::string& title, const Tensor& mask) {
  const int n = int(mask.size(0));
  return cells(title, n, n, mask.to(DType::f64).to_vector<double>());
}
docpics::Cells causal_blocks(const std::string& title, const Tensor& mask, int64_t bs) {
  const int64_t n = mask.size(0), T = n * bs;
  SdpaOptions opt;
  opt.causal = true, opt.block_mask = mask, opt.block_size = bs;
  const apps::Heatmap seen = visibility("", opt, T);
  std::vector<double> blocks(size_t(n * n), 0.0);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j)
      if (seen.values[size_t(i * T + j)] > 0) blocks[size_t((i / bs) * n + j / bs)] = 1;
  return cells(title, int(n), int(n), blocks);
}
std::string sparse_svg() {
  const int64_t n = 16, bs = 4, T = n * bs;
  const Tensor lg = nn::local_global_block_mask(T, bs, 1, 1), st = nn::strided_block_mask(T, bs, 4);
  return docpics::sparse_svg(
      {block_cells("local_global_block_mask(T, bs, 1, 1)\nband of w = 1 block each side, g = 1 global", lg),
       causal_blocks("the same with causal\n(blocks c ≤ a: the autoregressive form)", lg, bs),
       block_cells("strided_block_mask(T, bs, 4)\n|a − c| < 4, or (a − c) mod 4 = 0", st),
       causal_blocks("the same with causal\n(blocks c ≤ a)", st, bs)},
      "n = 16 blocks (T = 16 bs). Green: kept, computed in blocks of bs × bs scores; grey: skipped by the kernels.");
}

using docs::Picture;
std::vector<Picture> draw_all(const std::filesystem::path& root) {
  const TapeExample e = tape_example();
  const std::filesystem::path kernel = root / "core" / "cpu" / "attention.cpp";
  return {{"masks.svg", masks_svg()},
          {"positional.svg", positional_svg()},
          {"tape.svg", apps::svg_tape(e.L, e.names,
                                      "L = mean((softmax(0.5 (x Wq)(x Wk)^T) (x Wv) - y)^2) after backward")},
          {"tape.dot", graph_to_dot(e.L, e.names)},
          {"qkv.svg", docpics::qkv_svg()},
          {"heads.svg", docpics::heads_svg(4)},
          {"online-softmax.svg",
           docpics::online_softmax_svg(source_constant(kernel, "kBq"), source_constant(kernel, "kBk"))},
          {"kv-cache.svg", docpics::kv_cache_svg(4)},
          {"linformer.svg", docpics::linformer_svg()},
          {"compressed.svg", compressed_svg()},
          {"axial.svg", axial_svg()},
          {"sparse.svg", sparse_svg()}};
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
    return docs::write_or_check("docpics", root, draw_all(root), check_only);
  } catch (const std::exception& ex) {
    fmt::print(stderr, "docpics: {}\n", ex.what());
    return 1;
  }
}
