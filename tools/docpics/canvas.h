#pragma once
// A small SVG canvas for the schematic pictures of docpics: boxes, matrices, labelled operations,
// arrows, block grids and text. Plain string building, one element a line, coordinates rounded to
// 0.1 so that the files are byte-for-byte reproducible (docpics --check compares them).
//
// Text takes a little markup for the math: "_{...}" writes a subscript and "^{...}" a superscript
// (W_{Q}, K^{T}, d_{k}); a lone '_' or '^' is written as is, so code names (key_padding) stay plain.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace docpics {

// One colour role = a light fill and a darker outline of the same hue. The roles are the same in
// every picture: queries blue, keys orange, values green, scores and weights purple, outputs red,
// inputs and weights of a projection grey.
struct Style {
  const char* fill;
  const char* stroke;
};
namespace colour {
inline constexpr Style q{"#d6e6f5", "#1f77b4"};
inline constexpr Style k{"#fde0c5", "#d9700a"};
inline constexpr Style v{"#d5efd5", "#2ca02c"};
inline constexpr Style s{"#e8def3", "#7b52ab"};
inline constexpr Style o{"#f7d4d4", "#c22f2f"};
inline constexpr Style x{"#ececec", "#555555"};
inline constexpr Style op{"#fffbe6", "#8a7a3a"};
inline constexpr Style note{"#ffffff", "#bbbbbb"};
inline constexpr Style seen{"#5ec962", "#3b8a3f"};    // a kept key / block (viridis green)
inline constexpr Style hidden{"#f1f1f1", "#d0d0d0"};  // a hidden key / dropped block
inline constexpr Style focus{"#fde725", "#9a8a00"};   // the query a picture follows
inline constexpr const char* ink = "#222222";
inline constexpr const char* grey = "#555555";
inline constexpr const char* faint = "#888888";
}  // namespace colour

inline std::string escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// The markup above as <tspan>s: a sub- or superscript is 75% of the size of its text, 0.3 of that
// size below or 0.4 above it, and may nest (e^{S_{ij} − m}); the text after it returns to its
// line. Text written with pieces keeps its spaces (xml:space="preserve", see Canvas::text): a space
// at either end of a <tspan> is otherwise dropped by some renderers.
struct Piece {
  std::string text;
  double shift, size;  // the baseline offset (SVG y grows downwards) and the font size
};
inline void pieces(std::string_view s, double shift, double size, std::vector<Piece>& out) {
  std::string run;
  const auto flush = [&] {
    if (!run.empty()) out.push_back({run, shift, size});
    run.clear();
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if ((s[i] == '_' || s[i] == '^') && i + 1 < s.size() && s[i + 1] == '{') {
      size_t close = i + 2;
      for (int depth = 1; close < s.size(); ++close) {
        depth += s[close] == '{' ? 1 : s[close] == '}' ? -1 : 0;
        if (depth == 0) break;
      }
      if (close < s.size()) {
        flush();
        pieces(s.substr(i + 2, close - i - 2), shift + (s[i] == '_' ? 0.3 : -0.4) * size, size * 0.75, out);
        i = close;
        continue;
      }
    }
    run.push_back(s[i]);
  }
  flush();
}
inline std::string rich(std::string_view s, double size) {
  std::vector<Piece> ps;
  pieces(s, 0, size, ps);
  std::string out;
  double at = 0;
  for (const Piece& p : ps) {
    const std::string t = escape(p.text);
    if (p.shift == at && p.size == size) {
      out += t;
      continue;
    }
    out += fmt::format("<tspan dy=\"{:.1f}\"{}>{}</tspan>", p.shift - at,
                       p.size == size ? std::string() : fmt::format(" font-size=\"{:.1f}\"", p.size), t);
    at = p.shift;
  }
  return out;
}

struct Pt {
  double x, y;
};

class Canvas {
 public:
  Canvas(int width, int height) : w_(width), h_(height) {}
  int width() const { return w_; }
  int height() const { return h_; }

  // anchor: "start", "middle" or "end"; the y of a text is its baseline.
  void text(double x, double y, std::string_view s, double size = 13, const char* anchor = "middle",
            const char* fill = colour::ink, const char* weight = nullptr) {
    const std::string body = rich(s, size);
    body_ += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{:.1f}\" text-anchor=\"{}\" fill=\"{}\"{}{}>{}</text>\n",
                         x, y, size, anchor, fill, weight ? fmt::format(" font-weight=\"{}\"", weight) : "",
                         body.find("<tspan") != std::string::npos ? " xml:space=\"preserve\"" : "", body);
  }
  // Centred text on a white ground (over lines that cross it); the ground's width is estimated
  // from the number of characters, 0.56 of the size each.
  void text_on_white(double x, double y, std::string_view s, double size = 12, const char* fill = colour::grey) {
    size_t chars = 0;
    for (const char ch : s) chars += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    const double w = double(chars) * size * 0.56 + 8;
    rect(x - w / 2, y - size, w, size * 1.4, {"white", "none"}, false, 0, 0);
    text(x, y, s, size, "middle", fill);
  }
  // Several lines centred on (x, y_middle), `gap` apart.
  void lines(double x, double y_mid, const std::vector<std::string>& ls, double size = 13,
             const char* anchor = "middle", const char* fill = colour::ink, double gap = 0) {
    if (gap <= 0) gap = size * 1.25;
    const double y0 = y_mid - gap * double(ls.size() - 1) / 2 + size * 0.35;
    for (size_t i = 0; i < ls.size(); ++i) text(x, y0 + gap * double(i), ls[i], size, anchor, fill);
  }
  void title(std::string_view s) { text(w_ / 2.0, 22, s, 15, "middle", colour::ink, "bold"); }

  void rect(double x, double y, double w, double h, Style st, bool dashed = false, double rx = 0,
            double stroke_width = 1.2) {
    body_ += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"{} fill=\"{}\" stroke=\"{}\" "
                         "stroke-width=\"{:.1f}\"{}/>\n",
                         x, y, w, h, rx > 0 ? fmt::format(" rx=\"{:.1f}\"", rx) : "", st.fill, st.stroke, stroke_width,
                         dashed ? " stroke-dasharray=\"4 3\"" : "");
  }
  // A matrix: a box with its name in the middle and its shape under it (or inside, under the
  // name, when `shape_inside`).
  void matrix(double x, double y, double w, double h, Style st, std::string_view name, std::string_view shape,
              bool shape_inside = false) {
    rect(x, y, w, h, st);
    if (shape_inside) {
      text(x + w / 2, y + h / 2 - 2, name, 15, "middle", colour::ink, "bold");
      text(x + w / 2, y + h / 2 + 15, shape, 12, "middle", colour::grey);
    } else {
      text(x + w / 2, y + h / 2 + 5, name, 15, "middle", colour::ink, "bold");
      if (!shape.empty()) text(x + w / 2, y + h + 15, shape, 12, "middle", colour::grey);
    }
  }
  // An operation: a rounded box centred on (cx, cy) with one or more lines of text.
  void op(double cx, double cy, double w, double h, const std::vector<std::string>& ls, double size = 13) {
    rect(cx - w / 2, cy - h / 2, w, h, colour::op, false, 6);
    lines(cx, cy, ls, size);
  }
  // A polyline from the first point to the last, with an arrowhead at the end.
  void arrow(const std::vector<Pt>& pts, const char* stroke = colour::grey, bool dashed = false) {
    need_arrow_ = true;
    std::string p;
    for (const Pt& q : pts) p += fmt::format("{}{:.1f},{:.1f}", p.empty() ? "" : " ", q.x, q.y);
    body_ += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\"{} "
                         "marker-end=\"url(#arrow)\"/>\n",
                         p, stroke, dashed ? " stroke-dasharray=\"4 3\"" : "");
  }
  void arrow(Pt a, Pt b, const char* stroke = colour::grey, bool dashed = false) { arrow({a, b}, stroke, dashed); }
  // An arrow that leaves a horizontally, turns at x = turn_x, and enters b horizontally.
  void elbow(Pt a, Pt b, double turn_x, const char* stroke = colour::grey) {
    arrow({a, {turn_x, a.y}, {turn_x, b.y}, b}, stroke);
  }
  void line(Pt a, Pt b, const char* stroke = colour::grey, double width = 1.0, bool dashed = false) {
    body_ += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
                         "stroke-width=\"{:.1f}\"{}/>\n",
                         a.x, a.y, b.x, b.y, stroke, width, dashed ? " stroke-dasharray=\"4 3\"" : "");
  }
  // A rows x cols grid of cells at (x, y), the style of each from style_of(r, c); with `indices`,
  // row numbers on the left and column numbers on top (every `every`-th).
  template <class F>
  void grid(double x, double y, int rows, int cols, double cell, F style_of, bool indices = false, int every = 1) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const Style st = style_of(r, c);
        rect(x + c * cell, y + r * cell, cell, cell, st, false, 0, 0.6);
      }
    if (!indices) return;
    const double size = std::clamp(cell * 0.62, 9.0, 11.0);
    for (int r = 0; r < rows; r += every)
      text(x - 3, y + (r + 0.5) * cell + size * 0.35, fmt::format("{}", r), size, "end", colour::grey);
    for (int c = 0; c < cols; c += every)
      text(x + (c + 0.5) * cell, y - 3, fmt::format("{}", c), size, "middle", colour::grey);
  }

  std::string str() const {
    std::string s = fmt::format(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
        "font-family=\"sans-serif\">\n"
        "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
        w_, h_);
    if (need_arrow_)
      s += "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" "
           "markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555555\"/>"
           "</marker></defs>\n";
    return s + body_ + "</svg>\n";
  }

 private:
  int w_, h_;
  bool need_arrow_ = false;
  std::string body_;
};

}  // namespace docpics
