#include "core/format.h"

#include <cmath>
#include <vector>

namespace ag {

namespace {
constexpr int64_t kThreshold = 1000;  // summarise above this many elements (as PyTorch)
constexpr int64_t kEdge = 3;          // entries kept at each end of a summarised dim

struct Printer {
  const std::vector<double>& v;
  const Shape& shape;
  bool summarize;
  bool integral;
  bool sci;
  int width = 0;
  std::string out;

  std::string cell(double x) const {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (integral) return fmt::format("{:.0f}", x);
    return sci ? fmt::format("{:.4e}", x) : fmt::format("{:.4f}", x);
  }
  // indices along dim d that are shown (-1 marks the "..." gap)
  std::vector<int64_t> shown(int d) const {
    std::vector<int64_t> idx;
    int64_t n = shape[d];
    if (!summarize || n <= 2 * kEdge) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < kEdge; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = n - kEdge; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }
  void rec(int d, int64_t base, int indent) {
    if (d == shape.size()) {
      std::string c = cell(v[size_t(base)]);
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
      else rec(d + 1, base + idx[j] * stride, indent + 1);
    }
    out += ']';
  }
};
}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  std::vector<double> v = t.to_vector<double>();
  bool integral = !is_floating(t.dtype());
  double amax = 0, amin = INFINITY;
  for (double x : v)
    if (std::isfinite(x) && x != 0) amax = std::max(amax, std::abs(x)), amin = std::min(amin, std::abs(x));
  Printer p{v, t.shape(), t.numel() > kThreshold, integral, !integral && (amax >= 1e8 || amin < 1e-4)};
  // width of the widest shown cell, for aligned columns
  for (double x : v) p.width = std::max(p.width, int(p.cell(x).size()));
  if (t.ndim() == 0) p.out = p.cell(v[0]);
  else p.rec(0, 0, int(std::string("tensor(").size()));
  std::string s = "tensor(" + p.out + fmt::format(", shape={}, dtype={}, device={}", t.shape(), t.dtype(), t.device());
  if (t.requires_grad()) s += ", requires_grad";
  return s + ")";
}

}  // namespace ag
