#pragma once
// The reverse-mode tape.
//
// Every differentiable op, when recording is on and one of its inputs requires grad, calls
// record(): it makes a Node holding the op's name, a sequence number (its place on the tape), one
// edge per input (where that input's gradient goes) and the backward function, which captures the
// tensors the op saved. The node is owned by the output tensor, and each node owns the nodes of its
// inputs through its edges, so a graph is exactly as alive as the tensors that can reach it.
//
// backward(y) collects the nodes reachable from y and runs them in decreasing sequence number: the
// tape replayed in reverse. A node's backward turns the gradient of its output into gradients of
// its inputs; each is added to the pending gradient of the input's node, or, for a leaf, to its
// .grad. Backward functions call kernels and tensor ops with recording off (no double backward).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ag {

// (gradient of the output) -> (gradient of each input; an undefined tensor for "none")
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& dout)>;

struct Edge {
  std::shared_ptr<Node> node;        // the gradient flows into this node's output...
  std::shared_ptr<TensorImpl> leaf;  // ...or accumulates into this leaf's .grad
  bool active() const { return node || leaf; }
};

struct Node {
  const char* op;                 // "softmax": what print_graph() shows
  uint64_t seq;                   // order of recording: the tape position
  std::vector<Edge> next;         // one per input, in the op's argument order
  std::vector<Shape> in_shapes;   // the tape checks each input gradient against these
  Shape out_shape;
  DType out_dtype;
  BackwardFn backward;            // null once released by a backward without retain_graph
  bool released = false;
  Tensor pending;                 // gradient of the output, summed while backward runs
  // Storage versions of each input and of the output when the op ran. An in-place write bumps
  // its storage's version, and backward refuses a node whose tensors changed since: what the op
  // saved would be stale. Weak pointers: the check keeps no memory alive (a storage that died was
  // not saved, so nothing can be stale).
  struct Version {
    std::weak_ptr<Storage> storage;
    uint64_t version = 0;
  };
  std::vector<Version> in_versions;
  Version out_version;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();  // frees the chain of input nodes iteratively (a long chain would overflow the stack)
};

// ---- recording ------------------------------------------------------------------------------
bool grad_enabled();
void set_grad_enabled(bool on);

// Turns recording off for its lifetime (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Every in-place write (fill_, copy_, add_, mul_, ...) calls this first: it refuses a tensor that
// requires grad while recording is on (the write would silently invalidate what the tape saved)
// and an expanded tensor (one element written many times).
void check_writable(const char* op, const Tensor& t);

// True when an op over `inputs` must be recorded: recording is on and one input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Records `out` as produced by `op` from `inputs`, with its backward. A no-op when nothing
// needs a gradient, so ops call it unconditionally; `fn` should capture saved tensors by value,
// and a saved output through out.detach() (a node must not own its own output).
void record_node(const char* op, const std::vector<Tensor>& inputs, Tensor& out, BackwardFn fn);
template <class F>
void record(const char* op, const std::vector<Tensor>& inputs, Tensor& out, F&& fn) {
  if (needs_grad(inputs)) record_node(op, inputs, out, BackwardFn(std::forward<F>(fn)));
}

// Runs the tape backward from `root`; see Tensor::backward.
void backward(const Tensor& root, const Tensor& gradient = Tensor(), bool retain_graph = false);

// ---- inspection -----------------------------------------------------------------------------
// The recorded graph behind `root`, one node a line, in tape order.
std::string graph_to_string(const Tensor& root);
// The same graph in Graphviz DOT.
std::string graph_to_dot(const Tensor& root);

}  // namespace ag
