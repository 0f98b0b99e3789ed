#pragma once
// Plots a person can open in a browser: self-contained SVG (no scripts, no external fonts or
// images; generic font families only).
//   svg_line_chart      train/validation loss and accuracy over steps (log-y option for losses)
//   svg_heatmaps        attention weights, one panel per head, tokens on both axes, a colour scale
//   svg_image_overlay   an image with a patch-grid heatmap on top (ViT class-token attention)
//   svg_graph           a computation graph, boxes in layers (svg_tape: the tape behind a tensor)
// Each returns the SVG text; write_file_atomic() puts it on disk so that a viewer never sees a
// half-written file while the apps rewrite the plots at every evaluation.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/tape.h"
#include "core/tensor.h"

namespace ag::apps {

// ---- line chart ----------------------------------------------------------------------------
struct Series {
  std::string name;       // legend entry
  std::vector<double> x;  // same length as y
  std::vector<double> y;  // non-finite points (and <= 0 on a log axis) are left out
  int colour = -1;        // index into the palette (mod 10); -1: the series' own index
  bool dashed = false;    // a dashed line (e.g. a reference beside a measured series of one colour)
};
struct LineChart {
  std::string title, x_label = "step", y_label;
  bool log_x = false, log_y = false;
  std::vector<double> x_ticks;  // where the x ticks go, in data units (empty: chosen from the range)
  int width = 720, height = 420;
  std::vector<Series> series;
};
// One <polyline class="series"> per series with at least one drawable point, one
// <circle class="point"> per drawable point in series of at most 200 points, nice ticks (1/2/5 x 10^k; decades on a
// log axis, with 2 and 5 between them when the axis spans at most two decades),
// axis labels, title and a legend in the emptiest corner. Raises ag::Error when a series' x and y lengths differ.
std::string svg_line_chart(const LineChart& chart);
// Several charts in one file, `columns` per row (each a nested <svg> at its offset), and a line of
// caption below them when `caption` is not empty.
std::string svg_line_charts(const std::vector<LineChart>& charts, int columns = 2, const std::string& caption = "");

// The curves of a run, collected at each evaluation and drawn side by side in one SVG, one chart
// per metric (in order of first use), one series per split:
//   curves.add("loss", "train", step, train_loss);  curves.add("loss", "val", step, val_loss);
//   curves.add("accuracy", "val", step, acc);        curves.write(dir + "/curves.svg");
// A metric whose name contains "loss" gets a log y axis.
class TrainingCurves {
 public:
  void add(const std::string& metric, const std::string& series, double step, double value);
  std::string svg(int columns = 2) const;
  void write(const std::string& path, int columns = 2) const;  // atomically
  const std::vector<LineChart>& charts() const { return charts_; }

 private:
  std::vector<LineChart> charts_;
};

// ---- heatmaps ------------------------------------------------------------------------------
struct Heatmap {
  std::string title;                     // "head 0"
  int rows = 0, cols = 0;
  std::vector<double> values;            // rows * cols, row-major (row = query, col = key)
  std::vector<std::string> row_labels;   // rows labels, or empty for none
  std::vector<std::string> col_labels;   // cols labels, or empty for none
};
struct HeatmapOptions {
  std::string title{};
  int columns = 4;            // panels per row
  int cell = 18;              // pixels per cell
  size_t max_label = 10;      // labels longer than this are truncated with "…"
  double vmin = std::numeric_limits<double>::quiet_NaN();  // NaN: the data's min / max
  double vmax = std::numeric_limits<double>::quiet_NaN();  //      over every panel
};
// One <rect class="cell"> per cell (its value in a <title> tooltip), labels on both axes, and one
// colour scale shared by all panels. NaN cells are drawn grey. Raises ag::Error when a panel's
// values or labels do not match rows/cols.
std::string svg_heatmaps(const std::vector<Heatmap>& panels, const HeatmapOptions& opt = {});
// A Heatmap from a (rows, cols) tensor (any floating dtype, any strides).
Heatmap heatmap_from_tensor(const Tensor& m, std::string title = "", std::vector<std::string> row_labels = {},
                            std::vector<std::string> col_labels = {});

// ---- image with a patch-grid overlay -------------------------------------------------------
struct Image {
  int channels = 1, height = 0, width = 0;  // channels 1 (grey) or 3 (RGB)
  std::vector<float> pixels;                // [C, H, W], values in [0, 1]
};
// From bytes [C, H, W] (0..255).
Image image_from_u8(const uint8_t* data, int channels, int height, int width);
// From a float tensor [C, H, W] or [H, W]; values mapped linearly from [lo, hi] to [0, 1]
// (NaN bounds: the tensor's own min and max, which also undoes a mean/std normalisation).
Image image_from_tensor(const Tensor& t, double lo = std::numeric_limits<double>::quiet_NaN(),
                        double hi = std::numeric_limits<double>::quiet_NaN());

struct OverlayOptions {
  std::string title{};
  int scale = 8;          // screen pixels per image pixel
  double opacity = 0.55;  // of the heatmap over the image
  bool plain = true;      // also the image alone, left of the overlay (false: the overlay only)
};
// The image (one <rect class="pixel"> per pixel) with a grid_h x grid_w heatmap (one
// <rect class="patch"> per patch, row-major `grid`) stretched over it, and a colour scale; with
// opt.plain, the image alone to its left as well.
// Raises ag::Error when grid.size() != grid_h * grid_w or the image is malformed.
std::string svg_image_overlay(const Image& image, const std::vector<double>& grid, int grid_h, int grid_w,
                              const OverlayOptions& opt = {});

// Several SVG documents (each with a root width and height, as the functions above make them) as
// nested <svg> elements of one, `columns` per row, each cell as large as the largest of them.
// Raises ag::Error for a document without a root width or height.
std::string svg_grid(const std::vector<std::string>& parts, int columns);

// ---- a computation graph (the tape) -------------------------------------------------------
struct GraphBox {
  std::vector<std::string> lines;  // the label, one line each (monospace)
  bool leaf = false;               // drawn as an ellipse (a leaf); else a box (an op)
  std::vector<size_t> inputs;      // indices of earlier boxes it reads; an arrow from each
};
// A layered drawing, inputs below their consumers as in graph_to_dot's rankdir=BT: a box's layer
// is one above its highest input (an input-less op sits on layer 0); a leaf sits one layer below
// its lowest consumer. An arrow that spans several layers bends through a waypoint on each layer
// between, and boxes and waypoints are ordered within their layer by the mean position of their
// neighbours (a few sweeps up and down), which keeps most arrows short, uncrossed and off the
// boxes. One <rect class="op">, or <ellipse class="leaf">, per box and one
// <polyline class="edge"> per input.
// Raises ag::Error when an input index is not that of an earlier box.
std::string svg_graph(const std::vector<GraphBox>& boxes, const std::string& title = "");
// svg_graph of the tape behind `root` (graph_entries), labelled as graph_to_dot labels it.
std::string svg_tape(const Tensor& root, const LeafNames& names = {}, const std::string& title = "");

// ---- helpers -------------------------------------------------------------------------------
// Text for XML: & < > " ' escaped; control characters and bytes that are not valid UTF-8 (neither
// allowed in XML 1.0) shown as \n, \t, \r or \xNN.
std::string xml_escape(std::string_view s);
// Colour for t in [0, 1] (clamped) on a viridis-like scale, "#rrggbb".
std::string colormap(double t);
// Writes `text` to path + ".tmp", then renames it over `path` (atomic on POSIX file systems).
// Raises ag::Error naming the path when writing fails.
void write_file_atomic(const std::string& path, std::string_view text);

}  // namespace ag::apps
