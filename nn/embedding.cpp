#include "nn/embedding.h"

#include "nn/init.h"

namespace ag::nn {

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad, DType dtype, Generator* gen)
    : num_embeddings(num), embedding_dim(dim) {
  check(num > 0 && dim > 0, "Embedding: num_embeddings and embedding_dim must be positive, got {} and {}", num,
        dim);
  if (pad) {
    check(*pad >= -num && *pad < num, "Embedding: padding_idx {} out of range for {} embeddings", *pad, num);
    padding_idx = *pad < 0 ? *pad + num : *pad;
  }
  Tensor w = init::normal({num, dim}, 0.0, 1.0, dtype, gen);
  if (padding_idx) w.select(0, *padding_idx).zero_();
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  ModuleScope scope(this);
  Tensor y = embedding(weight, indices);
  if (!padding_idx || !y.requires_grad()) return y;
  Tensor padded = unsqueeze(eq(indices, double(*padding_idx)), -1);  // (..., 1), broadcast over dim
  return where(padded, y.detach(), y);
}

}  // namespace ag::nn
