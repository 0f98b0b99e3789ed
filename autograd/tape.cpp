// The tape: recording (record) and replay (backward). See tape.h for the design.
#include "autograd/tape.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autograd/ops.h"

namespace ag {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_next_seq{0};  // tape position; only ordering matters
thread_local RecordHook g_record_hook;
thread_local GradReadyHook g_grad_ready_hook;
std::atomic<bool> g_track_grad_norms{false};
// The outermost CallSite alive on this thread (anomaly mode only): op null when there is none.
thread_local const char* g_site_op = nullptr;
thread_local Site g_site;
// True while backward runs on this thread: the ops inside backward functions are not checked
// one by one (backward checks what each node returns, and names the node).
thread_local bool g_in_backward = false;

// One pass over a tensor's values (copied to a dense host buffer first): how many are non-finite
// (or NaN only), the first of them, and the sum of squares for the L2 norm.
struct Scan {
  int64_t bad = 0;
  int64_t first = -1;  // flat row-major index of the first bad value
  double first_value = 0;
  double sumsq = 0;
};
Scan scan(const Tensor& t, OutputCheck what = OutputCheck::finite) {
  Scan r;
  if (!t.defined() || !is_floating(t.dtype())) return r;
  Tensor h = host_contiguous(t);
  auto run = [&](const auto* p) {
    for (int64_t i = 0, n = h.numel(); i < n; ++i) {
      const double v = double(p[i]);
      const bool bad = what == OutputCheck::finite ? !std::isfinite(v) : std::isnan(v);
      if (bad && r.bad++ == 0) r.first = i, r.first_value = v;
      r.sumsq += v * v;
    }
  };
  if (h.dtype() == DType::f32) run(h.data<float>());
  else run(h.data<double>());
  return r;
}

// A value for a message: NaN without the sign fmt would print ("-nan" from log(-1)).
double shown(double v) { return std::isnan(v) ? std::nan("") : v; }

std::string site_str(const char* op, const Site& s) {
  if (!op) return "an unknown site (anomaly mode was off when the op was recorded)";
  if (s.line() == 0) return fmt::format("an unknown site ('{}' was not called through a public op of ops.h)", op);
  return fmt::format("{}:{} ({})", s.file_name(), s.line(), s.function_name());
}
// "'mul' (inside 'mse_loss')" or "'log'": the innermost op and the outermost public call.
std::string op_str(const char* op, const char* outer) {
  if (!outer || std::string_view(outer) == op) return fmt::format("'{}'", op);
  return fmt::format("'{}' (inside '{}')", op, outer);
}

// Every node reachable from root, in decreasing sequence number (the tape, reversed).
std::vector<Node*> reachable_nodes(const Tensor& root) {
  std::vector<Node*> out, stack;
  std::unordered_set<Node*> seen;
  if (root.grad_fn()) stack.push_back(root.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    out.push_back(n);
    for (const Edge& e : n->next)
      if (e.node) stack.push_back(e.node.get());
  }
  std::sort(out.begin(), out.end(), [](Node* a, Node* b) { return a->seq > b->seq; });
  return out;
}

// leaf.grad += g (the first gradient is kept as is when nothing else can see its storage).
void accumulate_leaf(TensorImpl& leaf, const Tensor& g) {
  if (!leaf.grad) {
    bool exclusive = g.impl_ptr().use_count() == 1 && g.impl().storage.use_count() == 1 && g.is_contiguous();
    leaf.grad = exclusive ? g.impl_ptr() : g.clone().impl_ptr();
  } else if (Tensor old(leaf.grad); old.is_contiguous()) {
    old.add_(g);  // in place, as PyTorch: a handle the user took with .grad() sees the sum
  } else {
    leaf.grad = add(old, g).impl_ptr();  // a non-contiguous gradient given through set_grad()
  }
}
// Refuses to run n's backward when one of its tensors was written in place since the op ran.
// Storage-level and so stricter than needed for ops that save nothing (add, views), which PyTorch
// would let pass; but a write to a tensor a later backward reads never goes unnoticed.
void check_versions(const Node& n) {
  auto changed = [](const Node::Version& v) {
    std::shared_ptr<Storage> s = v.storage.lock();
    return s && s->version != v.version;
  };
  for (size_t i = 0; i < n.recorded.in_versions.size(); ++i)
    check(!changed(n.recorded.in_versions[i]),
          "backward: input {} of '{}' (shape {}) was modified by an in-place op after the forward pass "
          "used it; a tensor of a recorded graph must not change until backward has run (what an op "
          "saved would be stale): clone() it before writing to it",
          i, n.op, n.recorded.in_shapes[i]);
  check(!changed(n.recorded.out_version),
        "backward: the output of '{}' (shape {}) was modified by an in-place op after the forward pass "
        "computed it; a tensor of a recorded graph must not change until backward has run (what an op "
        "saved would be stale): clone() it before writing to it",
        n.op, n.recorded.out_shape);
}
// Anomaly mode, after node n's backward: every gradient it returned must be finite. The first that
// is not names the node, the input, the shapes and the forward call's line.
void check_gradients(const Node& n, const Tensor& dout, const std::vector<Tensor>& dinputs) {
  for (size_t i = 0; i < dinputs.size(); ++i) {
    const Scan r = scan(dinputs[i]);
    if (r.bad == 0) continue;
    const Scan rout = scan(dout);
    throw AnomalyError(fmt::format(
        "anomaly: backward of {} (node #{}) returned {} non-finite value{} (of {}; the first, {}, at flat index {}) "
        "in the gradient of input {} of shape {}; the gradient of its output (shape {}) {}; the forward op was "
        "called at {}",
        op_str(n.op, n.debug.site_op), n.seq, r.bad, r.bad == 1 ? "" : "s", dinputs[i].numel(), shown(r.first_value),
        r.first, i, n.recorded.in_shapes[i], n.recorded.out_shape,
        rout.bad ? fmt::format("was already non-finite ({} values)", rout.bad) : std::string("was finite"),
        site_str(n.debug.site_op, n.debug.site)));
  }
}
}  // namespace

Node::~Node() {
  // Destroying a node drops its edges, which may destroy the input nodes, and so on down the
  // chain: one nested destructor call per op, a stack overflow for a graph of a long loop (say a
  // loss summed over 10^5 steps and then dropped). Instead, input nodes that only this chain
  // holds are taken out of their edges and freed here one at a time.
  std::vector<std::shared_ptr<Node>> dying;
  auto take_inputs = [&dying](Node& n) {
    for (Edge& e : n.next)
      if (e.node && e.node.use_count() == 1) dying.push_back(std::move(e.node));
  };
  take_inputs(*this);
  while (!dying.empty()) {
    std::shared_ptr<Node> n = std::move(dying.back());
    dying.pop_back();
    take_inputs(*n);
  }  // n is freed here, with no node edges left to recurse into
}

bool grad_enabled() { return g_grad_enabled; }

void check_writable(const char* op, const Tensor& t) {
  check(!(t.requires_grad() && grad_enabled()),
        "{}: in-place write to a tensor that requires grad (shape {}); do it under NoGradGuard or on a "
        "detach()ed tensor",
        op, t.shape());
  for (int i = 0; i < t.ndim(); ++i)
    check(t.strides()[i] != 0 || t.shape()[i] <= 1,
          "{}: in-place write to an expanded tensor (shape {}, strides {}) would write one element many times",
          op, t.shape(), t.strides());
}
void set_grad_enabled(bool on) { g_grad_enabled = on; }

RecordHook set_record_hook(RecordHook hook) { return std::exchange(g_record_hook, std::move(hook)); }
GradReadyHook set_grad_ready_hook(GradReadyHook hook) {
  return std::exchange(g_grad_ready_hook, std::move(hook));
}

void detect_anomaly(bool on) { detail::anomaly_mode.store(on, std::memory_order_relaxed); }
void set_track_grad_norms(bool on) { g_track_grad_norms.store(on, std::memory_order_relaxed); }
bool track_grad_norms() { return g_track_grad_norms.load(std::memory_order_relaxed); }

bool CallSite::enter(const char* op, const Site& site) {
  if (g_site_op) return false;  // an outer call is already the site to report
  g_site_op = op;
  g_site = site;
  return true;
}
void CallSite::leave() { g_site_op = nullptr; }

void check_output(const char* op, const std::vector<Tensor>& inputs, const Tensor& out, OutputCheck what) {
  if (g_in_backward) return;
  const Scan r = scan(out, what);
  if (r.bad == 0) return;
  std::string ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {
      ins += fmt::format("{}input {}: none", i ? "; " : "", i);
      continue;
    }
    const Scan ri = scan(t);
    ins += fmt::format("{}input {}: {} {}{}", i ? "; " : "", i, t.shape(), t.dtype(),
                       ri.bad ? fmt::format(" (already non-finite: {} of {} values)", ri.bad, t.numel()) : "");
  }
  throw AnomalyError(fmt::format(
      "anomaly: {} produced {} {} value{} (of {}; the first, {}, at flat index {}) in its output of shape {} {}; {}; "
      "called at {}",
      op_str(op, g_site_op), r.bad, what == OutputCheck::finite ? "non-finite" : "NaN", r.bad == 1 ? "" : "s",
      out.numel(), shown(r.first_value), r.first, out.shape(), out.dtype(), ins.empty() ? "no inputs" : ins,
      site_str(g_site_op ? g_site_op : op, g_site_op ? g_site : Site())));
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}
bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record_node(const char* op, const std::vector<Tensor>& inputs, Tensor& out, BackwardFn fn, double kept) {
  auto node = std::make_shared<Node>();
  node->op = op;
  node->seq = g_next_seq++;
  node->next.reserve(inputs.size());
  Node::Recorded& r = node->recorded;
  r.in_shapes.reserve(inputs.size());
  r.in_versions.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined() && t.requires_grad()) {
      if (t.grad_fn()) e.node = t.grad_fn();
      else e.leaf = t.impl_ptr();
    }
    node->next.push_back(std::move(e));
    r.in_shapes.push_back(t.defined() ? t.shape() : Shape{});
    r.in_versions.push_back(t.defined() ? Node::Version{t.impl().storage, t.impl().storage->version}
                                        : Node::Version{});
  }
  r.out_version = {out.impl().storage, out.impl().storage->version};
  r.out_shape = out.shape();
  r.out_dtype = out.dtype();
  r.out_device = out.device();
  r.kept = kept;
  if (anomaly_enabled()) {  // already off the common path: a node is being made
    node->debug.site_op = g_site_op ? g_site_op : op;
    node->debug.site = g_site_op ? g_site : Site();
  }
  node->backward = std::move(fn);
  if (g_record_hook) g_record_hook(*node, out);
  out.impl().grad_fn = std::move(node);
  out.impl().requires_grad = true;
}

namespace {
// The gradient backward starts from: the one given, checked against the root, or 1 for a scalar.
Tensor root_gradient(const Tensor& root, const Tensor& gradient) {
  check(root.requires_grad(),
        "backward: the tensor does not require grad (no input of the ops that made it requires grad)");
  if (!gradient.defined()) {
    check(root.numel() == 1,
          "backward: output has shape {}; a non-scalar output needs an explicit gradient of that shape",
          root.shape());
    return ones_like(root);
  }
  check(gradient.shape() == root.shape(), "backward: gradient shape {} differs from output shape {}",
        gradient.shape(), root.shape());
  check(gradient.dtype() == root.dtype(), "backward: gradient dtype {} differs from output dtype {}",
        gradient.dtype(), root.dtype());
  return gradient;
}

// A node's backward must return one gradient per input, of that input's shape and dtype.
void check_gradients_fit(const Node& n, const std::vector<Tensor>& dinputs) {
  check(dinputs.size() == n.next.size(), "backward: '{}' returned {} gradients for {} inputs", n.op, dinputs.size(),
        n.next.size());
  for (size_t i = 0; i < dinputs.size(); ++i) {
    const Edge& e = n.next[i];
    const Tensor& d = dinputs[i];
    if (!e.active() || !d.defined()) continue;
    check(d.shape() == n.recorded.in_shapes[i],
          "backward: '{}' returned a gradient of shape {} for input {} of shape {}", n.op, d.shape(), i,
          n.recorded.in_shapes[i]);
    const DType want = e.node ? e.node->recorded.out_dtype : e.leaf->dtype;
    check(d.dtype() == want, "backward: '{}' returned a gradient of dtype {} for input {} of dtype {}", n.op,
          d.dtype(), i, want);
  }
}

// Step 4 of backward: each input's gradient goes where its edge leads, summed into the pending
// gradient of the node that made the input, or into a leaf's .grad.
void send_gradients(const Node& n, const std::vector<Tensor>& dinputs) {
  for (size_t i = 0; i < dinputs.size(); ++i) {
    const Edge& e = n.next[i];
    const Tensor& d = dinputs[i];
    if (!e.active() || !d.defined()) continue;
    if (e.node) e.node->pending.add(d);
    else accumulate_leaf(*e.leaf, d);
  }
}

// Step 4 for a slice or select node whose input was made by another node: its gradient goes
// straight into its part of that node's pending gradient (autograd/slice_grad.h), and its own
// backward, a zero-filled gradient of the whole input, is never made.
bool sends_to_part(const Node& n) { return n.slice_of_input && n.next.size() == 1 && n.next[0].node; }
void send_to_part(const Node& n, const Tensor& dout) {
  n.next[0].node->pending.add_to_part(*n.slice_of_input, dout, n.recorded.in_shapes[0]);
}

// The debugging aids of backward, kept out of its loop: anomaly checks, gradient norms and the
// gradient-ready hook. Each step costs a branch when its aid is off.
class BackwardAids {
 public:
  explicit BackwardAids(const std::vector<Node*>& tape)
      : anomaly_(anomaly_enabled()), norms_(anomaly_ || track_grad_norms()) {
    // With a gradient-ready hook: how many edges of the tape still lead into each leaf. A leaf's
    // gradient is final when the last node feeding it has run.
    if (g_grad_ready_hook)
      for (Node* n : tape)
        for (const Edge& e : n->next)
          if (e.leaf) ++leaf_edges_left_[e.leaf.get()];
  }
  // Anomaly mode: every gradient a node returns is checked.
  bool checks_gradients() const { return anomaly_; }
  // Anomaly mode: the gradient backward starts from must be finite.
  void check_root(const Tensor& g) const {
    if (!anomaly_) return;
    const Scan r = scan(g);
    if (r.bad)
      throw AnomalyError(fmt::format("anomaly: backward: the gradient given for the output (shape {}) holds {} "
                                     "non-finite value{}",
                                     g.shape(), r.bad, r.bad == 1 ? "" : "s"));
  }
  // Before node n runs: note that it ran, and the norm of the gradient flowing through it.
  void before(Node& n, const Tensor& dout) const {
    n.debug.backward_ran = true;
    if (norms_) n.debug.grad_norm = std::sqrt(scan(dout).sumsq);
  }
  // After node n ran: anomaly mode checks every gradient it returned.
  void after(const Node& n, const Tensor& dout, const std::vector<Tensor>& dinputs) const {
    if (anomaly_) check_gradients(n, dout, dinputs);
  }
  // Node n is done (run, or skipped for lack of a gradient): leaves fed by no later node are final.
  void done(const Node& n) {
    if (!g_grad_ready_hook) return;
    for (const Edge& e : n.next)
      if (e.leaf && --leaf_edges_left_[e.leaf.get()] == 0) g_grad_ready_hook(Tensor(e.leaf));
  }

 private:
  bool anomaly_, norms_;
  std::unordered_map<TensorImpl*, int> leaf_edges_left_;
};
}  // namespace

// The steps are those of docs/architecture.md, "How backward replays".
void backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
  const Tensor g = root_gradient(root, gradient);
  NoGradGuard no_grad;  // backward functions compute with recording off: no double backward
  // 1. the tape, reversed: every node the root depends on, by decreasing sequence number
  std::vector<Node*> tape = reachable_nodes(root);  // empty for a leaf
  BackwardAids aids(tape);
  aids.check_root(g);
  if (root.is_leaf()) {
    accumulate_leaf(root.impl(), g);
    if (g_grad_ready_hook) g_grad_ready_hook(root);
    return;
  }
  for (Node* n : tape)
    check(!n->released,
          "backward: the graph through '{}' was freed by an earlier backward; pass retain_graph=true to "
          "the first backward to run backward twice",
          n->op);

  // 2. the root's gradient: 1, or the one given
  root.grad_fn()->pending.clear();
  root.grad_fn()->pending.add(g);
  struct InBackward {  // restores the flag also when a node throws
    bool prev = std::exchange(g_in_backward, true);
    ~InBackward() { g_in_backward = prev; }
  } in_backward;
  try {
    for (Node* n : tape) {
      // 3. the summed gradient of the node's output (none reached it: nothing to run) and, once
      // nothing it saved was written in place since, its backward
      if (Tensor dout = n->pending.take(); dout.defined()) {
        check_versions(*n);
        aids.before(*n, dout);
        if (!aids.checks_gradients() && sends_to_part(*n)) {
          // 4, for a slice: its gradient straight into its part of its input's, no backward run
          // (anomaly mode checks what each backward returns, so there every node runs its own)
          send_to_part(*n, dout);
        } else {
          std::vector<Tensor> dinputs = n->backward(dout);
          // 4. each gradient checked against its input and sent on
          check_gradients_fit(*n, dinputs);
          aids.after(*n, dout, dinputs);
          send_gradients(*n, dinputs);
        }
      }
      aids.done(*n);
      // 5. what the op saved is freed; the node stays as an edge, marked used
      if (!retain_graph) {
        n->backward = nullptr;
        n->released = true;
      }
    }
  } catch (...) {
    for (Node* n : tape) n->pending.clear();  // no half-summed gradient may leak into a later backward
    throw;
  }
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  ag::backward(*this, gradient, retain_graph);
}

// ---- inspection -----------------------------------------------------------------------------
namespace {
std::unordered_map<const TensorImpl*, std::string> leaf_names(const LeafNames& names) {
  std::unordered_map<const TensorImpl*, std::string> m;
  for (const auto& [name, t] : names)
    if (t.defined()) m.emplace(t.impl_ptr().get(), name);
  return m;
}
}  // namespace

std::string print_graph(const Tensor& root, const LeafNames& names) {
  std::vector<Node*> tape = reachable_nodes(root);
  std::reverse(tape.begin(), tape.end());
  const auto leaf_name = leaf_names(names);
  std::string s;
  bool untracked = false;
  for (Node* n : tape) {
    const Node::Recorded& r = n->recorded;
    s += fmt::format("#{:<4} {:<14} -> {} {} {}", n->seq, n->op, r.out_shape, r.out_dtype, r.out_device);
    if (n->debug.backward_ran) {
      if (n->debug.grad_norm >= 0) s += fmt::format("  |grad| {:.6g}", n->debug.grad_norm);
      else s += "  |grad| ?", untracked = true;
    }
    s += n->released ? " (released)  inputs:" : "  inputs:";
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (e.node) {
        s += fmt::format(" #{}", e.node->seq);
      } else if (e.leaf) {
        auto it = leaf_name.find(e.leaf.get());
        s += fmt::format(" {}{}", it != leaf_name.end() ? it->second : "leaf", r.in_shapes[i]);
      } else {
        s += " const";
      }
    }
    s += '\n';
  }
  if (untracked)
    s += "(|grad| ?: gradient norms were not tracked; call ag::set_track_grad_norms(true), hold an "
         "ag::TrackGradNormsGuard or turn on ag::detect_anomaly(true) before backward)\n";
  return s;
}

std::vector<GraphEntry> graph_entries(const Tensor& root, const LeafNames& names) {
  std::vector<Node*> tape = reachable_nodes(root);
  std::reverse(tape.begin(), tape.end());  // inputs first
  const auto leaf_name = leaf_names(names);
  std::vector<GraphEntry> out;
  std::unordered_map<const void*, size_t> index;  // Node* or TensorImpl* -> entry
  for (Node* n : tape) {
    const Node::Recorded& r = n->recorded;
    GraphEntry node{.op = n->op, .seq = static_cast<int64_t>(n->seq), .shape = r.out_shape, .dtype = r.out_dtype,
                    .device = r.out_device, .has_grad = n->debug.backward_ran, .grad_norm = n->debug.grad_norm,
                    .inputs = {}};
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (e.node) {
        node.inputs.push_back(index.at(e.node.get()));
      } else if (e.leaf) {
        const TensorImpl* leaf = e.leaf.get();
        auto [it, fresh] = index.emplace(leaf, out.size());
        if (fresh) {
          auto name = leaf_name.find(leaf);
          GraphEntry l{.leaf = true, .op = name != leaf_name.end() ? name->second : std::string("leaf"),
                       .shape = r.in_shapes[i], .dtype = leaf->dtype, .device = leaf->storage->device, .inputs = {}};
          if (leaf->grad) l.has_grad = true, l.grad_norm = std::sqrt(scan(Tensor(leaf->grad)).sumsq);
          out.push_back(std::move(l));
        }
        node.inputs.push_back(it->second);
      }
    }
    index.emplace(n, out.size());
    out.push_back(std::move(node));
  }
  return out;
}

std::vector<std::string> graph_label(const GraphEntry& e) {
  std::vector<std::string> l;
  l.push_back(e.leaf ? e.op : fmt::format("{} #{}", e.op, e.seq));
  l.push_back(fmt::format("{} {} {}", e.shape, e.dtype, e.device));
  if (e.leaf && e.has_grad) l.push_back(fmt::format("|.grad| {:.6g}", e.grad_norm));
  if (!e.leaf && e.has_grad) l.push_back(e.grad_norm >= 0 ? fmt::format("|grad| {:.6g}", e.grad_norm) : "|grad| ?");
  return l;
}

std::string graph_to_dot(const Tensor& root, const LeafNames& names) {
  const std::vector<GraphEntry> g = graph_entries(root, names);
  auto id = [&](size_t i) { return g[i].leaf ? fmt::format("leaf{}", i) : fmt::format("n{}", g[i].seq); };
  std::string s = "digraph tape {\n  rankdir=BT;\n  node [shape=box, fontname=monospace];\n";
  for (size_t i = 0; i < g.size(); ++i) {
    const std::vector<std::string> label = graph_label(g[i]);
    std::string text = label[0];
    for (size_t k = 1; k < label.size(); ++k) text += "\\n" + label[k];
    s += fmt::format("  {} [label=\"{}\"{}];\n", id(i), text, g[i].leaf ? ", shape=ellipse" : "");
    for (size_t in : g[i].inputs) s += fmt::format("  {} -> {};\n", id(in), id(i));
  }
  return s + "}\n";
}

}  // namespace ag
