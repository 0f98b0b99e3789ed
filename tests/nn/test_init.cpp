#include "nn/init.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
struct Moments {
  double min, max, mean, std;
};
Moments moments(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  Moments m{1e300, -1e300, 0, 0};
  for (double x : v) m.min = std::min(m.min, x), m.max = std::max(m.max, x), m.mean += x;
  m.mean /= double(v.size());
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / double(v.size()));
  return m;
}
}  // namespace

TEST_CASE("init: fans follow PyTorch (out, in, k...)") {
  CHECK(nn::init::fans({64, 32}).in == 32);
  CHECK(nn::init::fans({64, 32}).out == 64);
  nn::init::Fans f = nn::init::fans({16, 3, 4, 4});  // a conv-like weight: receptive field 16
  CHECK(f.in == 48);
  CHECK(f.out == 256);
  AG_CHECK_ERROR(nn::init::fans({10}), "init", "[10]");
}

TEST_CASE("init: kaiming_uniform with a = sqrt 5 is nn.Linear's U(-1/sqrt(in), 1/sqrt(in))") {
  Generator g(3);
  Tensor w = nn::init::kaiming_uniform({256, 400}, std::sqrt(5.0), DType::f32, &g);
  Moments m = moments(w);
  const double bound = 1.0 / std::sqrt(400.0);  // gain sqrt(1/3) * sqrt(3/400)
  CHECK(m.min >= -bound);
  CHECK(m.max < bound);
  CHECK(m.max > 0.99 * bound);   // the range is used up to its end
  CHECK(std::abs(m.std - bound / std::sqrt(3.0)) < 0.01 * bound);  // std of U(-b, b) = b / sqrt 3
  CHECK(std::abs(m.mean) < 0.01 * bound);
}

TEST_CASE("init: kaiming_normal, xavier_uniform and xavier_normal scales") {
  Generator g(4);
  // kaiming_normal, a = 0 (ReLU gain sqrt 2): std = sqrt(2 / fan_in) = sqrt(2/200) = 0.1
  CHECK(std::abs(moments(nn::init::kaiming_normal({300, 200}, 0.0, DType::f32, &g)).std - 0.1) < 0.002);
  // xavier_uniform, gain 1: bound = sqrt(6 / (200 + 300)); std = bound / sqrt 3 = sqrt(2/500)
  Moments xu = moments(nn::init::xavier_uniform({300, 200}, 1.0, DType::f32, &g));
  CHECK(xu.max < std::sqrt(6.0 / 500));
  CHECK(std::abs(xu.std - std::sqrt(2.0 / 500)) < 0.002);
  // xavier_normal, gain 2: std = 2 sqrt(2 / 500)
  CHECK(std::abs(moments(nn::init::xavier_normal({300, 200}, 2.0, DType::f32, &g)).std - 2 * std::sqrt(2.0 / 500)) <
        0.004);
  AG_CHECK_ERROR(nn::init::xavier_uniform({0, 0}), "xavier_uniform", "[0,0]");
}

TEST_CASE("init: the same generator seed gives the same weights") {
  Generator a(7), b(7);
  check_close(nn::init::kaiming_uniform({8, 5}, std::sqrt(5.0), DType::f32, &a),
              nn::init::kaiming_uniform({8, 5}, std::sqrt(5.0), DType::f32, &b), 0, 0);
}
