#include "swiglu.h"

namespace ext {

using ag::Tensor;
using ag::nn::Linear;

// snippet-begin: swiglu_cpp
SwiGLU::SwiGLU(int64_t dim, int64_t hidden, bool bias, ag::DType dtype, ag::Generator* gen)
    : dim(dim), hidden(hidden) {
  ag::check(dim > 0 && hidden > 0, "[SwiGLU] expected dim > 0 and hidden > 0, got dim = {}, hidden = {}", dim,
            hidden);
  // register_module names the children, so the parameters are "w1.weight", ... as in PyTorch
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden, bias, dtype, gen));
  w2 = register_module("w2", std::make_shared<Linear>(hidden, dim, bias, dtype, gen));
  w3 = register_module("w3", std::make_shared<Linear>(dim, hidden, bias, dtype, gen));
}

Tensor SwiGLU::forward(const Tensor& x) {
  ag::nn::ModuleScope scope(this);  // lets nn::summarize attribute the ops below to this layer
  ag::check(x.ndim() >= 1 && x.size(-1) == dim, "[SwiGLU] expected input of shape [..., {}], got {}", dim,
            x.shape());
  const Tensor gate = ag::silu(w1->forward(x));  // (..., hidden)
  const Tensor up = w3->forward(x);               // (..., hidden)
  return w2->forward(ag::mul(gate, up));          // (..., dim)
}
// snippet-end: swiglu_cpp

}  // namespace ext
