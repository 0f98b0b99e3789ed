#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("tensor: creation and metadata") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.dtype() == DType::f32);
  CHECK(z.device() == Device::cpu());
  CHECK(z.numel() == 6);
  check_close(z, {0, 0, 0, 0, 0, 0});
  check_close(full({2}, 2.5, DType::f64), {2.5, 2.5});
  check_close(arange(0, 5, 2), {0, 2, 4});
  CHECK(arange(5.0).dtype() == DType::i64);
  Tensor t = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2});
  CHECK(t.item<float>() == 0);  // never reached: item on 4 elements throws
}
