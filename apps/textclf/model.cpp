#include "apps/textclf/model.h"

#include <string_view>
#include <unordered_map>

#include "apps/common/gpt2_style.h"
#include "autograd/ops.h"
#include "autograd/tape.h"

namespace ag::apps {

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
  blocks = register_module(
      "blocks", make_blocks(c.n_layers, c.d_model, c.n_heads,
                            {.mlp_hidden = c.mlp_hidden, .dropout = c.dropout, .generator = gen}));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(c.d_model));
  drop = register_module("drop", std::make_shared<nn::Dropout>(c.dropout, gen));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, DType::f32, gen));
  init_gpt2_style(*this, c.n_layers, gen);
  if (c.bag) {
    // zeros (the encoder alone) until init_bag_from_naive_bayes fills them; made after the encoder's
    // draws, from a generator of their own, so the encoder starts as it does without them
    Generator unused(0);
    bag_tok = register_module("bag_tok", std::make_shared<nn::Embedding>(c.vocab, c.classes, 0, DType::f32, &unused));
    if (c.ngram_buckets > 0)
      bag_ngram = register_module(
          "bag_ngram", std::make_shared<nn::Embedding>(c.ngram_buckets + 1, c.classes, 0, DType::f32, &unused));
  }
  NoGradGuard no_grad;
  tok->weight.select(0, 0).fill_(0.0);  // the padding row, as nn.Embedding(padding_idx=0) keeps it
  if (ngram) ngram->weight.select(0, 0).fill_(0.0);
  if (bag_tok) bag_tok->weight.fill_(0.0);
  if (bag_ngram) bag_ngram->weight.fill_(0.0);
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
  Tensor logits = head->forward(drop->forward(pooled));  // (B, K)
  if (bag_tok) {
    Tensor bag = bag_ngram ? subword_sum(bag_tok->weight, bag_ngram->weight, tokens, ngrams)
                           : embed_padded(bag_tok->weight, tokens.to(dev));  // (B, T, K)
    logits = logits + sum(bag * valid, {1}) / count;
  }
  return logits;
}

}  // namespace ag::apps
