#pragma once
// The attention text classifier of apps/textclf, built from nn/ parts. Parameter names follow the
// PyTorch twin in bench/torch_models.py one-to-one, so a state_dict moves between the two unchanged.
//
// TextClassifier: an attention encoder.                     tokens i64 (B, T), lengths -> logits (B, K)
//   h = tok(tokens) + pos(T)                      padding id 0 (its row stays zero)
//   with subword n-grams (ngram_buckets > 0; ngrams i64 (B, T, G), 0 = padding, data::hashed_ngrams):
//   e_bt = tok(tokens_bt) + sum_g ngram(ngrams_btg)   a word's vector plus its n-grams' (subword_sum)
//   h = e + pos(T)                                ngram: (buckets + 1, d), padding row 0 stays zero
//   h = blocks.i(h, key padding)                  padded keys are never attended to
//   pooled = sum_{t < len} norm(h)_t / len        mean over the valid tokens only
//   logits = head(dropout(pooled))
//   with the bag path (bag true): a linear model of the same features beside the encoder
//   logits += sum_{t < len} (bag_tok(tokens_bt) + sum_g bag_ngram(ngrams_btg)) / len
//                                                 bag_tok (vocab, K), bag_ngram (buckets + 1, K)
//   initialised by init_bag_from_naive_bayes (apps/textclf/lib.h) as multinomial naive Bayes over
//   those features with a uniform class prior (lib.h bag_naive_bayes says why), then trained with
//   the rest: on ~1,000 labelled texts naive Bayes is the better estimator, and the encoder learns
//   what it misses (docs/benchmarks.md, small data).
//
// Initialisation: GPT-2's (apps/common/gpt2_style.h init_gpt2_style), then the padding rows zero.
#include <nlohmann/json.hpp>

#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/positional.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace ag::apps {

struct TextClassifierConfig {
  int64_t vocab = 20000, max_len = 256, classes = 2;
  int64_t d_model = 128, n_heads = 4, n_layers = 2, mlp_hidden = 512;
  double dropout = 0.1;
  // Subword n-grams of each token (data::NgramSpec): ngram_buckets hashed ids 1..buckets, n from
  // ngram_min to ngram_max codepoints, at most ngrams_per_token per token. 0 buckets: off.
  int64_t ngram_buckets = 0, ngram_min = 2, ngram_max = 5, ngrams_per_token = 32;
  bool bag = false;  // the bag path (above)
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TextClassifierConfig, vocab, max_len, classes, d_model, n_heads,
                                                n_layers, mlp_hidden, dropout, ngram_buckets, ngram_min, ngram_max,
                                                ngrams_per_token, bag)

struct TextClassifier : nn::Module {
  TextClassifierConfig cfg;
  std::shared_ptr<nn::Embedding> tok;         // (vocab, d), padding_idx 0
  std::shared_ptr<nn::Embedding> ngram;       // (ngram_buckets + 1, d), padding_idx 0; null when off
  std::shared_ptr<nn::LearnedPositions> pos;  // (max_len, d)
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> head;  // d -> classes
  std::shared_ptr<nn::Embedding> bag_tok;    // (vocab, classes), padding_idx 0; null without the bag path
  std::shared_ptr<nn::Embedding> bag_ngram;  // (ngram_buckets + 1, classes), padding_idx 0; null without n-grams
  bool need_weights = false;         // keep each block's attention weights

  explicit TextClassifier(const TextClassifierConfig& cfg, Generator* gen = nullptr);
  // tokens i64 (B, T) padded with 0 after lengths[b] valid tokens; lengths i64 (B), each >= 1;
  // ngrams i64 (B, T, G), each token's hashed n-gram ids padded with 0: required when
  // cfg.ngram_buckets > 0, not allowed otherwise.
  Tensor forward(const Tensor& tokens, const Tensor& lengths, const Tensor& ngrams = Tensor());
};

// TextClassifier's token vectors with subword n-grams: a word's vector plus its n-grams' vectors
//   e_bt = tok_w[tokens_bt] + sum_g ngram_w[ngrams_btg]
// tok_w (V, d), ngram_w (buckets + 1, d), tokens i64 (B, T), ngrams i64 (B, T, G) -> e (B, T, d).
// Id 0 is padding in both tables: its row (zero in the model) gets no gradient, as
// nn::Embedding(padding_idx 0). The sum, not fastText's mean (the same divided by 1 + the number
// of n-grams): on the fortunes the sum made 89, 80 and 77 validation + test errors (of 18198)
// where the mean made 98, 82 and 84 (three pairs of 3000-step runs: no dropout; dropout 0.1;
// dropout 0.1 with 8000 words), and it needs no count. The n-gram sums are computed once per
// distinct row of `ngrams` (a word that occurs several times in a batch has one):
//   rows u = the distinct rows of ngrams, r(b, t) = the row of token (b, t)
//   S_u = sum_g ngram_w[rows_ug]   (U, d);   e_bt = tok_w[tokens_bt] + S_r(b,t)
// which is the formula above with fewer lookups (the same sums, so the same values and gradients).
Tensor subword_sum(const Tensor& tok_w, const Tensor& ngram_w, const Tensor& tokens, const Tensor& ngrams);

}  // namespace ag::apps
