#include "core/random.h"

#include "core/dispatch.h"

namespace ag {

Generator& default_generator() {
  static Generator g(0);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {
Generator& gen_or_default(Generator* g) { return g ? *g : default_generator(); }
}  // namespace

Tensor rand(const Shape& shape, DType dtype, Generator* gen, double low, double high) {
  check(low < high, "rand: expected low < high, got [{}, {})", low, high);
  check(is_floating(dtype), "rand: expected a floating dtype (f32 or f64), got {}", dtype);
  Generator& g = gen_or_default(gen);
  Tensor t = empty(shape, dtype);
  const uint64_t offset = g.advance(uint64_t(t.numel() + 3) / 4);  // 4 numbers per Philox block
  visit_floating("rand", dtype, [&]<class T>() {
    KERNEL(t.device(), uniform<T>, t.data<T>(), t.numel(), g.seed(), offset, low, high);
  });
  return t;
}

Tensor randn(const Shape& shape, DType dtype, Generator* gen, double mean, double std) {
  check(std >= 0, "randn: expected std >= 0, got {}", std);
  check(is_floating(dtype), "randn: expected a floating dtype (f32 or f64), got {}", dtype);
  Generator& g = gen_or_default(gen);
  Tensor t = empty(shape, dtype);
  const uint64_t offset = g.advance(uint64_t(t.numel() + 3) / 4);  // 4 numbers per Philox block
  visit_floating("randn", dtype, [&]<class T>() {
    KERNEL(t.device(), normal<T>, t.data<T>(), t.numel(), g.seed(), offset, mean, std);
  });
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen) {
  check(low < high, "randint: expected low < high, got [{}, {})", low, high);
  Generator& g = gen_or_default(gen);
  Tensor t = empty(shape, DType::i64);
  const uint64_t offset = g.advance(uint64_t(t.numel() + 1) / 2);  // 2 numbers per Philox block
  KERNEL(t.device(), randint, t.data<int64_t>(), t.numel(), g.seed(), offset, low, high);
  return t;
}

}  // namespace ag
