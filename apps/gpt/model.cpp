#include "apps/gpt/model.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "apps/common/gpt2_style.h"
#include "autograd/ops.h"

namespace ag::apps {

const std::vector<std::string>& gpt_choices(const std::string& field) {
  static const std::vector<std::string> pos{"learned", "sinusoidal", "rope", "alibi"}, mlp{"gelu", "swiglu"},
      norm{"layernorm", "rmsnorm"};
  if (field == "pos") return pos;
  if (field == "mlp_kind") return mlp;
  check(field == "norm", "gpt_choices: no field '{}' (pos, mlp_kind, norm)", field);
  return norm;
}

GPT::GPT(const GPTConfig& c, Generator* gen) : cfg(c), dropout_gen(gen) {
  check(c.vocab > 0 && c.context > 0 && c.n_layers > 0, "GPT: vocab {}, context {} and n_layers {} must be positive",
        c.vocab, c.context, c.n_layers);
  const auto& positions = gpt_choices("pos");
  check(std::find(positions.begin(), positions.end(), c.pos) != positions.end(), "GPT: pos '{}': expected one of {}",
        c.pos, fmt::join(positions, ", "));
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab, c.d_model, std::nullopt, DType::f32, gen));
  if (c.pos == "learned")
    wpe = register_module("wpe", std::make_shared<nn::LearnedPositions>(c.context, c.d_model, DType::f32, gen));
  const nn::TransformerBlock::Options block{
      .mlp_hidden = c.mlp_hidden,
      .dropout = c.dropout,
      .causal = true,
      .norm = c.norm,
      .mlp = c.mlp_kind,
      .attention = {.kv_heads = c.kv_heads, .positions = c.pos == "rope" || c.pos == "alibi" ? c.pos : "none"},
      .generator = gen};
  blocks = register_module("blocks", make_blocks(c.n_layers, c.d_model, c.n_heads, block));
  ln_f = register_module("ln_f", nn::make_norm(c.norm, c.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.vocab, false, DType::f32, gen));
  init_gpt2_style(*this, c.n_layers, gen);
}

Tensor GPT::forward(const Tensor& idx, std::vector<nn::KVCache>* caches) {
  check(idx.ndim() == 2 && idx.dtype() == DType::i64, "GPT: expected token ids i64 [B, T], got {} {}", idx.dtype(),
        idx.shape());
  check(caches == nullptr || int64_t(caches->size()) == cfg.n_layers, "GPT: {} KV caches given for {} blocks",
        caches ? caches->size() : 0, cfg.n_layers);
  const int64_t T = idx.size(1), start = caches ? (*caches)[0].length() : 0;
  check(cfg.has_positions(start + T),
        "GPT: positions {}..{} exceed the {} learned positions of the context: a model with --pos learned has no "
        "embedding past them (sinusoidal, rope and alibi positions do)",
        start, start + T - 1, cfg.context);
  // the ids may come from the host: they go where the weights are (no copy when already there)
  Tensor h = wte->forward(idx.to(device()));  // (B, T, d)
  if (wpe) h = h + wpe->forward(T, start);     // + (T, d)
  if (cfg.pos == "sinusoidal")  // the Transformer paper's sum: embeddings times sqrt(d), + PE
    h = h * std::sqrt(double(cfg.d_model)) +
        nn::sinusoidal_positions(start + T, cfg.d_model).narrow(0, start, T).to(h.device());
  for (size_t i = 0; i < blocks->size(); ++i) {
    nn::AttentionOptions o;
    o.cache = caches ? &(*caches)[i] : nullptr;
    o.need_weights = need_weights;
    nn::TransformerBlock& block = (*blocks)[i];
    // decoding with caches appends to them: recomputing would append twice
    h = block_forward(block, [&block, o](const Tensor& t) { return block.forward(t, o); }, h,
                      grad_checkpointing && caches == nullptr, dropout_gen);
  }
  return head->forward(ln_f->forward(h));
}

}  // namespace ag::apps
