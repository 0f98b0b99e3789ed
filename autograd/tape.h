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
//
// Inspection: print_graph(y) lists the nodes behind y (op, output shape, dtype, device and, once a
// backward has run with norm tracking or anomaly mode on, the norm of the gradient that flowed
// through each node); graph_to_dot(y) draws the same graph for Graphviz. Anomaly mode
// (detect_anomaly) checks every op's output and every node's input gradients for NaN/Inf and
// names the first op that made one, with the source line of the call that led to it.
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/slice_grad.h"
#include "core/tensor.h"

namespace ag {

// (gradient of the output) -> (gradient of each input; an undefined tensor for "none")
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& dout)>;

// Where an op was called from. Every public op of autograd/ops.h takes one as its last parameter,
// defaulted to the caller's line: Site::current() in a default argument is evaluated at the call.
// std::source_location's interface on the compiler builtins behind it, which GCC and Clang share
// (std::source_location itself needs Clang >= 15 with libstdc++; the fuzz build uses Debian's 14).
class Site {
 public:
  static constexpr Site current(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE(),
                                const char* function = __builtin_FUNCTION()) noexcept {
    Site s;
    s.file_ = file, s.line_ = line, s.function_ = function;
    return s;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr unsigned line() const noexcept { return line_; }  // 0: unknown
  constexpr const char* function_name() const noexcept { return function_; }

 private:
  const char* file_ = "";
  unsigned line_ = 0;
  const char* function_ = "";
};

struct Edge {
  std::shared_ptr<Node> node;        // the gradient flows into this node's output...
  std::shared_ptr<TensorImpl> leaf;  // ...or accumulates into this leaf's .grad
  bool active() const { return node || leaf; }
};

struct Node {
  // ---- the tape: what backward() itself needs ----------------------------------------------
  const char* op;                 // "softmax": what print_graph() shows
  uint64_t seq;                   // order of recording: the tape position
  std::vector<Edge> next;         // one per input, in the op's argument order
  BackwardFn backward;            // null once released by a backward without retain_graph
  bool released = false;
  // the gradient of the output, summed while backward runs (slices write into it by parts)
  PendingGrad pending;
  // For a slice or select: the part of its input that its output is. Backward then writes this
  // node's gradient into that part of the input node's pending gradient (autograd/slice_grad.h).
  using SliceOfInput = ag::SliceOfInput;
  std::optional<SliceOfInput> slice_of_input;

  // ---- what the op saw when it ran: backward checks each gradient against the shapes and
  // dtypes, and refuses a node whose tensors were written in place since (what the op saved
  // would be stale; in-place writes bump their storage's version through mark_modified). Weak
  // pointers: the check keeps no memory alive (a storage that died was not saved, so nothing can
  // be stale).
  struct Version {
    std::weak_ptr<Storage> storage;
    uint64_t version = 0;
  };
  struct Recorded {
    std::vector<Shape> in_shapes;
    std::vector<Version> in_versions;
    Shape out_shape;
    DType out_dtype;
    Device out_device;
    Version out_version;
    // the fraction of the work its shapes imply that the op does: the (query, key) pairs a sparse
    // attention pattern keeps (a window, a block mask) over Tq x Tk; 1 for every other op. The
    // FLOP count of nn/summary.h scales by it.
    double kept = 1;
  } recorded;

  // ---- debugging aids, filled only when they are on (print_graph shows them) ---------------
  struct Debug {
    // whether a backward ran this node, and ||g||_2 of the gradient of its output, measured only
    // while gradient norms are tracked or anomaly mode is on (-1: not measured)
    bool backward_ran = false;
    double grad_norm = -1;
    // with anomaly mode on at record time: the outermost public op whose call led to this node
    // (the node's own op when called directly) and that call's source line; null/empty otherwise
    const char* site_op = nullptr;
    Site site;
  } debug;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();  // frees the chain of input nodes iteratively (a long chain would overflow the stack)
};

// ---- anomaly mode ---------------------------------------------------------------------------
// With anomaly mode on, record() checks the output of every op (recording or not) and backward
// checks every gradient a node returns; the first NaN or Inf raises an AnomalyError naming the op,
// its shapes, and the source line of the outermost public op call that led to it (the user's
// line: an op called inside another op, e.g. the mul inside mse_loss, reports the line that
// called mse_loss). Off (the default) it costs one predictable branch in record() and in each
// public op's CallSite; on, each op's output is scanned once (copied to the host first when it
// lives on a GPU). The switch is process-wide, as PyTorch's; the call site is per thread.
namespace detail {
inline std::atomic<bool> anomaly_mode{false};
}
inline bool anomaly_enabled() { return detail::anomaly_mode.load(std::memory_order_relaxed); }
void detect_anomaly(bool on);

// Sets anomaly mode for its lifetime and restores the previous mode after.
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool on = true) : prev_(anomaly_enabled()) { detect_anomaly(on); }
  ~DetectAnomalyGuard() { detect_anomaly(prev_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// What anomaly mode raises: an ag::Error, so code that catches ag::Error sees it too.
struct AnomalyError : Error {
  using Error::Error;
};

// Marks the call of a public op (or of any function built from ops: a layer's forward) as the
// site to report. Only the outermost CallSite alive on the thread counts, so an op called inside
// another reports the outer call's line. With anomaly mode off it does nothing but test the
// switch: every public op opens with one,   CallSite at("softmax", site);
class CallSite {
 public:
  CallSite(const char* op, const Site& site) {
    if (anomaly_enabled()) [[unlikely]]
      owner_ = enter(op, site);
  }
  ~CallSite() {
    if (owner_) [[unlikely]]
      leave();
  }
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

 private:
  static bool enter(const char* op, const Site& site);  // true when no CallSite was active
  static void leave();
  bool owner_ = false;
};

// What the anomaly check of record() expects of an op's output. An op that computes values must
// give finite ones; where (and masked_fill, which is a where) only selects values it was given,
// so an infinity in its output is one it was handed on purpose (the -inf of an attention mask),
// and only NaN counts; a view shows values that already exist and is not checked (the op that
// reads them is).
enum class OutputCheck : uint8_t { finite, no_nan, none };

// The anomaly check of one op's output (record() calls it while anomaly mode is on): raises an
// AnomalyError when `out` holds a NaN (or an Inf, for OutputCheck::finite). Skipped while
// backward runs: the ops inside backward functions are checked per node by backward itself.
void check_output(const char* op, const std::vector<Tensor>& inputs, const Tensor& out, OutputCheck what);

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
// and a saved output through out.detach() (a node must not own its own output). Every op passes
// through here, so it is also where anomaly mode checks each output.
// `kept` becomes Node::Recorded::kept.
void record_node(const char* op, const std::vector<Tensor>& inputs, Tensor& out, BackwardFn fn, double kept = 1);
template <class F>
void record(const char* op, const std::vector<Tensor>& inputs, Tensor& out, F&& fn,
            OutputCheck what = OutputCheck::finite, double kept = 1) {
  if (anomaly_enabled() && what != OutputCheck::none) [[unlikely]]
    check_output(op, inputs, out, what);
  if (needs_grad(inputs)) record_node(op, inputs, out, BackwardFn(std::forward<F>(fn)), kept);
}

// Runs the tape backward from `root`; see Tensor::backward.
void backward(const Tensor& root, const Tensor& gradient = Tensor(), bool retain_graph = false);

// ---- hooks ----------------------------------------------------------------------------------
// Observers of the tape, per thread. An unset hook (the default) costs one branch.
//
// The record hook sees every node record_node makes, right after it is made, with the op's output
// (the module profiler of nn/summary.h counts FLOPs and activation bytes through it).
using RecordHook = std::function<void(const Node& node, const Tensor& out)>;
// The gradient-ready hook is called during backward when a leaf's .grad is final for this
// backward: every node of the tape that has an edge to the leaf has run. Data parallelism starts
// the all-reduce of a bucket of gradients through it while backward goes on. It fires at most
// once per leaf and backward, also for a leaf that received no gradient (its .grad is then as it
// was); leaves the tape does not reach never fire.
using GradReadyHook = std::function<void(const Tensor& leaf)>;
// Each setter installs `hook` for this thread and returns the one it replaces.
RecordHook set_record_hook(RecordHook hook);
GradReadyHook set_grad_ready_hook(GradReadyHook hook);

// ---- inspection -----------------------------------------------------------------------------
// Gradient norms per node cost a pass over every gradient, so backward measures them only when
// asked: set_track_grad_norms(true), a TrackGradNormsGuard around backward, or anomaly mode
// (which scans those gradients anyway). Process-wide, like anomaly mode.
void set_track_grad_norms(bool on);
bool track_grad_norms();
class TrackGradNormsGuard {
 public:
  explicit TrackGradNormsGuard(bool on = true) : prev_(track_grad_norms()) { set_track_grad_norms(on); }
  ~TrackGradNormsGuard() { set_track_grad_norms(prev_); }
  TrackGradNormsGuard(const TrackGradNormsGuard&) = delete;
  TrackGradNormsGuard& operator=(const TrackGradNormsGuard&) = delete;

 private:
  bool prev_;
};

// Names for leaves, matched by identity (the same tensor, not equal values): pass
// model.named_parameters() to see "fc1.weight[4,3]" instead of "leaf[4,3]".
using LeafNames = std::vector<std::pair<std::string, Tensor>>;

// The recorded graph behind `root`, one node a line, in tape order:
//   #12   mul            -> [4] f32 cpu  |grad| 2.5  inputs: #11 w[4]
// op, output shape, dtype, device, the norm of the gradient of the node's output once a backward
// ran it (measured when norms are tracked; else a last line says how to get them), and where each
// input came from: a node (#seq), a leaf (its name, or "leaf", and its shape) or a constant.
// Empty for a tensor without history (a leaf, or one computed under NoGradGuard).
std::string print_graph(const Tensor& root, const LeafNames& names = {});
// print_graph without names (the name it had first).
inline std::string graph_to_string(const Tensor& root) { return print_graph(root); }
// The same graph in Graphviz DOT (render with `dot -Tsvg`): a box per node labelled with op, seq,
// shape, dtype, device and gradient norm, an ellipse per leaf (named when `names` has it, with
// the norm of its .grad), an edge from each input to its consumer.
std::string graph_to_dot(const Tensor& root, const LeafNames& names = {});

// The same graph as data, for a program that draws it (graph_to_dot and the apps' svg_graph):
// one entry per node and per leaf, every entry after the entries of its inputs. Constant inputs
// (no grad needed) are left out.
struct GraphEntry {
  bool leaf = false;
  std::string op;          // node: the op ("matmul"); leaf: its name from `names`, or "leaf"
  int64_t seq = -1;        // node: its sequence number; leaf: -1
  Shape shape;             // node: its output's; leaf: its own
  DType dtype = DType::f32;
  Device device = Device::cpu();
  // node: whether a backward ran it, and the norm of the gradient of its output (-1 when norms
  // were not tracked); leaf: whether it has a .grad, and that gradient's norm
  bool has_grad = false;
  double grad_norm = -1;
  std::vector<size_t> inputs;  // indices of the entries it reads, in argument order
};
std::vector<GraphEntry> graph_entries(const Tensor& root, const LeafNames& names = {});
// An entry's label, one line each: {"mul #12", "[4] f32 cpu", "|grad| 2.5"} for a node ("|grad| ?"
// when the norm was not tracked, no third line before a backward), {"w", "[4] f32 cpu",
// "|.grad| 2.5"} for a leaf (no third line without a .grad).
std::vector<std::string> graph_label(const GraphEntry& e);

}  // namespace ag
