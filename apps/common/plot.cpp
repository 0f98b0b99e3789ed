// SVG line charts, heatmaps and image overlays (see plot.h). Plain string building: every element
// is one line of SVG, so the files stay readable and diffable.
#include "apps/common/plot.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "apps/common/report.h"
#include "core/error.h"

namespace ag::apps {

// ---- helpers -------------------------------------------------------------------------------

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&apos;"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default:
          if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02X}", c);
          else out.push_back(char(c));
      }
      ++i;
      continue;
    }
    // A multi-byte UTF-8 sequence: lead byte 110xxxxx (2), 1110xxxx (3) or 11110xxx (4), then
    // continuation bytes 10xxxxxx; the second-byte ranges exclude overlong forms, surrogates and
    // code points above U+10FFFF.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    bool valid = len > 0 && i + len <= s.size() && byte(i + 1) >= lo && byte(i + 1) <= hi;
    for (size_t k = 2; valid && k < len; ++k) valid = (byte(i + k) & 0xC0) == 0x80;
    if (!valid) {
      out += fmt::format("\\x{:02X}", c);
      ++i;
      continue;
    }
    out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

std::string colormap(double t) {
  // Five anchors of matplotlib's viridis (perceptually uniform, readable in greyscale and by
  // colour-blind readers), linearly interpolated.
  static const double stops[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  if (!std::isfinite(t)) t = 0;
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int k = std::min(int(t), 3);
  const double f = t - k;
  int rgb[3];
  for (int c = 0; c < 3; ++c) rgb[c] = int(std::lround(stops[k][c] + f * (stops[k + 1][c] - stops[k][c])));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

void write_file_atomic(const std::string& path, std::string_view text) {
  const std::string tmp = fmt::format("{}.tmp{}", path, ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    check(f.good(), "write_file_atomic: cannot open '{}' for writing: {}", tmp, std::strerror(errno));
    f.write(text.data(), std::streamsize(text.size()));
    f.flush();
    if (!f.good()) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      fail("write_file_atomic: writing {} bytes to '{}' failed", text.size(), tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    fail("write_file_atomic: cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
}

namespace {

const char* kFont = "font-family=\"sans-serif\"";
// matplotlib's tab10: distinct colours for the series of one chart.
const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* series_colour(const Series& s, size_t index) {
  return kPalette[(s.colour >= 0 ? size_t(s.colour) : index) % 10];
}

std::string svg_open(int w, int h) {
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      w, h);
}

// Ticks at multiples of 1, 2 or 5 x 10^k inside [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * mag;
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9 && ticks.size() < 50; k += 1)
    ticks.push_back(std::abs(k * step) < step * 1e-9 ? 0.0 : k * step);
  return ticks;
}

// A tick label: as few decimals as the tick spacing needs, compact for large magnitudes.
std::string tick_label(double v, double spacing) {
  if (std::abs(v) >= 1e5) return format_count(v);
  if (std::abs(v) > 0 && std::abs(v) < 1e-3) return fmt::format("{:.0e}", v);
  const int decimals = spacing > 0 ? std::clamp(int(-std::floor(std::log10(spacing) + 1e-9)), 0, 6) : 0;
  return fmt::format("{:.{}f}", v, decimals);
}

}  // namespace

// ---- line chart ----------------------------------------------------------------------------

std::string svg_line_chart(const LineChart& chart) {
  for (const auto& s : chart.series)
    check(s.x.size() == s.y.size(), "svg_line_chart: series '{}' has {} x values but {} y values", s.name,
          s.x.size(), s.y.size());
  const int W = std::max(chart.width, 200), H = std::max(chart.height, 150);
  const double left = 72, right = 20, top = 40, bottom = 52;
  const double pw = W - left - right, ph = H - top - bottom;

  // The drawable points, y in axis space (log10 on a log axis).
  std::vector<std::vector<std::pair<double, double>>> pts(chart.series.size());
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const Series& ser = chart.series[s];
    for (size_t i = 0; i < ser.x.size(); ++i) {
      double x = ser.x[i], y = ser.y[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (chart.log_y && y <= 0) || (chart.log_x && x <= 0)) continue;
      if (chart.log_x) x = std::log10(x);
      if (chart.log_y) y = std::log10(y);
      pts[s].emplace_back(x, y);
      xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  }
  if (!(xlo <= xhi)) xlo = 0, xhi = 1, ylo = 0, yhi = 1;  // nothing to draw yet: empty axes
  if (xhi - xlo < 1e-12) xlo -= 0.5, xhi += 0.5;
  if (chart.log_x) {  // a margin on a log axis, so the end points do not sit on the frame
    const double pad = (xhi - xlo) * 0.03;
    xlo -= pad, xhi += pad;
  }
  if (yhi - ylo < 1e-12) {
    const double pad = chart.log_y ? 0.5 : std::max(std::abs(ylo) * 0.1, 0.5);
    ylo -= pad, yhi += pad;
  } else {
    const double pad = (yhi - ylo) * 0.05;
    ylo -= pad, yhi += pad;
  }
  const auto X = [&](double x) { return left + (x - xlo) / (xhi - xlo) * pw; };
  const auto Y = [&](double y) { return top + (yhi - y) / (yhi - ylo) * ph; };

  std::string svg = svg_open(W, H);
  svg += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" {}>{}</text>\n", W / 2.0,
                     kFont, xml_escape(chart.title));
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left, top,
                     pw, ph);

  // the label of a tick at value v on a log axis, or of a tick the chart asked for
  const auto value_label = [](double v) { return v >= 1e5 ? format_count(v) : fmt::format("{:g}", v); };
  // ticks: (axis position, label); decades (and 2, 5 between them when the range is short) on a log axis
  const auto ticks = [&](double lo, double hi, bool log) {
    std::vector<std::pair<double, std::string>> t;
    if (log) {
      const int e0 = int(std::floor(lo)), e1 = int(std::ceil(hi));
      const bool fine = e1 - e0 <= 2;
      for (int e = e0; e <= e1; ++e)
        for (double m : {1.0, 2.0, 5.0}) {
          if (m != 1 && !fine) continue;
          const double v = m * std::pow(10.0, e), p = std::log10(v);
          if (p >= lo && p <= hi) t.emplace_back(p, value_label(v));
        }
      if (t.size() >= 2) return t;
      t.clear();  // less than a factor of 2 in range: linear ticks of the values
      const auto lin = nice_ticks(std::pow(10.0, lo), std::pow(10.0, hi), 4);
      const double sp = lin.size() > 1 ? lin[1] - lin[0] : 1;
      for (double v : lin)
        if (v > 0) t.emplace_back(std::log10(v), tick_label(v, sp));
      return t;
    }
    const auto lin = nice_ticks(lo, hi);
    const double sp = lin.size() > 1 ? lin[1] - lin[0] : 1;
    for (double v : lin) t.emplace_back(v, tick_label(v, sp));
    return t;
  };
  std::vector<std::pair<double, std::string>> xt = ticks(xlo, xhi, chart.log_x);
  if (!chart.x_ticks.empty()) {
    xt.clear();
    for (double v : chart.x_ticks) {
      if (!std::isfinite(v) || (chart.log_x && v <= 0)) continue;
      const double p = chart.log_x ? std::log10(v) : v;
      if (p >= xlo && p <= xhi) xt.emplace_back(p, value_label(v));
    }
  }
  for (const auto& [p, label] : xt) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>\n", X(p), top,
                       top + ph);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\" {}>{}</text>\n", X(p),
                       top + ph + 16, kFont, xml_escape(label));
  }
  const auto yt = ticks(ylo, yhi, chart.log_y);
  for (const auto& [p, label] : yt) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n", left, Y(p),
                       left + pw);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\" {}>{}</text>\n", left - 6,
                       Y(p) + 4, kFont, xml_escape(label));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\" {}>{}{}</text>\n",
                     left + pw / 2, H - 12, kFont, xml_escape(chart.x_label), chart.log_x ? " (log scale)" : "");
  svg += fmt::format(
      "<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\" {}>{}{}</text>\n",
      top + ph / 2, kFont, xml_escape(chart.y_label), chart.log_y ? " (log scale)" : "");

  // series: a polyline, and a dot per point when there are few enough to tell apart
  for (size_t s = 0; s < pts.size(); ++s) {
    if (pts[s].empty()) continue;
    const char* colour = series_colour(chart.series[s], s);
    std::string points;
    for (const auto& [x, y] : pts[s]) points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", X(x), Y(y));
    svg += fmt::format(
        "<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "stroke-linejoin=\"round\"{}/>\n",
        points, colour, chart.series[s].dashed ? " stroke-dasharray=\"6 4\"" : "");
    if (pts[s].size() <= 200)
      for (const auto& [x, y] : pts[s])
        svg += fmt::format("<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", X(x), Y(y),
                           colour);
  }
  // legend, top right inside the plot
  if (!chart.series.empty()) {
    size_t longest = 0;
    for (const auto& s : chart.series) longest = std::max(longest, std::min<size_t>(s.name.size(), 30));
    const double lw = 34 + 6.5 * double(longest), lh = 8 + 16.0 * double(chart.series.size());
    // In whichever corner covers the fewest points (top right first, on ties).
    double lx = left + pw - lw - 8, ly = top + 8;
    size_t fewest = SIZE_MAX;
    for (const auto& corner : {std::pair{left + pw - lw - 8, top + 8}, std::pair{left + pw - lw - 8, top + ph - lh - 8},
                               std::pair{left + 8, top + 8}, std::pair{left + 8, top + ph - lh - 8}}) {
      const double cx = corner.first, cy = corner.second;  // not a structured binding: lambdas capture it
      size_t covered = 0;
      const auto inside = [&](double px, double py) {
        return px >= cx - 4 && px <= cx + lw + 4 && py >= cy - 4 && py <= cy + lh + 4;
      };
      for (const auto& ps : pts)  // the points and 8 samples along each segment of the lines
        for (size_t i = 0; i < ps.size(); ++i) {
          covered += inside(X(ps[i].first), Y(ps[i].second));
          for (int k = 1; k < 8 && i + 1 < ps.size(); ++k) {
            const double f = k / 8.0;
            covered += inside(X(ps[i].first + f * (ps[i + 1].first - ps[i].first)),
                              Y(ps[i].second + f * (ps[i + 1].second - ps[i].second)));
          }
        }
      if (covered < fewest) fewest = covered, lx = cx, ly = cy;
    }
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"white\" fill-opacity=\"0.85\" "
        "stroke=\"#999\"/>\n",
        lx, ly, lw, lh);
    for (size_t s = 0; s < chart.series.size(); ++s) {
      const double y = ly + 14 + 16.0 * double(s);
      svg += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2.5\"{}/>\n",
          lx + 6, y - 4, lx + 24, y - 4, series_colour(chart.series[s], s),
          chart.series[s].dashed ? " stroke-dasharray=\"6 4\"" : "");
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" {}>{}</text>\n", lx + 28, y, kFont,
                         xml_escape(truncate_label(chart.series[s].name, 30)));
    }
  }
  svg += "</svg>\n";
  return svg;
}

std::string svg_line_charts(const std::vector<LineChart>& charts, int columns, const std::string& caption) {
  check(!charts.empty(), "svg_line_charts: no charts to draw");
  check(columns >= 1, "svg_line_charts: columns must be >= 1, got {}", columns);
  const int ncols = std::min<int>(columns, int(charts.size()));
  int cell_w = 0, cell_h = 0;
  for (const auto& c : charts) cell_w = std::max(cell_w, std::max(c.width, 200)), cell_h = std::max(cell_h, std::max(c.height, 150));
  const int nrows = (int(charts.size()) + ncols - 1) / ncols;
  const int caption_h = caption.empty() ? 0 : 20;
  std::string svg = svg_open(ncols * cell_w, nrows * cell_h + caption_h);
  for (size_t k = 0; k < charts.size(); ++k) {
    std::string one = svg_line_chart(charts[k]);
    one.erase(0, one.find("<svg"));  // drop the XML declaration: this one goes inside
    const std::string at = fmt::format("<svg x=\"{}\" y=\"{}\" ", int(k % size_t(ncols)) * cell_w, int(k / size_t(ncols)) * cell_h);
    one.replace(0, 5, at);
    svg += one;
  }
  if (!caption.empty())
    svg += fmt::format("<text x=\"12\" y=\"{}\" font-size=\"12\" font-family=\"sans-serif\">{}</text>\n",
                       nrows * cell_h + caption_h - 6, xml_escape(caption));
  svg += "</svg>\n";
  return svg;
}

void TrainingCurves::add(const std::string& metric, const std::string& series, double step, double value) {
  auto chart = std::find_if(charts_.begin(), charts_.end(), [&](const LineChart& c) { return c.y_label == metric; });
  if (chart == charts_.end()) {
    LineChart c;
    c.title = metric;
    c.y_label = metric;
    c.log_y = metric.find("loss") != std::string::npos;
    c.width = 560, c.height = 360;
    charts_.push_back(std::move(c));
    chart = charts_.end() - 1;
  }
  auto ser = std::find_if(chart->series.begin(), chart->series.end(), [&](const Series& x) { return x.name == series; });
  if (ser == chart->series.end()) {
    chart->series.push_back(Series{series, {}, {}});
    ser = chart->series.end() - 1;
  }
  ser->x.push_back(step);
  ser->y.push_back(value);
}

std::string TrainingCurves::svg(int columns) const {
  if (charts_.empty()) {  // before the first evaluation: an empty chart rather than an error
    LineChart empty;
    empty.title = "no metrics yet";
    return svg_line_chart(empty);
  }
  return svg_line_charts(charts_, columns);
}

void TrainingCurves::write(const std::string& path, int columns) const { write_file_atomic(path, svg(columns)); }

// ---- colour scale --------------------------------------------------------------------------
namespace {
// A vertical bar at (x, y) of height h: vmax at the top, vmin at the bottom. Its gradient's id
// gets a number unique in the process, so figures pasted into one document (a grid of overlays)
// never repeat an XML id.
std::string colour_bar(double x, double y, double h, double vmin, double vmax, const std::string& name) {
  static std::atomic<int64_t> next{0};
  const std::string id = fmt::format("{}_{}", name, next++);
  std::string svg = fmt::format("<defs><linearGradient id=\"{}\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">", id);
  for (int k = 0; k <= 10; ++k)
    svg += fmt::format("<stop offset=\"{:.1f}\" stop-color=\"{}\"/>", k / 10.0, colormap(k / 10.0));
  svg += "</linearGradient></defs>\n";
  svg += fmt::format(
      "<rect class=\"colorbar\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"{:.1f}\" fill=\"url(#{})\" "
      "stroke=\"#333\"/>\n",
      x, y, h, id);
  for (int k = 0; k <= 4; ++k) {
    const double v = vmin + (vmax - vmin) * k / 4.0, ty = y + h - h * k / 4.0;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" {}>{:.3g}</text>\n", x + 18, ty + 3.5, kFont,
                       v);
  }
  return svg;
}

// A token label as shown: truncated, and a label of only spaces (a char-level model's most common
// token) drawn as open boxes so that it is visible.
std::string display_label(const std::string& l, size_t max_chars) {
  if (!l.empty() && l.find_first_not_of(' ') == std::string::npos) {
    std::string boxes;
    for (size_t k = 0; k < l.size(); ++k) boxes += "\u2423";
    return truncate_label(boxes, max_chars);
  }
  return truncate_label(l, max_chars);
}

struct Range {
  double lo, hi;
  double norm(double v) const { return hi > lo ? (v - lo) / (hi - lo) : 0.5; }
};
Range value_range(const std::vector<const std::vector<double>*>& all, double vmin, double vmax) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* vs : all)
    for (double v : *vs)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (std::isfinite(vmin)) lo = vmin;
  if (std::isfinite(vmax)) hi = vmax;
  return {lo, hi};
}
}  // namespace

// ---- heatmaps ------------------------------------------------------------------------------

std::string svg_heatmaps(const std::vector<Heatmap>& panels, const HeatmapOptions& opt) {
  check(!panels.empty(), "svg_heatmaps: no panels to draw");
  check(opt.cell >= 2 && opt.columns >= 1, "svg_heatmaps: cell {} and columns {} must be >= 2 and >= 1", opt.cell,
        opt.columns);
  std::vector<const std::vector<double>*> all;
  int max_rows = 0, max_cols = 0;
  size_t max_row_label = 0, max_col_label = 0;
  for (size_t p = 0; p < panels.size(); ++p) {
    const Heatmap& m = panels[p];
    check(m.rows > 0 && m.cols > 0 && m.values.size() == size_t(m.rows) * size_t(m.cols),
          "svg_heatmaps: panel {} ('{}') is {}x{} but has {} values", p, m.title, m.rows, m.cols, m.values.size());
    check(m.row_labels.empty() || m.row_labels.size() == size_t(m.rows),
          "svg_heatmaps: panel {} ('{}') has {} rows but {} row labels", p, m.title, m.rows, m.row_labels.size());
    check(m.col_labels.empty() || m.col_labels.size() == size_t(m.cols),
          "svg_heatmaps: panel {} ('{}') has {} columns but {} column labels", p, m.title, m.cols,
          m.col_labels.size());
    all.push_back(&m.values);
    max_rows = std::max(max_rows, m.rows), max_cols = std::max(max_cols, m.cols);
    for (const auto& l : m.row_labels) max_row_label = std::max(max_row_label, std::min(l.size(), opt.max_label));
    for (const auto& l : m.col_labels) max_col_label = std::max(max_col_label, std::min(l.size(), opt.max_label));
  }
  const Range range = value_range(all, opt.vmin, opt.vmax);
  const double cell = opt.cell, font = std::clamp(cell * 0.65, 6.0, 12.0), char_w = font * 0.62;
  const double label_w = max_row_label ? double(max_row_label) * char_w + 8 : 4;
  const double label_h = max_col_label ? double(max_col_label) * char_w + 8 : 4;
  const double panel_w = label_w + max_cols * cell + 16, panel_h = 22 + label_h + max_rows * cell + 16;
  const int ncols = std::min<int>(opt.columns, int(panels.size()));
  const int nrows = (int(panels.size()) + ncols - 1) / ncols;
  const double top = opt.title.empty() ? 8 : 34;
  const int W = int(std::ceil(ncols * panel_w + 90)), H = int(std::ceil(top + nrows * panel_h + 8));

  std::string svg = svg_open(W, H);
  if (!opt.title.empty())
    svg += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" {}>{}</text>\n", W / 2.0,
                       kFont, xml_escape(opt.title));
  for (size_t p = 0; p < panels.size(); ++p) {
    const Heatmap& m = panels[p];
    const double ox = double(p % size_t(ncols)) * panel_w, oy = top + double(p / size_t(ncols)) * panel_h;
    const double gx = ox + label_w, gy = oy + 22 + label_h;  // top-left of the cell grid
    svg += fmt::format("<g class=\"panel\">\n<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" {}>{}</text>\n", gx,
                       oy + 14, kFont, xml_escape(m.title));
    for (int c = 0; c < m.cols && !m.col_labels.empty(); ++c)
      svg += fmt::format(
          "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" font-size=\"{:.1f}\" {}>{}</text>\n",
          gx + (c + 0.5) * cell + font * 0.35, gy - 4, font, kFont,
          xml_escape(display_label(m.col_labels[size_t(c)], opt.max_label)));
    for (int r = 0; r < m.rows; ++r) {
      if (!m.row_labels.empty())
        svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"{:.1f}\" {}>{}</text>\n",
                           gx - 4, gy + (r + 0.5) * cell + font * 0.35, font, kFont,
                           xml_escape(display_label(m.row_labels[size_t(r)], opt.max_label)));
      for (int c = 0; c < m.cols; ++c) {
        const double v = m.values[size_t(r) * size_t(m.cols) + size_t(c)];
        const std::string fill = std::isnan(v) ? "#bbbbbb" : colormap(range.norm(v));
        std::string tip = fmt::format("{:.4g}", v);
        if (!m.row_labels.empty() && !m.col_labels.empty())
          tip = fmt::format("{} \u2192 {}: {}", m.row_labels[size_t(r)], m.col_labels[size_t(c)], tip);
        svg += fmt::format(
            "<rect class=\"cell\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}</title>"
            "</rect>\n",
            gx + c * cell, gy + r * cell, cell, cell, fill, xml_escape(tip));
      }
    }
    svg += "</g>\n";
  }
  svg += colour_bar(ncols * panel_w + 8, top + 22 + label_h, std::max(60.0, max_rows * cell), range.lo, range.hi,
                    "heat_scale");
  svg += "</svg>\n";
  return svg;
}

Heatmap heatmap_from_tensor(const Tensor& m, std::string title, std::vector<std::string> row_labels,
                            std::vector<std::string> col_labels) {
  check(m.defined() && m.ndim() == 2, "heatmap_from_tensor: expected a 2-d tensor, got shape {}",
        m.defined() ? fmt::format("{}", m.shape()) : std::string("(undefined)"));
  check(is_floating(m.dtype()), "heatmap_from_tensor: expected a floating tensor, got dtype {}", name(m.dtype()));
  Heatmap h;
  h.title = std::move(title);
  h.rows = int(m.size(0)), h.cols = int(m.size(1));
  h.values = m.detach().cpu().to(DType::f64).contiguous().to_vector<double>();
  h.row_labels = std::move(row_labels);
  h.col_labels = std::move(col_labels);
  return h;
}

// ---- image overlay -------------------------------------------------------------------------

Image image_from_u8(const uint8_t* data, int channels, int height, int width) {
  check(channels == 1 || channels == 3, "image_from_u8: expected 1 or 3 channels, got {}", channels);
  check(height > 0 && width > 0, "image_from_u8: bad size {}x{}", height, width);
  check(data != nullptr, "image_from_u8: null data for a {}x{}x{} image", channels, height, width);
  Image img{channels, height, width, {}};
  const size_t n = size_t(channels) * size_t(height) * size_t(width);
  img.pixels.resize(n);
  for (size_t i = 0; i < n; ++i) img.pixels[i] = float(data[i]) / 255.0f;
  return img;
}

Image image_from_tensor(const Tensor& t, double lo, double hi) {
  check(t.defined() && (t.ndim() == 2 || t.ndim() == 3), "image_from_tensor: expected [C,H,W] or [H,W], got shape {}",
        t.defined() ? fmt::format("{}", t.shape()) : std::string("(undefined)"));
  check(is_floating(t.dtype()), "image_from_tensor: expected a floating tensor, got dtype {}", name(t.dtype()));
  const int C = t.ndim() == 3 ? int(t.size(0)) : 1;
  check(C == 1 || C == 3, "image_from_tensor: expected 1 or 3 channels, got shape {}", t.shape());
  const std::vector<double> v = t.detach().cpu().to(DType::f64).contiguous().to_vector<double>();
  double mn = INFINITY, mx = -INFINITY;
  for (double x : v)
    if (std::isfinite(x)) mn = std::min(mn, x), mx = std::max(mx, x);
  if (std::isnan(lo)) lo = std::isfinite(mn) ? mn : 0;
  if (std::isnan(hi)) hi = std::isfinite(mx) ? mx : 1;
  Image img{C, int(t.size(-2)), int(t.size(-1)), {}};
  img.pixels.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    img.pixels[i] = hi > lo ? float(std::clamp((v[i] - lo) / (hi - lo), 0.0, 1.0)) : 0.5f;
  return img;
}

std::string svg_image_overlay(const Image& image, const std::vector<double>& grid, int grid_h, int grid_w,
                              const OverlayOptions& opt) {
  const int C = image.channels, IH = image.height, IW = image.width;
  check((C == 1 || C == 3) && IH > 0 && IW > 0 && image.pixels.size() == size_t(C) * size_t(IH) * size_t(IW),
        "svg_image_overlay: image of {} channels, {}x{} has {} pixel values", C, IH, IW, image.pixels.size());
  check(grid_h > 0 && grid_w > 0 && grid.size() == size_t(grid_h) * size_t(grid_w),
        "svg_image_overlay: grid {}x{} but {} values", grid_h, grid_w, grid.size());
  check(opt.scale >= 1, "svg_image_overlay: scale {} must be >= 1", opt.scale);
  const double s = opt.scale, iw = IW * s, ih = IH * s, gap = 24;
  const double top = opt.title.empty() ? 28 : 50;
  const int panels = opt.plain ? 2 : 1;
  const int W = int(std::ceil(panels * iw + (panels - 1) * gap + 90)), H = int(std::ceil(top + ih + 12));
  const Range range = value_range({&grid}, NAN, NAN);

  std::string svg = svg_open(W, H);
  if (!opt.title.empty())
    svg += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" {}>{}</text>\n", W / 2.0,
                       kFont, xml_escape(opt.title));
  const auto pixel_colour = [&](int y, int x) {
    int rgb[3];
    for (int c = 0; c < 3; ++c) {
      const float v = image.pixels[(size_t(C == 3 ? c : 0) * size_t(IH) + size_t(y)) * size_t(IW) + size_t(x)];
      rgb[c] = int(std::lround(std::clamp(std::isfinite(v) ? v : 0.0f, 0.0f, 1.0f) * 255));
    }
    return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
  };
  // Left: the image alone (opt.plain); right: the image again with the patch grid over it.
  for (int panel = opt.plain ? 0 : 1; panel < 2; ++panel) {
    const double ox = 8 + (panel + panels - 2) * (iw + gap);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" {}>{}</text>\n", ox, top - 8, kFont,
                       panel == 0 ? "image" : "attention");
    svg += fmt::format("<g class=\"image\" shape-rendering=\"crispEdges\">\n");
    for (int y = 0; y < IH; ++y)
      for (int x = 0; x < IW; ++x)
        svg += fmt::format("<rect class=\"pixel\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n",
                           ox + x * s, top + y * s, s, s, pixel_colour(y, x));
    svg += "</g>\n";
    if (panel == 1) {
      const double cw = iw / grid_w, ch = ih / grid_h;
      svg += fmt::format("<g class=\"overlay\" fill-opacity=\"{:.2f}\">\n", std::clamp(opt.opacity, 0.0, 1.0));
      for (int r = 0; r < grid_h; ++r)
        for (int c = 0; c < grid_w; ++c) {
          const double v = grid[size_t(r) * size_t(grid_w) + size_t(c)];
          svg += fmt::format(
              "<rect class=\"patch\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
              "stroke=\"white\" stroke-opacity=\"0.3\"><title>patch ({}, {}): {:.4g}</title></rect>\n",
              ox + c * cw, top + r * ch, cw, ch, std::isnan(v) ? "#bbbbbb" : colormap(range.norm(v)), r, c, v);
        }
      svg += "</g>\n";
    }
  }
  svg += colour_bar(8 + panels * iw + (panels - 1) * gap + 10, top, ih, range.lo, range.hi, "overlay_scale");
  svg += "</svg>\n";
  return svg;
}

// ---- a computation graph -------------------------------------------------------------------

std::string svg_graph(const std::vector<GraphBox>& boxes, const std::string& title) {
  const size_t n = boxes.size();
  std::vector<std::vector<size_t>> consumers(n);
  for (size_t i = 0; i < n; ++i)
    for (size_t in : boxes[i].inputs) {
      check(in < i, "svg_graph: box {} reads box {}, which is not an earlier box", i, in);
      consumers[in].push_back(i);
    }
  // Layers: ops one above their highest input; leaves one below their lowest consumer.
  std::vector<int> layer(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (!boxes[i].leaf)
      for (size_t in : boxes[i].inputs) layer[i] = std::max(layer[i], layer[in] + 1);
  for (size_t i = 0; i < n; ++i)
    if (boxes[i].leaf && !consumers[i].empty()) {
      int lowest = std::numeric_limits<int>::max();
      for (size_t c : consumers[i]) lowest = std::min(lowest, layer[c]);
      layer[i] = std::max(0, lowest - 1);
    }
  // An edge that spans several layers passes through a narrow waypoint on each layer between, which
  // takes part in the ordering like a box: the edge then bends around the boxes instead of
  // crossing them. Items 0..n-1 are the boxes, the rest waypoints.
  std::vector<int> item_layer = layer;
  std::vector<std::vector<size_t>> below(n), above(n);  // neighbours one layer down / up
  std::vector<std::vector<size_t>> paths;               // per edge: input, waypoints, consumer
  for (size_t i = 0; i < n; ++i)
    for (size_t in : boxes[i].inputs) {
      std::vector<size_t> path{in};
      for (int l = layer[in] + 1; l < layer[i]; ++l) {
        path.push_back(item_layer.size());
        item_layer.push_back(l);
        below.emplace_back(), above.emplace_back();
      }
      path.push_back(i);
      for (size_t k = 1; k < path.size(); ++k) below[path[k]].push_back(path[k - 1]), above[path[k - 1]].push_back(path[k]);
      paths.push_back(std::move(path));
    }
  const size_t items = item_layer.size();
  const int layers = n ? *std::max_element(layer.begin(), layer.end()) + 1 : 0;
  std::vector<std::vector<size_t>> rows(size_t(std::max(layers, 0)));
  for (size_t i = 0; i < items; ++i) rows[size_t(item_layer[i])].push_back(i);

  const double font = 11, char_w = font * 0.61, line_h = font + 3, gap_x = 18, gap_y = 34, waypoint_w = 6;
  size_t max_chars = 1, max_lines = 1;
  for (const GraphBox& b : boxes) {
    max_lines = std::max(max_lines, b.lines.size());
    for (const auto& l : b.lines) max_chars = std::max(max_chars, utf8_length(l));
  }
  const double box_w = double(max_chars) * char_w + 20, box_h = double(max_lines) * line_h + 10;
  auto width = [&](size_t item) { return item < n ? box_w : waypoint_w; };
  // x: each row centred on 0, its items side by side in their order.
  std::vector<double> x(items);
  auto place = [&](const std::vector<size_t>& row) {
    double total = -gap_x;
    for (size_t it : row) total += width(it) + gap_x;
    double left = -total / 2;
    for (size_t it : row) x[it] = left + width(it) / 2, left += width(it) + gap_x;
  };
  for (const auto& row : rows) place(row);
  // Order within a layer by the barycentre of the neighbours: up the layers by the items below,
  // then down by the items above, a few times.
  auto sweep = [&](std::vector<size_t>& row, const std::vector<std::vector<size_t>>& nbs) {
    std::vector<std::pair<double, size_t>> key;
    for (size_t it : row) {
      double sum = 0;
      for (size_t j : nbs[it]) sum += x[j];
      key.emplace_back(nbs[it].empty() ? x[it] : sum / double(nbs[it].size()), it);
    }
    std::stable_sort(key.begin(), key.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t k = 0; k < row.size(); ++k) row[k] = key[k].second;
    place(row);
  };
  for (int pass = 0; pass < 4; ++pass) {
    for (size_t r = 1; r < rows.size(); ++r) sweep(rows[r], below);
    for (size_t r = rows.size(); r-- > 1;) sweep(rows[r - 1], above);
  }
  double half = box_w / 2;
  for (size_t it = 0; it < items; ++it) half = std::max(half, std::abs(x[it]) + width(it) / 2);
  const double top = title.empty() ? 12 : 40;
  const int W = int(std::ceil(2 * half + 2 * gap_x));
  const int H = int(std::ceil(top + layers * (box_h + gap_y) - gap_y + 12));
  auto cx = [&](size_t it) { return W / 2.0 + x[it]; };
  auto cy = [&](size_t it) { return top + (layers - 1 - item_layer[it]) * (box_h + gap_y) + box_h / 2; };

  std::string svg = svg_open(W, H);
  svg += "<defs><marker id=\"graph_arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" "
         "markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555\"/></marker></defs>\n";
  if (!title.empty())
    svg += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" {}>{}</text>\n", W / 2.0,
                       kFont, xml_escape(title));
  for (const auto& path : paths) {  // edges first, so that the boxes cover their ends
    std::string points = fmt::format("{:.1f},{:.1f}", cx(path.front()), cy(path.front()) - box_h / 2);
    for (size_t k = 1; k + 1 < path.size(); ++k) points += fmt::format(" {:.1f},{:.1f}", cx(path[k]), cy(path[k]));
    points += fmt::format(" {:.1f},{:.1f}", cx(path.back()), cy(path.back()) + box_h / 2 + 1);
    svg += fmt::format(
        "<polyline class=\"edge\" points=\"{}\" fill=\"none\" stroke=\"#555\" marker-end=\"url(#graph_arrow)\"/>\n",
        points);
  }
  for (size_t i = 0; i < n; ++i) {
    const GraphBox& b = boxes[i];
    const double bx = cx(i), by = cy(i);
    if (b.leaf)
      svg += fmt::format(
          "<ellipse class=\"leaf\" cx=\"{:.1f}\" cy=\"{:.1f}\" rx=\"{:.1f}\" ry=\"{:.1f}\" fill=\"#e8f1fa\" "
          "stroke=\"#1f77b4\"/>\n",
          bx, by, box_w / 2, box_h / 2);
    else
      svg += fmt::format(
          "<rect class=\"op\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" rx=\"4\" "
          "fill=\"#fff6e8\" stroke=\"#ff7f0e\"/>\n",
          bx - box_w / 2, by - box_h / 2, box_w, box_h);
    const double first = by - (double(b.lines.size()) - 1) * line_h / 2 + font * 0.35;
    for (size_t k = 0; k < b.lines.size(); ++k)
      svg += fmt::format(
          "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"{}\" font-family=\"monospace\"{}>"
          "{}</text>\n",
          bx, first + double(k) * line_h, font, k == 0 ? " font-weight=\"bold\"" : "", xml_escape(b.lines[k]));
  }
  return svg + "</svg>\n";
}

std::string svg_tape(const Tensor& root, const LeafNames& names, const std::string& title) {
  std::vector<GraphBox> boxes;
  for (const GraphEntry& e : graph_entries(root, names)) boxes.push_back({graph_label(e), e.leaf, e.inputs});
  return svg_graph(boxes, title);
}

namespace {

// The width="..." or height="..." of an SVG's root element.
double svg_size(const std::string& svg, const char* attr) {
  const size_t root = svg.find("<svg");
  const size_t at = svg.find(fmt::format(" {}=\"", attr), root);
  check(root != std::string::npos && at != std::string::npos, "svg_grid: an SVG without a root {}", attr);
  return std::stod(svg.substr(at + std::char_traits<char>::length(attr) + 3));
}

}  // namespace

std::string svg_grid(const std::vector<std::string>& parts, int columns) {
  check(!parts.empty() && columns >= 1, "svg_grid: expected documents and columns >= 1, got {} and {}", parts.size(),
        columns);
  double cell_w = 0, cell_h = 0;
  for (const auto& p : parts) cell_w = std::max(cell_w, svg_size(p, "width")), cell_h = std::max(cell_h, svg_size(p, "height"));
  const int cols = std::min<int>(columns, int(parts.size()));
  const int rows = (int(parts.size()) + cols - 1) / cols;
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      cols * cell_w, rows * cell_h);
  for (size_t k = 0; k < parts.size(); ++k) {
    std::string one = parts[k].substr(parts[k].find("<svg"));  // no XML declaration inside
    one.replace(0, 4, fmt::format("<svg x=\"{}\" y=\"{}\"", double(k % size_t(cols)) * cell_w,
                                  double(k / size_t(cols)) * cell_h));
    svg += one;
  }
  return svg + "</svg>\n";
}

}  // namespace ag::apps
