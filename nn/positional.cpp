#include "nn/positional.h"

#include <cmath>

#include "nn/init.h"

namespace ag::nn {

Tensor sinusoidal_positions(int64_t T, int64_t d, DType dtype) {
  check(T >= 0 && d > 0, "sinusoidal_positions: need T >= 0 and d > 0, got T = {}, d = {}", T, d);
  check(is_floating(dtype), "sinusoidal_positions: dtype must be f32 or f64, got {}", dtype);
  std::vector<double> pe(size_t(T * d));
  for (int64_t pos = 0; pos < T; ++pos) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t two_i = j - j % 2;  // columns 2i and 2i+1 share the frequency 1/10000^(2i/d)
      const double angle = double(pos) / std::pow(10000.0, double(two_i) / double(d));
      pe[size_t(pos * d + j)] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  }
  return from_vector(pe, {T, d}).to(dtype);
}

LearnedPositions::LearnedPositions(int64_t max_len_, int64_t dim_, DType dtype, Generator* gen)
    : max_len(max_len_), dim(dim_) {
  check(max_len > 0 && dim > 0, "LearnedPositions: max_len and dim must be positive, got {} and {}", max_len, dim);
  weight = register_parameter("weight", init::normal({max_len, dim}, 0.0, 1.0, dtype, gen));
}

Tensor LearnedPositions::forward(int64_t T, int64_t start) {
  ModuleScope scope(this);
  check(T >= 0 && start >= 0 && start + T <= max_len,
        "LearnedPositions: positions [{}, {}) out of range for max_len {}", start, start + T, max_len);
  return weight.narrow(0, start, T);
}

}  // namespace ag::nn
