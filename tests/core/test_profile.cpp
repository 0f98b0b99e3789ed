// The kernel profiler (core/profile.h): what KERNEL() times, under which names, and when it stops.
#include <chrono>

#include "core/profile.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
const KernelTime* find(const KernelReport& r, const std::string& name) {
  for (const KernelTime& k : r.kernels)
    if (k.name == name) return &k;
  return nullptr;
}
}  // namespace

TEST_CASE("profile: each kernel call is counted under its name, and the times add up within the wall time") {
  Generator gen(1);
  Tensor a = randn({256, 256}, DType::f32, &gen), b = randn({256, 256}, DType::f32, &gen);
  Tensor x = randn({4}, DType::f32, &gen), y = randn({4}, DType::f32, &gen);
  const auto t0 = std::chrono::steady_clock::now();
  KernelProfiler prof;
  for (int i = 0; i < 3; ++i) (void)matmul(a, b);
  for (int i = 0; i < 2; ++i) (void)(x + y);
  (void)(x * y);
  KernelReport r = prof.report();
  const double outside_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  const KernelTime* mm = find(r, "matmul_forward");
  const KernelTime* add = find(r, "map2 Add");
  const KernelTime* mul = find(r, "map2 Mul");
  REQUIRE(mm != nullptr);
  REQUIRE(add != nullptr);
  REQUIRE(mul != nullptr);
  CHECK(mm->calls == 3);
  CHECK(add->calls == 2);
  CHECK(mul->calls == 1);
  CHECK(mm->device == Device::cpu());
  // 3 x 33.6 MFLOP take far longer than 3 additions of 4 numbers
  CHECK(mm->ms > 0);
  CHECK(mm->ms > 10 * (add->ms + mul->ms));
  // milliseconds, not another unit: the kernels ran inside the test's own clock, and the sums are
  // within the profiler's wall time
  CHECK(r.kernel_ms(Device::CPU) <= r.wall_ms);
  CHECK(r.wall_ms <= outside_ms);
  CHECK(r.kernel_ms(Device::CUDA) == 0);
  int64_t calls = 0;
  for (size_t i = 0; i < r.kernels.size(); ++i) {
    calls += r.kernels[i].calls;
    if (i > 0) CHECK(r.kernels[i - 1].ms >= r.kernels[i].ms);  // slowest first
  }
  CHECK(calls == r.calls);
  CHECK(r.calls == 6);
}

TEST_CASE("profile: timing stops at report(), one profiler runs at a time, and a dropped one stops too") {
  Tensor x = ones({8}), y = ones({8});
  {
    KernelProfiler prof;
    (void)(x + y);
    AG_CHECK_ERROR(KernelProfiler(), "another profiler is already running");
    KernelReport r = prof.report();
    (void)(x + y);  // after report(): not counted
    KernelReport again = prof.report();
    CHECK(r.calls == 1);
    CHECK(again.calls == 1);
    CHECK(again.wall_ms == r.wall_ms);
  }
  {
    KernelProfiler dropped;  // never reported
    (void)(x + y);
  }
  KernelProfiler fresh;  // the dropped one stopped: this one starts empty
  (void)(x * y);
  KernelReport r = fresh.report();
  CHECK(r.calls == 1);
  REQUIRE(r.kernels.size() == 1);
  CHECK(r.kernels[0].name == "map2 Mul");
}
