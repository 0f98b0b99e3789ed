#pragma once
// fmt formatting of tensors, PyTorch-style:
//   tensor([[ 1.0000, -2.5000],
//           [ 0.1250,  3.0000]], shape=[2,2], dtype=f32, device=cpu)
// Tensors of more than 1000 elements are summarised: the first and last 3 entries of each dim
// around "...". Values are fixed-point with 4 decimals, or scientific when the range demands it.
#include <string>

#include <fmt/format.h>

#include "core/tensor.h"

namespace ag {
std::string to_string(const Tensor& t);
}  // namespace ag

template <>
struct fmt::formatter<ag::Tensor> : fmt::formatter<std::string_view> {
  auto format(const ag::Tensor& t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(ag::to_string(t), ctx);
  }
};
