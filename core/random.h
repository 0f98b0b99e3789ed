#pragma once
// Random tensors from a counter-based generator (Philox4x32-10, core/kernels.h).
// A Generator is a seed plus an offset counting the Philox blocks used so far: each draw of n
// numbers takes blocks [offset, offset + ceil(n/4)) and advances the offset. The numbers depend
// only on (seed, offset), never on the number of threads.
#include <cstdint>

#include "core/tensor.h"

namespace ag {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void manual_seed(uint64_t seed) { seed_ = seed, offset_ = 0; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Reserves `blocks` Philox blocks and returns the offset of the first.
  uint64_t advance(uint64_t blocks) {
    uint64_t o = offset_;
    offset_ += blocks;
    return o;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// The process-wide generator used when none is passed (seed 0 until manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Uniform in [low, high).
Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr, double low = 0,
            double high = 1);
// Normal with the given mean and standard deviation.
Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr, double mean = 0,
             double std = 1);
// Integers uniform in [low, high), dtype i64.
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen = nullptr);

}  // namespace ag
