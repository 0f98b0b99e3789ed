// The kernel profiler (core/profile.h).
#include "core/profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "core/error.h"
#include "cuda/memory.h"

namespace ag {

namespace detail {
std::atomic<bool> g_kernel_profiling{false};
}  // namespace detail

namespace {

std::atomic<int64_t (*)()> g_clock{nullptr};  // set_profile_clock's; null: the steady clock

int64_t now_ns() {
  if (const auto clock = g_clock.load(std::memory_order_relaxed)) return clock();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One timed call: CPU calls carry their time, GPU calls their two events (read at report()).
struct Record {
  const char* name;
  const std::type_info* last;
  Device device;
  double ms = 0;
  void* start = nullptr;
  void* end = nullptr;
};

struct State {
  std::mutex mutex;
  std::vector<Record> records;
  int64_t start_ns = 0;
};

State& state() {
  static State s;
  return s;
}

thread_local int t_depth = 0;  // KERNEL() calls open on this thread

// "ag::pw::Add" -> "Add": the per-element function of a map kernel, as its op reads
std::string function_name(const std::type_info& t) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(t.name(), nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : t.name();
  if (auto lt = s.find('<'); lt != std::string::npos) s.erase(lt);  // pw::Pow<float> -> pw::Pow
  if (auto colon = s.rfind("::"); colon != std::string::npos) s.erase(0, colon + 2);
  return s;
}

std::string label(const Record& r) {
  std::string name = r.name;
  if (auto lt = name.find('<'); lt != std::string::npos) name.erase(lt);  // attention_forward<T>
  if (name.rfind("map", 0) == 0) return name + " " + function_name(*r.last);
  return name;
}

}  // namespace

void detail::set_profile_clock(int64_t (*now_ns)()) { g_clock.store(now_ns, std::memory_order_relaxed); }

double KernelReport::kernel_ms(Device::Type type) const {
  double ms = 0;
  for (const KernelTime& k : kernels)
    if (k.device.type == type) ms += k.ms;
  return ms;
}

KernelProfiler::KernelProfiler() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (detail::g_kernel_profiling.load()) fail("KernelProfiler: another profiler is already running");
  s.records.clear();
  s.start_ns = now_ns();
  detail::g_kernel_profiling.store(true);
}

KernelProfiler::~KernelProfiler() {
  if (stopped_) return;
  try {
    report();
  } catch (...) {  // a destructor must not throw; the results are dropped anyway
    detail::g_kernel_profiling.store(false);
  }
}

KernelReport KernelProfiler::report() {
  if (stopped_) return result_;
  State& s = state();
  std::vector<Record> records;
  {
    std::lock_guard lock(s.mutex);
    detail::g_kernel_profiling.store(false);
    records.swap(s.records);
  }
  stopped_ = true;
  std::set<int> gpus;
  for (const Record& r : records)
    if (r.device.is_cuda()) gpus.insert(r.device.index);
  for (int g : gpus) cuda::synchronize(g);
  result_.wall_ms = double(now_ns() - s.start_ns) / 1e6;
  std::map<std::tuple<std::string, int, int>, KernelTime> sums;
  for (Record& r : records) {
    if (r.device.is_cuda()) {
      r.ms = cuda::event_elapsed_ms(r.start, r.end);
      cuda::destroy_event(r.start);
      cuda::destroy_event(r.end);
    }
    const std::string name = label(r);
    KernelTime& k = sums[{name, int(r.device.type), r.device.index}];
    k.name = name;
    k.device = r.device;
    k.calls += 1;
    k.ms += r.ms;
  }
  for (auto& [key, k] : sums) result_.kernels.push_back(k);
  std::stable_sort(result_.kernels.begin(), result_.kernels.end(),
                   [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  result_.calls = int64_t(records.size());
  return result_;
}

void detail::KernelScope::begin(const char* name, Device device, const std::type_info& last) {
  opened_ = true;
  if (++t_depth > 1) return;  // inside another kernel call of this thread: counted there
  active_ = true;
  name_ = name;
  last_ = &last;
  device_ = device;
  if (device.is_cuda())
    start_event_ = cuda::record_event(device.index);
  else
    start_ns_ = now_ns();
}

void detail::KernelScope::end() {
  --t_depth;
  if (!active_) return;
  Record r{name_, last_, device_};
  if (device_.is_cuda()) {
    r.start = start_event_;
    r.end = cuda::record_event(device_.index);
  } else {
    r.ms = double(now_ns() - start_ns_) / 1e6;
  }
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!detail::g_kernel_profiling.load()) {  // the profiler stopped during this call: drop it
    if (r.start) cuda::destroy_event(r.start), cuda::destroy_event(r.end);
    return;
  }
  s.records.push_back(r);
}

}  // namespace ag
