#include "autograd/recompute.h"

#include "autograd/autocast.h"
#include "autograd/tape.h"

namespace ag {

namespace {
// Turns recording on for its lifetime (backward closures otherwise run with it off).
struct EnableGradGuard {
  bool prev = grad_enabled();
  EnableGradGuard() { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev); }
};
// Removes this thread's gradient-ready hook for its lifetime.
struct HookPause {
  GradReadyHook hook = set_grad_ready_hook(nullptr);
  ~HookPause() { set_grad_ready_hook(std::move(hook)); }
};
}  // namespace

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const std::vector<Tensor>& params,
                  std::vector<Generator*> generators) {
  if (generators.empty()) generators = {&default_generator()};
  std::vector<uint64_t> start;  // where each generator stood before the forward
  for (Generator* g : generators) {
    check(g != nullptr, "checkpoint: null generator");
    start.push_back(g->offset());
  }
  Tensor y;
  {
    NoGradGuard no_grad;                // no graph: nothing inside f is kept,
    NoBf16WeightCopiesGuard no_copies;  // nor bf16 copies of its weights (autocast.h)
    y = f(x);
  }
  check(y.defined() && is_floating(y.dtype()), "checkpoint: f must return a floating tensor");
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  const size_t n = inputs.size();
  record("checkpoint", inputs, y,
         [f, xd = x.detach(), x_grad = x.requires_grad(), generators, start, n](const Tensor& g) {
           std::vector<uint64_t> now;
           for (size_t i = 0; i < generators.size(); ++i) {
             now.push_back(generators[i]->offset());
             generators[i]->set_offset(start[i]);  // the same random numbers as the forward
           }
           Tensor xin = xd.detach();
           if (x_grad) xin.set_requires_grad(true);
           Tensor yr;
           {
             EnableGradGuard grad_on;
             yr = f(xin);
           }
           for (size_t i = 0; i < generators.size(); ++i) generators[i]->set_offset(now[i]);
           // parameters accumulate their gradients here, as leaves of the recomputed graph. The
           // gradient-ready hook stays quiet meanwhile: the outer backward calls it for them once this
           // node is done (its edges reach them), and data parallelism wants each leaf once
           {
             HookPause pause;
             if (yr.requires_grad()) backward(yr, g);
           }
           std::vector<Tensor> d(n);  // parameters: already accumulated, so none through the tape
           d[0] = x_grad ? xin.grad() : Tensor();
           return d;
         });
  return y;
}

}  // namespace ag
