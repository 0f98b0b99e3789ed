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

namespace {
// 2^(-8 (h + 1) / n) for h < n, n a power of two
std::vector<float> power_of_two_slopes(int64_t n) {
  std::vector<float> m;
  for (int64_t h = 0; h < n; ++h) m.push_back(float(std::exp2(-8.0 * double(h + 1) / double(n))));
  return m;
}
}  // namespace

Tensor alibi_slopes(int64_t H) {
  check(H >= 1, "alibi_slopes: the number of heads must be >= 1, got {}", H);
  int64_t n = 1;
  while (n * 2 <= H) n *= 2;  // the power of two at or below H
  std::vector<float> m = power_of_two_slopes(n);
  const std::vector<float> finer = power_of_two_slopes(2 * n);
  for (int64_t h = 0; int64_t(m.size()) < H; h += 2) m.push_back(finer[size_t(h)]);
  return from_vector<float>(m, {H});
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
