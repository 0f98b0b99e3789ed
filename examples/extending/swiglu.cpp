#include "swiglu.h"

namespace ext {

using ag::Tensor;
using ag::nn::Linear;

// snippet-begin: swiglu_cpp
SwiGLU::SwiGLU(int64_t dim, int64_t hidden, const SwiGLUOptions& o)
    : dim(dim), hidden(hidden), dropout(o.dropout), gen(o.gen) {
  ag::check(dim > 0 && hidden > 0, "[SwiGLU] expected dim > 0 and hidden > 0, got dim = {}, hidden = {}", dim,
            hidden);
  ag::check(o.dropout >= 0 && o.dropout < 1, "[SwiGLU] expected 0 <= dropout < 1, got {}", o.dropout);
  // register_module names the children, so their parameters are "w1.weight", ... as in PyTorch;
  // each Linear initialises its own weights (Kaiming uniform, as torch.nn.Linear)
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden, o.bias, o.dtype, o.gen));
  w2 = register_module("w2", std::make_shared<Linear>(hidden, dim, o.bias, o.dtype, o.gen));
  w3 = register_module("w3", std::make_shared<Linear>(dim, hidden, o.bias, o.dtype, o.gen));
  // a parameter of the layer itself: its initial value here, then trained (requires_grad is set)
  gamma = register_parameter("gamma", ag::full({dim}, o.layer_scale, o.dtype));
  // a buffer: state that state_dict() saves and to() moves, but no optimizer sees
  mask = register_buffer("mask", ag::ones({hidden}, o.dtype));
}

Tensor SwiGLU::forward(const Tensor& x) {
  ag::nn::ModuleScope scope(this);  // lets nn::summarize attribute the ops below to this layer
  ag::check(x.ndim() >= 1 && x.size(-1) == dim, "[SwiGLU] expected input of shape [..., {}], got {}", dim,
            x.shape());
  const Tensor gate = ag::silu(w1->forward(x));  // (..., hidden)
  const Tensor up = w3->forward(x);               // (..., hidden)
  // is_training() is what train() / eval() set (on this module and every descendant): dropout
  // zeroes and rescales in training only, and is the identity in eval
  const Tensor h = ag::dropout(gate * up * mask, dropout, is_training(), gen);
  return w2->forward(h) * gamma;  // (..., dim)
}
// snippet-end: swiglu_cpp

}  // namespace ext
