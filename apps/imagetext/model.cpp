#include "apps/imagetext/model.h"

#include "apps/common/gpt2_style.h"
#include "autograd/ops.h"

namespace ag::apps {

ImageText::ImageText(const ImageTextConfig& c, Generator* gen) : cfg(c) {
  check(c.patch > 0 && c.image_h % c.patch == 0 && c.image_w % c.patch == 0,
        "ImageText: patch {} must divide the image's {}x{} pixels", c.patch, c.image_h, c.image_w);
  check(c.vocab > 0 && c.max_len > 0 && c.enc_layers > 0 && c.dec_layers > 0,
        "ImageText: vocab {}, max_len {}, enc_layers {} and dec_layers {} must be positive", c.vocab, c.max_len,
        c.enc_layers, c.dec_layers);
  // PatchEmbedding's image_size only sizes its own position table, which this model does not use:
  // patchify cuts any H x W divisible by P, and enc_pos covers the (H/P)(W/P) patches
  patch = register_module("patch", std::make_shared<nn::PatchEmbedding>(c.channels, c.patch, c.image_h, c.d_model,
                                                                        DType::f32, gen));
  enc_pos = register_parameter("enc_pos", zeros({1, c.patches() + 1, c.d_model}));
  enc_blocks = register_module(
      "enc_blocks", make_blocks(c.enc_layers, c.d_model, c.n_heads,
                                {.mlp_hidden = c.mlp_hidden, .dropout = c.dropout, .generator = gen}));
  enc_norm = register_module("enc_norm", std::make_shared<nn::LayerNorm>(c.d_model));
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab, c.d_model, std::nullopt, DType::f32, gen));
  wpe = register_module("wpe", std::make_shared<nn::LearnedPositions>(c.max_len, c.d_model, DType::f32, gen));
  dec_blocks = register_module("dec_blocks", std::make_shared<nn::ModuleList<nn::TransformerBlock>>());
  for (int64_t i = 0; i < c.dec_layers; ++i)
    dec_blocks->push_back(std::make_shared<nn::TransformerBlock>(
        c.d_model, c.n_heads,
        nn::TransformerBlock::Options{
            .mlp_hidden = c.mlp_hidden, .dropout = c.dropout, .causal = true, .cross = true, .generator = gen}));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.vocab, false, DType::f32, gen));
  init_gpt2_style(*this, c.enc_layers + c.dec_layers, gen);
}

Tensor ImageText::encode(const Tensor& images) {
  check(images.ndim() == 4 && images.size(1) == cfg.channels && images.size(2) == cfg.image_h &&
            images.size(3) == cfg.image_w,
        "ImageText: expected images [B, {}, {}, {}], got {}", cfg.channels, cfg.image_h, cfg.image_w, images.shape());
  // the images may come from the host: they go where the weights are
  Tensor m = patch->with_cls_token(patch->forward(images.to(device()))) + enc_pos;  // (B, N + 1, d)
  for (const auto& block : *enc_blocks) m = block->forward(m);
  return enc_norm->forward(m);
}

std::vector<nn::ContextKV> ImageText::context_kv(const Tensor& memory) {
  std::vector<nn::ContextKV> kv;
  for (const auto& block : *dec_blocks) kv.push_back(block->context_kv(memory));
  return kv;
}

Tensor ImageText::decode(const Tensor& idx, const Tensor& memory) {
  return decode(idx, context_kv(memory), nullptr);
}

Tensor ImageText::decode(const Tensor& idx, const std::vector<nn::ContextKV>& context,
                         std::vector<nn::KVCache>* caches) {
  check(idx.ndim() == 2 && idx.dtype() == DType::i64, "ImageText: expected token ids i64 [B, T], got {} {}",
        idx.dtype(), idx.shape());
  check(int64_t(context.size()) == cfg.dec_layers, "ImageText: {} context keys/values given for {} decoder blocks",
        context.size(), cfg.dec_layers);
  check(caches == nullptr || int64_t(caches->size()) == cfg.dec_layers, "ImageText: {} KV caches given for {} blocks",
        caches ? caches->size() : 0, cfg.dec_layers);
  const int64_t T = idx.size(1), start = caches ? (*caches)[0].length() : 0;
  check(start + T <= cfg.max_len, "ImageText: positions {}..{} exceed the {} positions of a caption", start,
        start + T - 1, cfg.max_len);
  Tensor h = wte->forward(idx.to(device())) + wpe->forward(T, start);  // (B, T, d)
  for (size_t i = 0; i < dec_blocks->size(); ++i) {
    nn::AttentionOptions o;
    o.cache = caches ? &(*caches)[i] : nullptr;
    h = (*dec_blocks)[i].forward(h, o, context[i]);
  }
  return head->forward(ln_f->forward(h));  // (B, T, V)
}

Tensor ImageText::forward(const Tensor& images, const Tensor& idx) { return decode(idx, encode(images)); }

}  // namespace ag::apps
