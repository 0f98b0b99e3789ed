#pragma once
// Position information for a sequence of length T with model width d.
//
// sinusoidal_positions(T, d): the fixed encoding of "Attention Is All You Need", (T, d):
//   PE(pos, 2i)   = sin(pos / 10000^(2i/d))
//   PE(pos, 2i+1) = cos(pos / 10000^(2i/d))
// Each pair of columns is a rotation at its own frequency, so PE(pos + k) is a linear function
// of PE(pos): relative offsets are easy to read off. Not trained; computed in double.
//
// LearnedPositions(max_len, d): a trained table, as GPT-2's wpe = nn.Embedding(max_len, d):
//   forward(T, start) = weight[start : start + T]  (T, d); weight ~ N(0, 1) like nn.Embedding.
// A slice rather than a gather of arange(T): the same values and gradient, with no copy.
// alibi_slopes(H): ALiBi's per-head slopes (Press et al., 2022), f32 (H), for the alibi_slopes of
// scaled_dot_product_attention (head h's scores get -m_h |i - j|: no position embedding at all).
// For H a power of two the geometric sequence m_h = 2^(-8 (h + 1) / H) (H 8: 1/2, 1/4, ..., 1/256);
// otherwise, as the paper's code, the slopes of the power of two n below H, then every other slope
// of 2n for the remaining H - n heads.
//
// Rotary positions (RoPE) are the op rope (autograd/ops.h), applied to queries and keys by
// MultiHeadAttention (nn/attention.h, MultiHeadAttention::Options::positions).
// Derived step by step: docs/math/positional.md
#include "nn/module.h"

namespace ag::nn {

Tensor sinusoidal_positions(int64_t T, int64_t d, DType dtype = DType::f32);
Tensor alibi_slopes(int64_t H);

struct LearnedPositions : Module {
  int64_t max_len, dim;
  Tensor weight;  // (max_len, dim)

  LearnedPositions(int64_t max_len, int64_t dim, DType dtype = DType::f32, Generator* gen = nullptr);
  Tensor forward(int64_t T, int64_t start = 0);
};

}  // namespace ag::nn
