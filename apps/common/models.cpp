#include "apps/common/models.h"

#include <cmath>
#include <string_view>
#include <unordered_map>

#include "autograd/ops.h"
#include "autograd/tape.h"
#include "nn/init.h"

namespace ag::apps {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> make_blocks(int64_t n, int64_t d, int64_t heads,
                                                                   int64_t hidden, double dropout, bool causal,
                                                                   Generator* gen) {
  auto list = std::make_shared<nn::ModuleList<nn::TransformerBlock>>();
  for (int64_t i = 0; i < n; ++i)
    list->push_back(std::make_shared<nn::TransformerBlock>(d, heads, hidden, dropout, causal, false, DType::f32, gen));
  return list;
}

}  // namespace

void init_gpt2_style(nn::Module& model, int64_t n_layers, Generator* gen) {
  NoGradGuard no_grad;
  const double std_resid = 0.02 / std::sqrt(2.0 * double(n_layers));
  for (auto& [name, p] : model.named_parameters()) {
    if (p.ndim() >= 2) {
      const bool resid = ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.fc2.weight");
      p.copy_(nn::init::normal(p.shape(), 0.0, resid ? std_resid : 0.02, p.dtype(), gen));
    } else if (ends_with(name, "bias")) {
      p.fill_(0.0);
    }  // LayerNorm weights keep their 1
  }
}

// ---- GPT ----------------------------------------------------------------------------------------

GPT::GPT(const GPTConfig& c, Generator* gen) : cfg(c) {
  check(c.vocab > 0 && c.context > 0 && c.n_layers > 0, "GPT: vocab {}, context {} and n_layers {} must be positive",
        c.vocab, c.context, c.n_layers);
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab, c.d_model, std::nullopt, DType::f32, gen));
  wpe = register_module("wpe", std::make_shared<nn::LearnedPositions>(c.context, c.d_model, DType::f32, gen));
  blocks = register_module("blocks", make_blocks(c.n_layers, c.d_model, c.n_heads, c.mlp_hidden, c.dropout, true, gen));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.vocab, false, DType::f32, gen));
  init_gpt2_style(*this, c.n_layers, gen);
}

Tensor GPT::forward(const Tensor& idx, std::vector<nn::KVCache>* caches) {
  check(idx.ndim() == 2 && idx.dtype() == DType::i64, "GPT: expected token ids i64 [B, T], got {} {}", idx.dtype(),
        idx.shape());
  check(caches == nullptr || int64_t(caches->size()) == cfg.n_layers, "GPT: {} KV caches given for {} blocks",
        caches ? caches->size() : 0, cfg.n_layers);
  const int64_t T = idx.size(1), start = caches ? (*caches)[0].length() : 0;
  check(start + T <= cfg.context, "GPT: positions {}..{} exceed the context of {}", start, start + T - 1,
        cfg.context);
  // the ids may come from the host: they go where the weights are (no copy when already there)
  Tensor h = wte->forward(idx.to(device())) + wpe->forward(T, start);  // (B, T, d) + (T, d)
  for (size_t i = 0; i < blocks->size(); ++i) {
    nn::AttentionOptions o;
    o.cache = caches ? &(*caches)[i] : nullptr;
    o.need_weights = need_weights;
    h = (*blocks)[i].forward(h, o);
  }
  return head->forward(ln_f->forward(h));
}

// ---- ViT ----------------------------------------------------------------------------------------

ViT::ViT(const ViTConfig& c, Generator* gen) : cfg(c) {
  check(c.patch > 0 && c.image_size % c.patch == 0, "ViT: image size {} is not a multiple of the patch size {}",
        c.image_size, c.patch);
  patch = register_module("patch",
                          std::make_shared<nn::PatchEmbedding>(c.channels, c.patch, c.image_size, c.d_model, DType::f32,
                                                               gen));
  pos_embed = register_parameter("pos_embed", zeros({1, patch->num_patches + 1, c.d_model}));
  blocks = register_module("blocks", make_blocks(c.n_layers, c.d_model, c.n_heads, c.mlp_hidden, c.dropout, false, gen));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(c.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, DType::f32, gen));
  init_gpt2_style(*this, c.n_layers, gen);
}

Tensor ViT::forward(const Tensor& images) {
  check(images.ndim() == 4 && images.size(1) == cfg.channels && images.size(2) == cfg.image_size &&
            images.size(3) == cfg.image_size,
        "ViT: expected images [B, {}, {}, {}], got {}", cfg.channels, cfg.image_size, cfg.image_size, images.shape());
  // the images may come from the host: they go where the weights are
  Tensor h = patch->with_cls_token(patch->forward(images.to(device()))) + pos_embed;  // (B, N + 1, d)
  nn::AttentionOptions o;
  o.need_weights = need_weights;
  for (const auto& block : *blocks) h = block->forward(h, o);
  return head->forward(norm->forward(h.select(1, 0)));  // the class token
}

// ---- TextClassifier -----------------------------------------------------------------------------

namespace {

// weight[idx] with row 0 as padding: no gradient flows to it (nn::Embedding's padding_idx rule)
Tensor embed_padded(const Tensor& weight, const Tensor& idx) {
  Tensor y = embedding(weight, idx);
  if (!y.requires_grad()) return y;
  return where(unsqueeze(eq(idx, 0.0), -1), y.detach(), y);
}

}  // namespace

Tensor subword_sum(const Tensor& tok_w, const Tensor& ngram_w, const Tensor& tokens, const Tensor& ngrams) {
  check(tok_w.ndim() == 2 && ngram_w.ndim() == 2 && tok_w.size(1) == ngram_w.size(1) && tokens.ndim() == 2 &&
            tokens.dtype() == DType::i64 && ngrams.ndim() == 3 && ngrams.dtype() == DType::i64 &&
            ngrams.size(0) == tokens.size(0) && ngrams.size(1) == tokens.size(1) && ngrams.size(2) >= 1,
        "TextClassifier subword_sum: expected tables [V, d] and [buckets + 1, d], tokens i64 [B, T] and n-gram ids "
        "i64 [B, T, G >= 1], got {}, {}, {} {} and {} {}",
        tok_w.shape(), ngram_w.shape(), tokens.dtype(), tokens.shape(), ngrams.dtype(), ngrams.shape());
  const int64_t B = tokens.size(0), T = tokens.size(1), G = ngrams.size(2), N = B * T;
  // the distinct rows of ngrams (keyed by their bytes) and each token's row
  const std::vector<int64_t> ids = ngrams.to_vector<int64_t>();
  std::unordered_map<std::string_view, int64_t> row_of;
  std::vector<int64_t> rows, inverse(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* row = ids.data() + n * G;
    const std::string_view key(reinterpret_cast<const char*>(row), size_t(G) * sizeof(int64_t));
    auto [it, fresh] = row_of.try_emplace(key, int64_t(rows.size()) / G);
    if (fresh) rows.insert(rows.end(), row, row + G);
    inverse[size_t(n)] = it->second;
  }
  const auto U = int64_t(row_of.size());
  // the distinct rows are found on the host (ids above); the lookups run where the tables are
  const Device dev = tok_w.device();
  Tensor S = sum(embed_padded(ngram_w, from_vector(rows, {U, G}, dev)), {1});  // (U, G, d) -> (U, d)
  return embed_padded(tok_w, tokens.to(dev)) + embedding(S, from_vector(inverse, {B, T}, dev));  // (B, T, d)
}

TextClassifier::TextClassifier(const TextClassifierConfig& c, Generator* gen) : cfg(c) {
  check(c.vocab > 1 && c.max_len > 0 && c.classes > 1,
        "TextClassifier: vocab {} (with padding id 0), max_len {} and classes {} are too small", c.vocab, c.max_len,
        c.classes);
  check(c.ngram_buckets >= 0 && c.ngram_min >= 1 && c.ngram_max >= c.ngram_min && c.ngrams_per_token >= 1,
        "TextClassifier: n-gram settings: buckets {} must be >= 0, n {}..{} a range from >= 1, ngrams_per_token {} >= 1",
        c.ngram_buckets, c.ngram_min, c.ngram_max, c.ngrams_per_token);
  tok = register_module("tok", std::make_shared<nn::Embedding>(c.vocab, c.d_model, 0, DType::f32, gen));
  if (c.ngram_buckets > 0)
    ngram = register_module("ngram",
                            std::make_shared<nn::Embedding>(c.ngram_buckets + 1, c.d_model, 0, DType::f32, gen));
  pos = register_module("pos", std::make_shared<nn::LearnedPositions>(c.max_len, c.d_model, DType::f32, gen));
  blocks = register_module("blocks", make_blocks(c.n_layers, c.d_model, c.n_heads, c.mlp_hidden, c.dropout, false, gen));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(c.d_model));
  drop = register_module("drop", std::make_shared<nn::Dropout>(c.dropout, gen));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, DType::f32, gen));
  init_gpt2_style(*this, c.n_layers, gen);
  NoGradGuard no_grad;
  tok->weight.select(0, 0).fill_(0.0);  // the padding row, as nn.Embedding(padding_idx=0) keeps it
  if (ngram) ngram->weight.select(0, 0).fill_(0.0);
}

Tensor TextClassifier::forward(const Tensor& tokens, const Tensor& lengths, const Tensor& ngrams) {
  check(tokens.ndim() == 2 && tokens.dtype() == DType::i64, "TextClassifier: expected tokens i64 [B, T], got {} {}",
        tokens.dtype(), tokens.shape());
  check(lengths.ndim() == 1 && lengths.dtype() == DType::i64 && lengths.size(0) == tokens.size(0),
        "TextClassifier: expected lengths i64 [{}], got {} {}", tokens.size(0), lengths.dtype(), lengths.shape());
  const int64_t T = tokens.size(1);
  check(T <= cfg.max_len, "TextClassifier: {} tokens exceed max_len {}", T, cfg.max_len);
  const Device dev = device();  // the batch may come from the host: it goes where the weights are
  const Tensor lens = lengths.to(dev);
  Tensor e;
  if (ngram) {
    check(ngrams.defined() && ngrams.ndim() == 3 && ngrams.dtype() == DType::i64 && ngrams.size(0) == tokens.size(0) &&
              ngrams.size(1) == T,
          "TextClassifier: expected n-gram ids i64 [{}, {}, G] for tokens {}, got {}", tokens.size(0), T,
          tokens.shape(), ngrams.defined() ? fmt::format("{} {}", ngrams.dtype(), ngrams.shape()) : "none");
    e = subword_sum(tok->weight, ngram->weight, tokens, ngrams);  // (B, T, d)
  } else {
    e = tok->forward(tokens.to(dev));  // (B, T, d)
    if (ngrams.defined())
      fail("TextClassifier: n-gram ids {} given to a model without n-grams (ngram_buckets 0)", ngrams.shape());
  }
  Tensor h = e + pos->forward(T);  // (B, T, d)
  nn::AttentionOptions o;
  o.key_padding_lengths = lens;
  o.need_weights = need_weights;
  for (const auto& block : *blocks) h = block->forward(h, o);
  // mean over the valid tokens: valid (B, T, 1) = t < length_b, as 1.0 / 0.0
  Tensor valid = lt(arange(0, double(T), 1, DType::i64, dev).reshape({1, T}), lens.reshape({-1, 1}))
                     .to(DType::f32)
                     .unsqueeze(2);
  Tensor count = clamp(lens.to(DType::f32), 1.0, 1e30).reshape({-1, 1});
  Tensor pooled = sum(norm->forward(h) * valid, {1}) / count;  // (B, d)
  return head->forward(drop->forward(pooled));
}

}  // namespace ag::apps
