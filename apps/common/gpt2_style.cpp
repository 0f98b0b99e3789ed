#include "apps/common/gpt2_style.h"

#include <cmath>
#include <string>

#include "autograd/recompute.h"
#include "autograd/tape.h"
#include "nn/init.h"

namespace ag::apps {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> make_blocks(int64_t n, int64_t d, int64_t heads,
                                                                  const nn::TransformerBlock::Options& options) {
  auto list = std::make_shared<nn::ModuleList<nn::TransformerBlock>>();
  for (int64_t i = 0; i < n; ++i) list->push_back(std::make_shared<nn::TransformerBlock>(d, heads, options));
  return list;
}

// snippet-begin: block_forward
Tensor block_forward(nn::Module& block, const std::function<Tensor(const Tensor&)>& f, const Tensor& x, bool recompute,
                     Generator* gen) {
  if (!recompute || !grad_enabled() || !block.is_training()) return f(x);  // no backward will follow
  // every parameter: each gets its gradient in the recomputation; gen: dropout redraws its masks
  return checkpoint(f, x, block.parameters(), {gen ? gen : &default_generator()});
}
// snippet-end: block_forward

void init_gpt2_style(nn::Module& model, int64_t n_layers, Generator* gen) {
  NoGradGuard no_grad;
  const double std_resid = 0.02 / std::sqrt(2.0 * double(n_layers));
  for (auto& [name, p] : model.named_parameters()) {
    if (p.ndim() >= 2) {
      const bool resid = ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.fc2.weight") ||
                         ends_with(name, "mlp.w2.weight");
      p.copy_(nn::init::normal(p.shape(), 0.0, resid ? std_resid : 0.02, p.dtype(), gen));
    } else if (ends_with(name, "bias")) {
      p.fill_(0.0);
    }  // LayerNorm and RMSNorm weights keep their 1
  }
}

}  // namespace ag::apps
