// The tape: recording (record) and replay (backward). See tape.h for the design.
#include "autograd/tape.h"

#include <algorithm>
#include <atomic>
#include <unordered_set>

#include "autograd/ops.h"

namespace ag {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_next_seq{0};  // tape position; only ordering matters

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
  for (size_t i = 0; i < n.in_versions.size(); ++i)
    check(!changed(n.in_versions[i]),
          "backward: input {} of '{}' (shape {}) was modified by an in-place op after the forward pass "
          "used it; a tensor of a recorded graph must not change until backward has run (what an op "
          "saved would be stale): clone() it before writing to it",
          i, n.op, n.in_shapes[i]);
  check(!changed(n.out_version),
        "backward: the output of '{}' (shape {}) was modified by an in-place op after the forward pass "
        "computed it; a tensor of a recorded graph must not change until backward has run (what an op "
        "saved would be stale): clone() it before writing to it",
        n.op, n.out_shape);
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

void record_node(const char* op, const std::vector<Tensor>& inputs, Tensor& out, BackwardFn fn) {
  auto node = std::make_shared<Node>();
  node->op = op;
  node->seq = g_next_seq++;
  node->next.reserve(inputs.size());
  node->in_shapes.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined() && t.requires_grad()) {
      if (t.grad_fn()) e.node = t.grad_fn();
      else e.leaf = t.impl_ptr();
    }
    node->next.push_back(std::move(e));
    node->in_shapes.push_back(t.defined() ? t.shape() : Shape{});
    node->in_versions.push_back(t.defined() ? Node::Version{t.impl().storage, t.impl().storage->version}
                                            : Node::Version{});
  }
  node->out_version = {out.impl().storage, out.impl().storage->version};
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->backward = std::move(fn);
  out.impl().grad_fn = std::move(node);
  out.impl().requires_grad = true;
}

void backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
  check(root.requires_grad(),
        "backward: the tensor does not require grad (no input of the ops that made it requires grad)");
  Tensor g = gradient;
  if (!g.defined()) {
    check(root.numel() == 1,
          "backward: output has shape {}; a non-scalar output needs an explicit gradient of that shape",
          root.shape());
    g = ones_like(root);
  }
  check(g.shape() == root.shape(), "backward: gradient shape {} differs from output shape {}", g.shape(),
        root.shape());
  check(g.dtype() == root.dtype(), "backward: gradient dtype {} differs from output dtype {}", g.dtype(),
        root.dtype());
  NoGradGuard no_grad;
  if (root.is_leaf()) return accumulate_leaf(root.impl(), g);

  std::vector<Node*> tape = reachable_nodes(root);
  for (Node* n : tape)
    check(!n->released,
          "backward: the graph through '{}' was freed by an earlier backward; pass retain_graph=true to "
          "the first backward to run backward twice",
          n->op);
  root.grad_fn()->pending = g;
  try {
    for (Node* n : tape) {
      Tensor dout = std::move(n->pending);
      n->pending = Tensor();
      if (dout.defined()) {
        check_versions(*n);
        std::vector<Tensor> dinputs = n->backward(dout);
        check(dinputs.size() == n->next.size(), "backward: '{}' returned {} gradients for {} inputs", n->op,
              dinputs.size(), n->next.size());
        for (size_t i = 0; i < dinputs.size(); ++i) {
          const Edge& e = n->next[i];
          const Tensor& d = dinputs[i];
          if (!e.active() || !d.defined()) continue;
          check(d.shape() == n->in_shapes[i],
                "backward: '{}' returned a gradient of shape {} for input {} of shape {}", n->op, d.shape(), i,
                n->in_shapes[i]);
          const DType want = e.node ? e.node->out_dtype : e.leaf->dtype;
          check(d.dtype() == want, "backward: '{}' returned a gradient of dtype {} for input {} of dtype {}",
                n->op, d.dtype(), i, want);
          if (e.node) e.node->pending = e.node->pending.defined() ? add(e.node->pending, d) : d;
          else accumulate_leaf(*e.leaf, d);
        }
      }
      if (!retain_graph) {  // free what the op saved; the node stays as an edge, marked used
        n->backward = nullptr;
        n->released = true;
      }
    }
  } catch (...) {
    for (Node* n : tape) n->pending = Tensor();  // no half-summed gradient may leak into a later backward
    throw;
  }
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  ag::backward(*this, gradient, retain_graph);
}

Tensor& Tensor::set_requires_grad(bool on) {
  check(!on || is_floating(dtype()), "requires_grad: only floating tensors can require grad, got {}", dtype());
  check(is_leaf(), "requires_grad: only leaves can change requires_grad; use detach() for a new leaf");
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return Tensor(impl().grad); }

void Tensor::set_grad(const Tensor& g) {
  check(!g.defined() || g.shape() == shape(), "set_grad: gradient shape {} differs from tensor shape {}",
        g.defined() ? g.shape() : Shape{}, shape());
  check(!g.defined() || g.dtype() == dtype(), "set_grad: gradient dtype {} differs from tensor dtype {}",
        g.defined() ? g.dtype() : dtype(), dtype());
  impl().grad = g.impl_ptr();
}

Tensor Tensor::detach() const {
  auto d = std::make_shared<TensorImpl>();
  d->shape = shape();
  d->strides = strides();
  d->offset = offset();
  d->dtype = dtype();
  d->storage = impl().storage;
  return Tensor(std::move(d));
}

// ---- inspection -----------------------------------------------------------------------------
std::string graph_to_string(const Tensor& root) {
  std::vector<Node*> tape = reachable_nodes(root);
  std::reverse(tape.begin(), tape.end());
  std::string s;
  for (Node* n : tape) {
    s += fmt::format("#{:<4} {:<14} -> {} {}{}  inputs:", n->seq, n->op, n->out_shape, n->out_dtype,
                     n->released ? " (released)" : "");
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (e.node) s += fmt::format(" #{}", e.node->seq);
      else if (e.leaf) s += fmt::format(" leaf{}", n->in_shapes[i]);
      else s += " const";
    }
    s += '\n';
  }
  return s;
}

std::string graph_to_dot(const Tensor& root) {
  std::vector<Node*> tape = reachable_nodes(root);
  std::string s = "digraph tape {\n  rankdir=BT;\n  node [shape=box, fontname=monospace];\n";
  for (Node* n : tape) {
    s += fmt::format("  n{} [label=\"{}\\n{} {}\"];\n", n->seq, n->op, n->out_shape, n->out_dtype);
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (e.node) {
        s += fmt::format("  n{} -> n{};\n", e.node->seq, n->seq);
      } else if (e.leaf) {
        s += fmt::format("  leaf{} [label=\"leaf {}\", shape=ellipse];\n  leaf{} -> n{};\n",
                         fmt::ptr(e.leaf.get()), n->in_shapes[i], fmt::ptr(e.leaf.get()), n->seq);
      }
    }
  }
  return s + "}\n";
}

}  // namespace ag
