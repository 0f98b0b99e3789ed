// Philox4x32-10 and the random tensors built on it (core/random.h, core/kernels.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// Philox4x32-10 written out from its definition (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC'11), for any 128-bit counter and 64-bit key. One round maps
//   (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0,  lo(M1 c2),  hi(M0 c0) ^ c3 ^ k1,  lo(M0 c0))
// with M0 = 0xD2511F53, M1 = 0xCD9E8D57, and the key is bumped by the Weyl constants
// (0x9E3779B9, 0xBB67AE85) between rounds.
std::array<uint32_t, 4> philox_reference(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
    const uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
  }
  return c;
}

std::array<uint32_t, 4> api(uint64_t seed, uint64_t counter) {
  Philox4 r = philox4x32_10(seed, counter);
  return {r.v[0], r.v[1], r.v[2], r.v[3]};
}

// Restores the thread count however the test ends.
struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}
double std_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

}  // namespace

TEST_CASE("random: philox4x32_10 known answers") {
  using A = std::array<uint32_t, 4>;
  // Random123's published known-answer vectors for Philox4x32-10 (kat_vectors):
  //   counter, key -> output
  CHECK(philox_reference({0, 0, 0, 0}, {0, 0}) == A{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox_reference({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        A{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox_reference({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        A{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});

  // Our API: counter (c0, c1) = the 64-bit counter (low word first), c2 = c3 = 0, key (k0, k1) = the
  // 64-bit seed (low word first). The all-zero vector is the published one directly.
  CHECK(api(0, 0) == A{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  const uint64_t seeds[] = {1, 0xffffffffull, 0x123456789abcdef0ull, ~0ull};
  const uint64_t counters[] = {1, 0x100000000ull, 0xfedcba9876543210ull, ~0ull};
  for (uint64_t s : seeds)
    for (uint64_t c : counters)
      CHECK(api(s, c) == philox_reference({uint32_t(c), uint32_t(c >> 32), 0, 0}, {uint32_t(s), uint32_t(s >> 32)}));
}

TEST_CASE("random: the same seed gives the same numbers, another seed others") {
  Generator a(42), b(42), c(43);
  for (DType t : {DType::f32, DType::f64}) {
    CHECK(rand({1000}, t, &a).to_vector<double>() == rand({1000}, t, &b).to_vector<double>());
    CHECK(randn({1000}, t, &a).to_vector<double>() == randn({1000}, t, &b).to_vector<double>());
  }
  CHECK(randint(0, 1000, {1000}, &a).to_vector<int64_t>() == randint(0, 1000, {1000}, &b).to_vector<int64_t>());
  Generator a2(42);
  CHECK(rand({1000}, DType::f32, &a2).to_vector<float>() != rand({1000}, DType::f32, &c).to_vector<float>());
  CHECK(randn({1000}, DType::f32, &a2).to_vector<float>() != randn({1000}, DType::f32, &c).to_vector<float>());
  CHECK(randint(0, 1000, {1000}, &a2).to_vector<int64_t>() != randint(0, 1000, {1000}, &c).to_vector<int64_t>());

  // The default generator follows manual_seed.
  manual_seed(7);
  std::vector<float> first = randn({100}).to_vector<float>();
  manual_seed(7);
  CHECK(randn({100}).to_vector<float>() == first);
  CHECK(default_generator().seed() == 7);
  CHECK(default_generator().offset() == 25);
}

TEST_CASE("random: element i depends only on (seed, offset + i/4)") {
  // A shorter draw is a prefix of a longer one, and the values do not depend on the shape.
  Generator a(5), b(5);
  std::vector<float> long_draw = rand({1001}, DType::f32, &a).to_vector<float>();
  std::vector<float> short_draw = rand({3, 7}, DType::f32, &b).to_vector<float>();
  CHECK(std::equal(short_draw.begin(), short_draw.end(), long_draw.begin()));
  Generator c(5), d(5);
  std::vector<int64_t> li = randint(-5, 5, {1001}, &c).to_vector<int64_t>();
  std::vector<int64_t> si = randint(-5, 5, {9}, &d).to_vector<int64_t>();
  CHECK(std::equal(si.begin(), si.end(), li.begin()));
}

TEST_CASE("random: values do not depend on the thread count") {
  ThreadCount restore;
  auto draw = [](int threads) {
    set_num_threads(threads);
    Generator g(2024);
    std::vector<double> out = rand({100000}, DType::f32, &g).to_vector<double>();
    std::vector<double> n = randn({100001}, DType::f64, &g).to_vector<double>();
    std::vector<double> i = randint(-1000000, 1000000, {100003}, &g).to_vector<double>();
    out.insert(out.end(), n.begin(), n.end());
    out.insert(out.end(), i.begin(), i.end());
    return out;
  };
  std::vector<double> one = draw(1), two = draw(2), three = draw(3);
  CHECK(one == two);
  CHECK(one == three);
}

TEST_CASE("random: moments") {
  Generator g(11);
  const int n = 100000;
  // normal: the sample mean has standard error 1/sqrt(n) = 0.0032, the sample std about
  // 1/sqrt(2n) = 0.0022; allow 5 standard errors.
  std::vector<double> z = randn({n}, DType::f64, &g).to_vector<double>();
  CHECK(std::abs(mean_of(z)) < 0.016);
  CHECK(std::abs(std_of(z) - 1) < 0.011);
  double within1 = double(std::count_if(z.begin(), z.end(), [](double x) { return std::abs(x) < 1; })) / n;
  CHECK(std::abs(within1 - 0.6827) < 0.0074);  // binomial sd sqrt(.68 .32 / n) = 0.0015
  std::vector<double> zs = randn({n}, DType::f32, &g, 3.0, 0.5).to_vector<double>();
  CHECK(std::abs(mean_of(zs) - 3) < 0.008);
  CHECK(std::abs(std_of(zs) - 0.5) < 0.0055);

  // uniform [0, 1): mean 1/2, sd 1/sqrt(12) = 0.2887, standard error 0.00091
  std::vector<double> u = rand({n}, DType::f32, &g).to_vector<double>();
  CHECK(std::abs(mean_of(u) - 0.5) < 0.0046);
  CHECK(std::abs(std_of(u) - 0.2887) < 0.003);
  CHECK(*std::min_element(u.begin(), u.end()) >= 0);
  CHECK(*std::max_element(u.begin(), u.end()) < 1);
  std::vector<double> w = rand({n}, DType::f64, &g, -2, 6).to_vector<double>();
  CHECK(std::abs(mean_of(w) - 2) < 0.037);
  CHECK(*std::min_element(w.begin(), w.end()) >= -2);
  CHECK(*std::max_element(w.begin(), w.end()) < 6);
}

TEST_CASE("random: rand stays below high after rounding to f32") {
  // On [1, 1 + 2^-20) f32 has only 8 values; 1 + span * u rounds up to 1 + 2^-20 = high for about
  // 1 draw in 16, which must not be returned.
  Generator g(3);
  const double high = 1.0 + std::ldexp(1.0, -20);
  std::vector<float> v = rand({10000}, DType::f32, &g, 1.0, high).to_vector<float>();
  CHECK(*std::max_element(v.begin(), v.end()) < float(high));
  CHECK(*std::min_element(v.begin(), v.end()) >= 1.0f);
}

TEST_CASE("random: randint range and every value hit") {
  Generator g(9);
  const int n = 70001;  // odd: the last element takes the first half of a Philox block
  Tensor t = randint(-3, 4, {n}, &g);
  CHECK(t.dtype() == DType::i64);
  std::map<int64_t, int> count;
  for (int64_t v : t.to_vector<int64_t>()) count[v]++;
  REQUIRE(count.size() == 7);
  CHECK(count.begin()->first == -3);
  CHECK(count.rbegin()->first == 3);
  // each value ~ n/7 = 10000 with binomial sd 93; allow 5 sd
  for (auto [v, c] : count) CHECK(std::abs(c - n / 7.0) < 465);

  Generator h(1);
  std::vector<int64_t> big = randint(0, int64_t(1) << 40, {1000}, &h).to_vector<int64_t>();
  CHECK(*std::max_element(big.begin(), big.end()) > (int64_t(1) << 39));  // the top bits are used
  CHECK(*std::max_element(big.begin(), big.end()) < (int64_t(1) << 40));
}

TEST_CASE("random: Generator offsets advance") {
  Generator g(100);
  CHECK(g.offset() == 0);
  std::vector<float> a = rand({10}, DType::f32, &g).to_vector<float>();
  CHECK(g.offset() == 3);  // 10 numbers use ceil(10/4) = 3 Philox blocks
  std::vector<float> b = rand({10}, DType::f32, &g).to_vector<float>();
  CHECK(a != b);
  randint(0, 5, {5}, &g);
  CHECK(g.offset() == 9);  // randint: 2 numbers per block -> 3 more
  g.manual_seed(100);
  CHECK(g.offset() == 0);
  CHECK(rand({10}, DType::f32, &g).to_vector<float>() == a);
  CHECK(rand({10}, DType::f32, &g).to_vector<float>() == b);
  g.set_offset(3);
  CHECK(rand({10}, DType::f32, &g).to_vector<float>() == b);
  // draw b started at block 3: its first four numbers are the lanes of Philox(100, 3)
  Philox4 r = philox4x32_10(100, 3);
  for (int j = 0; j < 4; ++j) CHECK(b[size_t(j)] == uniform01(r.v[j]));
}

TEST_CASE("random: errors") {
  AG_CHECK_ERROR(rand({2}, DType::i64), "rand", "floating", "i64");
  AG_CHECK_ERROR(randn({2}, DType::b8), "randn", "floating", "b8");
  AG_CHECK_ERROR(rand({2}, DType::f32, nullptr, 1, 1), "rand", "low < high", "[1, 1)");
  AG_CHECK_ERROR(randn({2}, DType::f32, nullptr, 0, -1), "randn", "std >= 0", "-1");
  AG_CHECK_ERROR(randint(5, 5, {2}), "randint", "low < high", "[5, 5)");
  Generator g(1);
  AG_CHECK_ERROR(rand({2}, DType::i64, &g), "rand");
  CHECK(g.offset() == 0);  // a refused draw consumes nothing
}
