#pragma once
// Activation checkpointing (recomputation), PyTorch's torch.utils.checkpoint: y = f(x) without keeping f's activations for backward. Backward runs f
// again on x, with recording on, and backpropagates the output gradient through that recomputed
// graph. Memory: between forward and backward only x and y stay alive, not every activation
// inside f; cost: one more forward of f during backward.
//
// Parameters f uses are leaves of the recomputed graph, so their gradients accumulate into their
// .grad during that inner backward. List them in `params`: the checkpoint is then recorded even
// when x itself needs no gradient (an input straight from data).
// Random numbers: the generators in `generators` (default: the process-wide one) are rewound to
// where they stood before the forward, so dropout draws the same masks in the recomputation; pass
// every Generator f's layers draw from.
#include <functional>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace ag {

// ===================== checkpointing (autograd/recompute.cpp) =================================
// checkpoint: y = f(x), trading memory for a second forward of f in backward
//   forward: y = f(x), run with recording off: nothing inside f is kept
//   vjp:     backward runs f(x) again with recording on and backpropagates g through that graph:
//            dx = (df/dx)^T g; the parameters in `params` get theirs there, into their .grad
//   shapes:  x [...] -> y of f's output shape
//   saves:   x, f, and where each generator stood before the forward
//   note:    the gradients equal those of f(x) without checkpointing, dropout's too when every
//            generator f draws from is in `generators` (the recomputation redraws the same masks)
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                  const std::vector<Tensor>& params = {}, std::vector<Generator*> generators = {});

}  // namespace ag
