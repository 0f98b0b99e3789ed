// The caching CPU allocator (core/allocator.h) and how the tape gives memory back.
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
uint64_t in_use() { return alloc_stats().bytes_in_use; }
// Bytes a tensor's storage holds in the allocator.
uint64_t held(const Tensor& t) { return alloc_size_class(t.impl().storage->bytes); }
}  // namespace

TEST_CASE("allocator: size classes") {
  // 64-byte multiples up to 4 KiB
  CHECK(alloc_size_class(0) == 64);
  CHECK(alloc_size_class(1) == 64);
  CHECK(alloc_size_class(64) == 64);
  CHECK(alloc_size_class(65) == 128);
  CHECK(alloc_size_class(4095) == 4096);
  CHECK(alloc_size_class(4096) == 4096);
  // then four classes per power of two: [4096, 8192) in steps of 1024
  CHECK(alloc_size_class(4097) == 5120);
  CHECK(alloc_size_class(6144) == 6144);
  CHECK(alloc_size_class(8191) == 8192);
  CHECK(alloc_size_class(8193) == 10240);
  CHECK(alloc_size_class((size_t(1) << 20) + 1) == (size_t(1) << 20) + (size_t(1) << 18));
  CHECK(alloc_size_class(size_t(3) << 30) == size_t(3) << 30);
  // a class holds the request with at most 25% slack and is 64-byte aligned
  for (size_t b = 1; b < (size_t(1) << 24); b = b * 5 / 3 + 1) {
    size_t c = alloc_size_class(b);
    CHECK(c >= b);
    CHECK(c % 64 == 0);
    if (b > 4096) CHECK(double(c) <= 1.25 * double(b));
    CHECK(alloc_size_class(c) == c);  // classes are fixed points
  }
}

TEST_CASE("allocator: a freed block is reused for the same size") {
  { Tensor warm = empty({77777}); }  // now one block of this class is cached
  AllocStats s0 = alloc_stats();
  CHECK(s0.bytes_cached >= alloc_size_class(77777 * 4));
  for (int i = 0; i < 5; ++i) {
    Tensor t = empty({77777});
    CHECK(uint64_t(reinterpret_cast<uintptr_t>(t.raw_data())) % 64 == 0);
  }
  AllocStats s1 = alloc_stats();
  CHECK(s1.cache_hits == s0.cache_hits + 5);
  CHECK(s1.system_allocs == s0.system_allocs);
  CHECK(s1.bytes_in_use == s0.bytes_in_use);
  // a size of the same class is served by the same block
  { Tensor u = empty({77770}); }
  CHECK(alloc_stats().system_allocs == s0.system_allocs);
  CHECK(alloc_stats().peak_bytes_in_use >= s0.bytes_in_use + alloc_size_class(77777 * 4));
}

TEST_CASE("allocator: bytes_in_use returns to its baseline") {
  const uint64_t base = in_use();
  {
    Tensor a = randn({100, 30});
    Tensor b = exp(a);
    Tensor c = add(a, b).transpose(0, 1).contiguous();
    Tensor v = c.narrow(0, 1, 5);  // a view holds its base's storage
    CHECK(in_use() == base + held(a) + held(b) + held(c) + 0 * held(v));
    a = Tensor();
    b = Tensor();
    c = Tensor();
    CHECK(in_use() == base + held(v));
  }
  CHECK(in_use() == base);
}

TEST_CASE("allocator: empty_cache gives the cached blocks back") {
  { Tensor t = empty({12345}); }
  AllocStats s0 = alloc_stats();
  CHECK(s0.bytes_cached > 0);
  empty_cache();
  AllocStats s1 = alloc_stats();
  CHECK(s1.bytes_cached == 0);
  CHECK(s1.system_frees > s0.system_frees);
  CHECK(s1.bytes_in_use == s0.bytes_in_use);
}

TEST_CASE("allocator: a block larger than the available memory gives the cache back first") {
  // 1 MiB available (the probe): a cached 4 MiB block stays while the new block fits, and is given
  // back before a new block that does not, as an evaluation's new sizes after a training step
  static uint64_t available = 0;
  set_available_memory_probe([] { return available; });
  empty_cache();
  { Tensor t = empty({int64_t(1) << 20}); }  // 4 MiB, cached when freed
  const AllocStats s0 = alloc_stats();
  REQUIRE(s0.bytes_cached >= (uint64_t(4) << 20));
  available = uint64_t(1) << 20;
  { Tensor small = empty({1000}); }  // 4000 bytes fit: the cache is kept
  CHECK(alloc_stats().bytes_cached >= s0.bytes_cached);
  CHECK(alloc_stats().system_frees == s0.system_frees);
  Tensor big = empty({int64_t(3) << 18});  // 3 MiB > 1 MiB available: the cache goes first
  const AllocStats s1 = alloc_stats();
  CHECK(s1.system_frees > s0.system_frees);
  CHECK(s1.bytes_cached == 0);
  big = Tensor();
  available = UINT64_MAX;  // plenty: a miss keeps the cache
  { Tensor other = empty({int64_t(5) << 18}); }
  const uint64_t frees = alloc_stats().system_frees;
  { Tensor again = empty({int64_t(7) << 18}); }
  CHECK(alloc_stats().system_frees == frees);
  set_available_memory_probe(nullptr);
}

TEST_CASE("allocator: MemAvailable of /proc/meminfo in bytes, unknown (no limit) when missing or malformed") {
  // the layout of Linux's /proc/meminfo: "Name:", spaces to column 16, the count, " kB"
  const std::string real =
      "MemTotal:       24609216 kB\n"
      "MemFree:         1234567 kB\n"
      "MemAvailable:   20135340 kB\n"
      "Buffers:          345678 kB\n"
      "HugePages_Total:       0\n"
      "Hugepagesize:       2048 kB\n";
  CHECK(parse_meminfo_available(real) == uint64_t(20135340) * 1024);
  // the last line without its newline, a tab as separator, and the smallest count
  CHECK(parse_meminfo_available("MemFree: 1 kB\nMemAvailable:\t7 kB") == 7 * 1024);
  CHECK(parse_meminfo_available("MemAvailable: 0 kB\n") == 0);
  // missing: kernels before 3.14 have no MemAvailable line; an empty text; a name that only starts alike
  const uint64_t unknown = UINT64_MAX;
  CHECK(parse_meminfo_available("MemTotal:       24609216 kB\nMemFree:         1234567 kB\n") == unknown);
  CHECK(parse_meminfo_available("") == unknown);
  CHECK(parse_meminfo_available("MemAvailableSoon: 5 kB\n") == unknown);
  CHECK(parse_meminfo_available(" MemAvailable: 5 kB\n") == unknown);
  // malformed counts and units are not read as numbers, and a later well-formed line still counts
  for (const char* bad : {"MemAvailable: lots kB\n", "MemAvailable:\n", "MemAvailable: -5 kB\n", "MemAvailable: 5\n",
                          "MemAvailable: 5 MB\n", "MemAvailable: 5kB\n", "MemAvailable: 5 kB extra\n",
                          "MemAvailable: 5.5 kB\n", "MemAvailable: \x01\xff kB\n"}) {
    CAPTURE(bad);
    CHECK(parse_meminfo_available(bad) == unknown);
    CHECK(parse_meminfo_available(std::string(bad) + "MemAvailable: 3 kB\n") == 3 * 1024);
  }
  // the largest count whose bytes fit in 64 bits, and the next, which does not (nor 2^64 kB itself)
  const uint64_t most = UINT64_MAX / 1024;
  CHECK(parse_meminfo_available(fmt::format("MemAvailable: {} kB\n", most)) == most * 1024);
  CHECK(parse_meminfo_available(fmt::format("MemAvailable: {} kB\n", most + 1)) == unknown);
  CHECK(parse_meminfo_available("MemAvailable: 18446744073709551616 kB\n") == unknown);
  // this machine's own file: a count, and no more than the memory it has
  const std::string own = read_bytes("/proc/meminfo");
  const uint64_t avail = parse_meminfo_available(own);
  CHECK(avail != unknown);
  CHECK(avail <= uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)));
}

TEST_CASE("allocator: impossible sizes raise ag::Error") {
  AG_CHECK_ERROR(empty({int64_t(1) << 40, int64_t(1) << 40}), "empty", "too large");
  AG_CHECK_ERROR(empty({int64_t(1) << 50}, DType::f32), "allocator", "out of memory");
}

TEST_CASE("allocator: the tape frees a graph that goes out of scope") {
  // An MLP-like chain recorded without backward (an eval loop that forgot NoGradGuard): every
  // activation lives only in the nodes, which die with the last tensor that reaches them.
  Tensor x = randn({16, 8}, DType::f64);
  Tensor w1 = leaf64({1, 8}, 1), b1 = leaf64({8}, 2), w2 = leaf64({16, 1}, 3);
  const uint64_t base = in_use();
  {
    Tensor h = tanh(add(mul(x, w1), b1));
    Tensor y = mean(mul(sigmoid(mul(h, w2)), h));
    CHECK(y.requires_grad());
    CHECK(in_use() >= base + 2 * held(x));  // tanh and sigmoid outputs, saved for backward
  }
  CHECK(in_use() == base);
  // The same with many steps of a loop, each making a new graph.
  for (int step = 0; step < 3; ++step) {
    Tensor loss = sum(exp(mul(x, w1)));
    (void)loss;
  }
  CHECK(in_use() == base);
}

TEST_CASE("allocator: backward without retain_graph frees the saved tensors") {
  Tensor x = randn({16, 8}, DType::f64);
  Tensor w1 = leaf64({1, 8}, 1), b1 = leaf64({8}, 2), w2 = leaf64({16, 1}, 3);
  const uint64_t base = in_use();
  Tensor loss = mean(mul(sigmoid(mul(tanh(add(mul(x, w1), b1)), w2)), x));
  const uint64_t with_graph = in_use();
  CHECK(with_graph >= base + 2 * held(x));
  loss.backward();
  // what is left: the parameters' gradients and the loss itself
  REQUIRE(w1.grad().defined());
  REQUIRE(b1.grad().defined());
  REQUIRE(w2.grad().defined());
  CHECK(in_use() == base + held(w1.grad()) + held(b1.grad()) + held(w2.grad()) + held(loss));
  // with retain_graph the saved tensors stay until the graph dies
  for (Tensor p : {w1, b1, w2}) p.set_grad(Tensor());
  const uint64_t base2 = in_use();
  {
    Tensor loss2 = mean(mul(sigmoid(mul(tanh(add(mul(x, w1), b1)), w2)), x));
    const uint64_t graph2 = in_use();
    loss2.backward(Tensor(), /*retain_graph=*/true);
    CHECK(in_use() >= graph2);
  }
  CHECK(in_use() == base2 + held(w1.grad()) + held(b1.grad()) + held(w2.grad()));
}
