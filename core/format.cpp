#include "core/format.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ag {

namespace {
constexpr int64_t kThreshold = 1000;  // summarise above this many elements (as PyTorch)
constexpr int64_t kEdge = 3;          // entries kept at each end of a summarised dim

// Prints the nested brackets of a tensor whose values are already formatted, one string per
// element in row-major order (only the elements that are shown are ever formatted).
struct Printer {
  const Shape& shape;
  bool summarize;

  // indices along dim d that are shown (-1 marks the "..." gap)
  std::vector<int64_t> shown(int d) const {
    std::vector<int64_t> idx;
    const int64_t n = shape[d];
    if (!summarize || n <= 2 * kEdge) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < kEdge; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = n - kEdge; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }
  // Calls f(flat index) for every shown element, in print order.
  template <class F>
  void each_shown(int d, int64_t base, F&& f) const {
    if (d == shape.size()) return f(base);
    int64_t stride = 1;
    for (int k = d + 1; k < shape.size(); ++k) stride *= shape[k];
    for (int64_t i : shown(d))
      if (i >= 0) each_shown(d + 1, base + i * stride, f);
  }
  // cell(flat index) -> the formatted value, right-aligned to `width`
  template <class Cell>
  void print(int d, int64_t base, int indent, int width, const Cell& cell, std::string& out) const {
    if (d == shape.size()) {
      std::string c = cell(base);
      out += std::string(size_t(std::max(0, width - int(c.size()))), ' ') + c;
      return;
    }
    int64_t stride = 1;
    for (int k = d + 1; k < shape.size(); ++k) stride *= shape[k];
    out += '[';
    auto idx = shown(d);
    for (size_t j = 0; j < idx.size(); ++j) {
      if (j) {
        out += ',';
        if (d == shape.size() - 1) out += ' ';
        else out += std::string(size_t(shape.size() - d - 1), '\n') + std::string(size_t(indent + 1), ' ');
      }
      if (idx[j] < 0) out += "...";
      else print(d + 1, base + idx[j] * stride, indent + 1, width, cell, out);
    }
    out += ']';
  }
};

// The shown values as strings, in print order: floats fixed-point with 4 decimals, or scientific
// when the shown range demands it (largest >= 1e8 or smallest nonzero < 1e-4); integers exactly;
// b8 as PyTorch's True/False. Only shown elements are read, so printing a big tensor is cheap.
std::vector<std::string> format_values(const Tensor& t, const Printer& p) {
  const Tensor h = host_contiguous(t);
  std::vector<std::string> cells;
  if (t.dtype() == DType::i64) {
    const int64_t* v = h.data<int64_t>();
    p.each_shown(0, 0, [&](int64_t i) { cells.push_back(fmt::format("{}", v[i])); });
  } else if (t.dtype() == DType::b8) {
    const bool* v = h.data<bool>();
    p.each_shown(0, 0, [&](int64_t i) { cells.push_back(v[i] ? "True" : "False"); });
  } else {
    std::vector<double> v;
    visit_storage(t.dtype(), [&]<class T>() {  // f32, f64, or a 16-bit value read as its f32 (exact)
      const T* x = h.data<T>();
      p.each_shown(0, 0, [&](int64_t i) { v.push_back(storage_cast<double>(x[i])); });
    });
    double amax = 0, amin = INFINITY;
    for (double x : v)
      if (std::isfinite(x) && x != 0) amax = std::max(amax, std::abs(x)), amin = std::min(amin, std::abs(x));
    const bool sci = amax >= 1e8 || amin < 1e-4;
    for (double x : v)
      cells.push_back(std::isnan(x)   ? "nan"
                      : std::isinf(x) ? (x > 0 ? "inf" : "-inf")
                      : sci           ? fmt::format("{:.4e}", x)
                                      : fmt::format("{:.4f}", x));
  }
  return cells;
}
}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  const Printer p{t.shape(), t.numel() > kThreshold};
  const std::vector<std::string> cells = format_values(t, p);
  int width = 0;  // of the widest shown cell, for aligned columns
  for (const std::string& c : cells) width = std::max(width, int(c.size()));
  std::string body;
  size_t next = 0;  // print() visits the shown cells in the order format_values() made them
  p.print(0, 0, int(std::string("tensor(").size()), width, [&](int64_t) { return cells[next++]; }, body);
  std::string s = "tensor(" + body + fmt::format(", shape={}, dtype={}, device={}", t.shape(), t.dtype(), t.device());
  if (t.requires_grad()) s += ", requires_grad";
  return s + ")";
}

}  // namespace ag
