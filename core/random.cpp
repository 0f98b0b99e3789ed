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
  Tensor t = empty(shape, dtype);
  uint64_t offset = gen_or_default(gen).advance(uint64_t(t.numel() + 3) / 4);
  visit_floating("rand", dtype, [&]<class T>() {
    KERNEL(t.device(), uniform<T>, t.data<T>(), t.numel(), gen_or_default(gen).seed(), offset, low, high);
  });
  return t;
}

Tensor randn(const Shape& shape, DType dtype, Generator* gen, double mean, double std) {
  check(std >= 0, "randn: expected std >= 0, got {}", std);
  Tensor t = empty(shape, dtype);
  uint64_t offset = gen_or_default(gen).advance(uint64_t(t.numel() + 3) / 4);
  visit_floating("randn", dtype, [&]<class T>() {
    KERNEL(t.device(), normal<T>, t.data<T>(), t.numel(), gen_or_default(gen).seed(), offset, mean, std);
  });
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen) {
  check(low < high, "randint: expected low < high, got [{}, {})", low, high);
  Tensor t = empty(shape, DType::i64);
  uint64_t offset = gen_or_default(gen).advance(uint64_t(t.numel() + 1) / 2);
  KERNEL(t.device(), randint, t.data<int64_t>(), t.numel(), gen_or_default(gen).seed(), offset, low, high);
  return t;
}

}  // namespace ag
