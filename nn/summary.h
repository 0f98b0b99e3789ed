#pragma once
// A per-layer report of a model: where its parameters, its activation memory and its compute go.
//
//   nn::ModelSummary s = nn::summarize(model, [&] { return model.forward(x); }, B, T);
//   fmt::print("{}", s.to_text());      // the module tree with params, activations, FLOPs
//   s.forward_flops_per_sample()        // what MFU is computed from (apps/common/report.h)
//
// How it measures: summarize runs the forward once with recording on and a profiler active on
// this thread. Each built-in layer's forward opens a ModuleScope (nn/module.h), so the profiler
// knows the innermost module running; the tape's record hook (autograd/tape.h) shows it every
// op recorded, with its name and shapes. Ops are recorded only when an input requires grad, which
// every op downstream of a parameter does; an op on raw input before any parameter (RMSNorm of
// the data) is seen only when the input requires grad (summarize leaves that to the caller).
//
// FLOPs (forward, one call; op_flops below is the whole convention, in one function):
//   linear, matmul                 2 K numel(out)       a multiply and an add per term; a bias is
//                                                       not counted
//   scaled_dot_product_attention   2 B H P (D + Dv)     q k^T and p v over the P (query, key)
//                                                       pairs its pattern keeps: P = Tq Tk, or
//                                                       fewer with a window or a block mask (the
//                                                       kernels skip the rest; Node::Recorded::
//                                                       kept = P / (Tq Tk)); causal and padding
//                                                       masks count in full; its softmax not
//   pointwise ops (add, mul, gelu, where, dropout, ...)      numel(out)
//   reductions (sum, max, var)     numel(input)
//   softmax, log_softmax           5 numel(out)         max, subtract, exp, sum, divide
//   layer_norm                     7 numel(out)         mean, subtract, square, sum, scale, weight, bias
//   cross_entropy                  5 numel(logits)      its log-softmax
//   data movement (views, cat, embedding, index_select, clone, to_dtype, ...)   0
// Anything else counts 0 and is listed in ModelSummary::uncounted_ops.
// An op belongs to the innermost open scope's module (its "self" FLOPs; an op outside every scope,
// e.g. the residual adds of a model's own forward, belongs to the root); a module's FLOPs are
// inclusive: its own plus its descendants'.
//
// Activation memory: the bytes of every tensor an op allocated inside the module's forward (a new
// storage, not a view of its input) that are still alive when the whole forward returns, with its
// output held: what the tape keeps for backward (and the output). Each storage is counted once,
// for the module whose op made it; inclusive like FLOPs. So a parent's bytes are at least its
// children's sum, and the root's are what the forward adds to memory (tensors an op allocates
// without returning them, such as layer_norm's saved mean, are in forward_bytes_in_use but in no
// module's row: see untracked_bytes()).
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "nn/module.h"

namespace ag::nn {

// Forward FLOPs of one recorded op from its name and shapes, by the convention above. `counted`
// (when not null) is set to whether the op is in the convention (false: unknown, 0 returned).
// `kept` is the node's Recorded::kept: the fraction of an attention's Tq x Tk pairs it computes.
double op_flops(std::string_view op, const std::vector<Shape>& in_shapes, const Shape& out_shape,
                bool* counted = nullptr, double kept = 1);

struct ModuleStats {
  std::string name;          // dotted path, "" for the root
  std::string type;          // "Linear", "MultiHeadAttention", ...
  int depth = 0;             // 0 for the root
  int64_t parameters = 0;    // inclusive, each parameter counted once
  int64_t calls = 0;         // forwards of this module during the profiled forward
  double flops = 0;          // inclusive forward FLOPs for the whole batch
  double self_flops = 0;     // the ops of its own forward outside its children's
  int64_t activation_bytes = 0;       // inclusive, see above
  int64_t self_activation_bytes = 0;
};

struct ModelSummary {
  std::vector<ModuleStats> modules;  // named_modules() order: the root first, depth first
  int64_t samples = 0;               // the batch the forward ran on
  int64_t tokens = 0;                // samples * tokens per sample (0: not a sequence model)
  int64_t forward_bytes_in_use = 0;  // allocator: bytes in use after the forward minus before
  int64_t forward_peak_bytes = 0;    // allocator: peak during the forward minus before
  std::vector<std::string> uncounted_ops;  // recorded ops outside the FLOP convention (sorted)

  const ModuleStats& root() const { return modules.front(); }
  // nullptr when no module has that name
  const ModuleStats* find(const std::string& name) const;
  double forward_flops() const { return modules.empty() ? 0 : root().flops; }
  double forward_flops_per_sample() const { return samples > 0 ? forward_flops() / double(samples) : 0; }
  double forward_flops_per_token() const { return tokens > 0 ? forward_flops() / double(tokens) : 0; }
  // Bytes the forward left in use that no module's row accounts for (saved internals of ops).
  int64_t untracked_bytes() const { return forward_bytes_in_use - (modules.empty() ? 0 : root().activation_bytes); }

  // The tree as a table: name (indented by depth), type, parameters, activations, FLOPs per
  // sample and per token (when tokens > 0) and share of the total; modules deeper than
  // `max_depth` are folded into their parent's row (-1: all). Modules with no parameters, no
  // FLOPs and no activations (an identity Dropout) are left out.
  std::string to_text(int max_depth = -1) const;
};

// Runs `forward` (one forward of `model`, returning its output) once with recording on and the
// profiler active, and reports per module. `samples` is the batch size, `tokens_per_sample` the
// sequence length (0 for a model without one). The model's mode is left as it is (train() or
// eval(): dropout differs). Nothing persists afterwards: the hook and the profiler are removed,
// the output and its graph released. Raises ag::Error for samples < 1 or tokens_per_sample < 0,
// and when another summarize is already running on this thread.
ModelSummary summarize(const Module& model, const std::function<Tensor()>& forward, int64_t samples,
                       int64_t tokens_per_sample = 0);

}  // namespace ag::nn
