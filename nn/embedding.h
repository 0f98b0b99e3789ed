#pragma once
// Embedding: a lookup table, as torch.nn.Embedding.     idx i64 (...) -> y (..., dim)
//   y[..., :] = weight[idx[...], :],   weight (num, dim) ~ N(0, 1)
// padding_idx p (optional; negative counts from the end, as in PyTorch): row p is zeroed at init
// and never receives a gradient, so it stays whatever it was loaded or set to. Done here as
//   y = where(idx == p, y.detach(), y)
// which keeps the forward values and sends no gradient back through the padded positions.
#include <optional>

#include "nn/module.h"

namespace ag::nn {

struct Embedding : Module {
  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // normalised to [0, num)
  Tensor weight;                       // (num, dim)

  Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding_idx = std::nullopt,
            DType dtype = DType::f32, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices);
  Tensor operator()(const Tensor& indices) { return forward(indices); }
};

}  // namespace ag::nn
