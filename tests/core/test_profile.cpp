// The kernel profiler (core/profile.h): what KERNEL() times, under which names, and when it stops.
#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>
#include <typeinfo>

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

namespace {
// The profiler's clock in these cases: a number the test sets (set_profile_clock), in ns.
std::atomic<int64_t> g_test_ns{0};
int64_t test_clock() { return g_test_ns.load(); }
void at_ms(int64_t ms) { g_test_ns.store(ms * 1'000'000); }
// One kernel call through the door KERNEL() opens, as long as the scope lives.
struct Call {
  detail::KernelScope scope;
  explicit Call(const char* name) : scope(name, Device::cpu(), typeid(void)) {}
};
}  // namespace

TEST_CASE("profile: only a thread's outermost kernel call is timed, nested and recursive calls count in it") {
  detail::set_profile_clock(test_clock);
  at_ms(0);
  std::optional<Call> before;
  before.emplace("opened_before_the_profiler");  // no profiler yet: not counted, and not in the depth
  KernelProfiler prof;                          // starts at 0 ms
  {
    at_ms(1);
    Call outer("outer");  // 1 .. 20 ms
    {
      at_ms(3);
      Call inner("inner");  // 3 .. 7: inside outer, not timed
      at_ms(7);
    }
    {
      at_ms(8);
      Call again("outer");  // the same name inside itself (recursion): 8 .. 9, not timed
      at_ms(9);
    }
    at_ms(10);
    std::thread([] {  // another thread's depth is its own: 10 .. 15, timed
      Call other("other_thread");
      at_ms(15);
    }).join();
    try {
      Call throws("inner");  // left by an exception: the depth still comes back down
      throw std::runtime_error("kernel failed");
    } catch (const std::runtime_error&) {
    }
    at_ms(20);
  }
  {
    at_ms(22);
    Call inner("inner");  // at the top now: 22 .. 26, timed
    at_ms(26);
  }
  {
    at_ms(27);
    Call inside_before("inside");  // inside the call opened before the profiler: outermost, 27 .. 30
    at_ms(30);
  }
  before.reset();  // at 30: dropped (not counted)
  std::optional<Call> straddles;
  straddles.emplace("straddles");  // opened before report(), closed after it: dropped
  at_ms(40);
  const KernelReport r = prof.report();
  straddles.reset();
  // hand totals: outer 20 - 1 = 19 ms (inner, the recursion and the other thread inside it),
  // other_thread 15 - 10 = 5, inner 26 - 22 = 4, inside 30 - 27 = 3; wall 40; 4 calls
  CHECK(r.calls == 4);
  CHECK(r.wall_ms == 40);
  REQUIRE(r.kernels.size() == 4);
  const std::vector<std::pair<std::string, double>> want = {{"outer", 19}, {"other_thread", 5}, {"inner", 4}, {"inside", 3}};
  for (size_t i = 0; i < want.size(); ++i) {  // slowest first
    CAPTURE(i);
    CHECK(r.kernels[i].name == want[i].first);
    CHECK(r.kernels[i].calls == 1);
    CHECK(r.kernels[i].ms == want[i].second);
  }
  CHECK(r.kernel_ms(Device::CPU) == 19 + 5 + 4 + 3);
  {
    KernelProfiler fresh;  // what straddled the last one did not leak into this one
    at_ms(41);
    {
      Call c("outer");  // 41 .. 43
      at_ms(43);
    }
    {
      Call c("outer");  // 43 .. 46
      at_ms(46);
    }
    const KernelReport r2 = fresh.report();
    CHECK(r2.calls == 2);
    REQUIRE(r2.kernels.size() == 1);
    CHECK(r2.kernels[0].ms == 2 + 3);  // two top-level calls of one name: summed
    CHECK(r2.wall_ms == 46 - 40);
  }
  detail::set_profile_clock(nullptr);
}
