#include "nn/summary.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "autograd/tape.h"
#include "core/allocator.h"

namespace ag::nn {

// ---- FLOPs: the one place the convention lives ----------------------------------------------

double op_flops(std::string_view op, const std::vector<Shape>& in, const Shape& out, bool* counted, double kept) {
  static const std::unordered_set<std::string_view> pointwise = {
      "add", "sub", "mul", "div", "neg", "pow", "maximum", "minimum", "where", "masked_fill", "clamp", "abs",
      "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "dropout"};
  static const std::unordered_set<std::string_view> reductions = {"sum", "max", "min", "var"};
  static const std::unordered_set<std::string_view> movement = {
      "view", "reshape", "permute", "transpose", "select", "slice", "narrow", "expand", "squeeze", "unsqueeze",
      "cat", "stack", "clone", "contiguous", "to_dtype", "to_device", "embedding", "index_select", "gather"};
  const auto n = double(out.numel());
  auto numel = [&](size_t i) { return i < in.size() ? double(in[i].numel()) : 0.0; };
  if (counted) *counted = true;
  if (op == "linear" && in.size() >= 2 && in[1].size() == 2) return 2.0 * double(in[1][1]) * n;  // w (out, in)
  if (op == "matmul" && !in.empty() && !in[0].empty()) return 2.0 * double(in[0][in[0].size() - 1]) * n;
  if (op == "scaled_dot_product_attention" && in.size() == 3 && in[0].size() == 4) {
    // q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv): S = q k^T, then P v, over the kept pairs
    const Shape &q = in[0], &k = in[1], &v = in[2];
    return 2.0 * double(q[0] * q[1]) * (kept * double(q[2] * k[2])) * double(q[3] + v[3]);
  }
  if (pointwise.count(op)) return n;
  if (reductions.count(op)) return numel(0);
  if (op == "softmax" || op == "log_softmax") return 5.0 * n;
  if (op == "layer_norm") return 7.0 * n;
  if (op == "cross_entropy" || op == "binary_cross_entropy_with_logits") return 5.0 * numel(0);
  if (movement.count(op)) return 0.0;
  if (counted) *counted = false;
  return 0.0;
}

// ---- the profiler ---------------------------------------------------------------------------

thread_local constinit ModuleProfiler* detail::t_module_profiler = nullptr;

class ModuleProfiler {
 public:
  std::vector<const Module*> stack;                 // open scopes, innermost last
  std::unordered_map<const Module*, size_t> row_of;  // module -> its row in the summary
  std::vector<double> self_flops;
  std::vector<int64_t> calls;
  struct Made {
    std::weak_ptr<Storage> storage;
    int64_t bytes;
    size_t row;
  };
  std::unordered_map<const Storage*, Made> made;  // storages ops allocated during the forward
  std::set<std::string> uncounted;

  // the innermost open scope's module that belongs to the model (row 0, the root, otherwise)
  size_t current_row() const {
    for (auto it = stack.rbegin(); it != stack.rend(); ++it)
      if (auto r = row_of.find(*it); r != row_of.end()) return r->second;
    return 0;
  }

  void on_record(const Node& node, const Tensor& out) {
    const size_t row = current_row();
    bool counted = false;
    self_flops[row] += op_flops(node.op, node.recorded.in_shapes, node.recorded.out_shape, &counted, node.recorded.kept);
    if (!counted) uncounted.insert(node.op);
    const std::shared_ptr<Storage>& st = out.impl().storage;
    if (!st) return;
    for (const Node::Version& v : node.recorded.in_versions)  // a view of an input allocated nothing
      if (v.storage.lock() == st) return;
    auto it = made.find(st.get());
    if (it != made.end() && !it->second.storage.expired()) return;  // already counted
    made[st.get()] = {st, int64_t(st->bytes), row};
  }
};

void detail::profiler_enter(ModuleProfiler* p, const Module* m) {
  p->stack.push_back(m);
  if (auto r = p->row_of.find(m); r != p->row_of.end()) ++p->calls[r->second];
}
void detail::profiler_leave(ModuleProfiler* p) { p->stack.pop_back(); }

namespace {

// "ag::nn::ModuleList<ag::nn::TransformerBlock>" -> "ModuleList<TransformerBlock>"
std::string type_name(const Module& m) {
  const char* mangled = typeid(m).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  for (const char* ns : {"ag::nn::", "ag::apps::", "ag::"})
    for (size_t at; (at = s.find(ns)) != std::string::npos;) s.erase(at, std::string_view(ns).size());
  return s;
}

// 3 significant digits with k/M/G/T (powers of 1000)
std::string count_text(double v) {
  const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (std::abs(v) >= 999.5 && u < 5) v /= 1000, ++u;
  if (u == 0) return v == double(int64_t(v)) ? fmt::format("{}", int64_t(v)) : fmt::format("{:.3g}", v);
  return fmt::format("{:.3g}{}", v, units[u]);
}
std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", int64_t(b)) : fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace

const ModuleStats* ModelSummary::find(const std::string& name) const {
  for (const ModuleStats& m : modules)
    if (m.name == name) return &m;
  return nullptr;
}

ModelSummary summarize(const Module& model, const std::function<Tensor()>& forward, int64_t samples,
                       int64_t tokens_per_sample) {
  check(samples >= 1 && tokens_per_sample >= 0, "summarize: need samples >= 1 and tokens_per_sample >= 0, got {} and {}",
        samples, tokens_per_sample);
  check(detail::t_module_profiler == nullptr, "summarize: another summarize is already running on this thread");
  const auto tree = model.named_modules();
  ModuleProfiler prof;
  for (size_t i = 0; i < tree.size(); ++i) prof.row_of.emplace(tree[i].second, i);
  prof.self_flops.assign(tree.size(), 0.0);
  prof.calls.assign(tree.size(), 0);

  ModelSummary s;
  s.samples = samples;
  s.tokens = samples * tokens_per_sample;
  const Device device = model.device();
  const auto before = int64_t(alloc_stats(device).bytes_in_use);
  reset_peak_bytes(device);
  {
    // the hook chains to the one it replaces; both it and the profiler are removed on any exit
    struct Installed {
      RecordHook prev;
      bool grad;
      explicit Installed(ModuleProfiler* p) : grad(grad_enabled()) {
        set_grad_enabled(true);
        detail::t_module_profiler = p;
        prev = set_record_hook(nullptr);
        set_record_hook([p, prev = prev](const Node& n, const Tensor& out) {
          if (prev) prev(n, out);
          p->on_record(n, out);
        });
      }
      ~Installed() {
        set_record_hook(prev);
        detail::t_module_profiler = nullptr;
        set_grad_enabled(grad);
      }
    } installed(&prof);
    Tensor out = forward();  // held while the live activations are counted
    const AllocStats after = alloc_stats(device);
    s.forward_bytes_in_use = int64_t(after.bytes_in_use) - before;
    s.forward_peak_bytes = int64_t(after.peak_bytes_in_use) - before;
    s.modules.resize(tree.size());
    for (const auto& [ptr, m] : prof.made)
      if (!m.storage.expired()) s.modules[m.row].self_activation_bytes += m.bytes;
  }

  std::map<std::string, size_t> row_by_name;
  for (size_t i = 0; i < tree.size(); ++i) {
    const auto& [name, m] = tree[i];
    ModuleStats& st = s.modules[i];
    st.name = name;
    st.type = type_name(*m);
    st.depth = name.empty() ? 0 : 1 + int(std::count(name.begin(), name.end(), '.'));
    std::unordered_set<const TensorImpl*> seen;
    for (const auto& [pn, p] : m->named_parameters())
      if (seen.insert(&p.impl()).second) st.parameters += p.numel();
    st.calls = prof.calls[i];
    st.flops = st.self_flops = prof.self_flops[i];
    st.activation_bytes = st.self_activation_bytes;
    row_by_name[name] = i;
  }
  s.modules[0].calls = std::max<int64_t>(s.modules[0].calls, 1);  // the root ran, scoped or not
  // inclusive sums: depth first order lists a parent before its descendants, so walk it backwards
  for (size_t i = tree.size(); i-- > 1;) {
    const std::string& name = s.modules[i].name;
    const size_t dot = name.rfind('.');
    const size_t parent = dot == std::string::npos ? 0 : row_by_name.at(name.substr(0, dot));
    s.modules[parent].flops += s.modules[i].flops;
    s.modules[parent].activation_bytes += s.modules[i].activation_bytes;
  }
  s.uncounted_ops.assign(prof.uncounted.begin(), prof.uncounted.end());
  return s;
}

std::string ModelSummary::to_text(int max_depth) const {
  if (modules.empty()) return "(empty summary)\n";
  std::vector<const ModuleStats*> rows;
  for (const ModuleStats& m : modules)
    if ((max_depth < 0 || m.depth <= max_depth) &&
        (m.depth == 0 || m.parameters > 0 || m.flops > 0 || m.activation_bytes > 0))
      rows.push_back(&m);
  auto label = [](const ModuleStats& m) {
    const std::string leaf = m.depth == 0 ? "(model)" : m.name.substr(m.name.rfind('.') + 1);
    return std::string(size_t(2 * m.depth), ' ') + leaf + (m.calls > 1 ? fmt::format(" x{}", m.calls) : "");
  };
  size_t wn = 6, wt = 4;
  for (const ModuleStats* m : rows) wn = std::max(wn, label(*m).size()), wt = std::max(wt, m->type.size());
  const double total = forward_flops();
  std::string s = fmt::format("{:<{}}  {:<{}}  {:>8}  {:>11}  {:>12}  {:>11}  {:>6}\n", "module", wn, "type", wt,
                              "params", "activations", "FLOPs/sample", tokens > 0 ? "FLOPs/token" : "", "share");
  for (const ModuleStats* m : rows)
    s += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>11}  {:>12}  {:>11}  {:>5.1f}%\n", label(*m), wn, m->type, wt,
                     count_text(double(m->parameters)), bytes_text(double(m->activation_bytes)),
                     count_text(m->flops / double(samples)),
                     tokens > 0 ? count_text(m->flops / double(tokens)) : std::string(),
                     total > 0 ? 100.0 * m->flops / total : 0.0);
  s += fmt::format("forward of {} sample{}{}: {} FLOPs ({} per sample), {} of activations held for backward "
                   "({} in use after the forward, peak {})\n",
                   samples, samples > 1 ? "s" : "", tokens > 0 ? fmt::format(" ({} tokens)", tokens) : "",
                   count_text(total), count_text(forward_flops_per_sample()), bytes_text(double(root().activation_bytes)),
                   bytes_text(double(forward_bytes_in_use)), bytes_text(double(forward_peak_bytes)));
  if (!uncounted_ops.empty()) {
    std::string ops;
    for (const auto& o : uncounted_ops) ops += (ops.empty() ? "" : ", ") + o;
    s += "not counted (outside the FLOP convention): " + ops + "\n";
  }
  return s;
}

}  // namespace ag::nn
