#pragma once
// Where a program's time goes, kernel by kernel: a profiler built into KERNEL() (core/dispatch.h),
// the one door through which every op reaches a kernel on either backend.
//
// While a KernelProfiler is alive, each kernel call through KERNEL() is timed under the kernel's
// name (map1/map2/map3 with their per-element function: "map2 Add"):
//   - on the CPU, by the wall clock around the call (a CPU kernel returns when its work is done);
//   - on a GPU, by two CUDA events recorded on the device's stream around the call: the GPU's own
//     time for everything that call queued (cuBLAS's kernels and a bf16 operand conversion inside
//     matmul_forward included), not the host's time to launch it.
// report() waits for every GPU that was used and sums per (kernel, device); it also gives the wall
// time since the profiler started, so "wall - sum of GPU kernel time" is the time the GPU sat idle
// (waiting for the host to launch work, for copies, or for an allocation). Only the outermost
// KERNEL() of a thread is timed (an op front that calls another op inside a kernel call is counted
// once). Profilers do not nest: a second one while one is alive raises ag::Error.
//
// When no profiler is alive, KERNEL() pays one relaxed atomic load per call.
//
//   ag::KernelProfiler prof;
//   for (int i = 0; i < 5; ++i) train_step();
//   ag::KernelReport r = prof.report();            // kernels sorted by time, slowest first
//   for (const ag::KernelTime& k : r.kernels) fmt::print("{:<28} {:>6} {:>9.3f} ms\n", k.name, k.calls, k.ms);
//
// bench_train --profile prints this table for each training step it measures.
#include <atomic>
#include <cstdint>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/dtype.h"

namespace ag {

struct KernelTime {
  std::string name;    // the kernel's name in core/kernels/*.h ("matmul_forward", "map2 Add")
  Device device;
  int64_t calls = 0;
  double ms = 0;       // summed over its calls
};

struct KernelReport {
  std::vector<KernelTime> kernels;  // slowest first
  double wall_ms = 0;               // from the profiler's start to report() (GPUs waited for)
  int64_t calls = 0;                // kernel calls in all
  double kernel_ms(Device::Type type) const;  // the summed kernel time of one kind of device
};

class KernelProfiler {
 public:
  KernelProfiler();   // starts timing; raises ag::Error if another profiler is alive
  ~KernelProfiler();  // stops timing (the results are dropped unless report() was called)
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  // Waits for the GPUs, stops timing and returns the totals; a second call returns the same.
  KernelReport report();

 private:
  bool stopped_ = false;
  KernelReport result_;
};

namespace detail {

extern std::atomic<bool> g_kernel_profiling;

// For tests: the clock (nanoseconds) that times CPU kernel calls and the profiler's wall time;
// null restores the steady clock.
void set_profile_clock(int64_t (*now_ns)());

// Opened by KERNEL() around each kernel call; does nothing unless a profiler is alive. `last` is
// the type of the call's last argument (the per-element function of map1/map2/map3).
class KernelScope {
 public:
  KernelScope(const char* name, Device device, const std::type_info& last) {
    if (g_kernel_profiling.load(std::memory_order_relaxed)) begin(name, device, last);
  }
  ~KernelScope() {
    if (opened_) end();
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  void begin(const char* name, Device device, const std::type_info& last);
  void end();
  bool opened_ = false;  // counted in this thread's depth
  bool active_ = false;  // timed (the outermost call)
  const char* name_ = nullptr;
  const std::type_info* last_ = nullptr;
  Device device_;
  int64_t start_ns_ = 0;       // CPU
  void* start_event_ = nullptr;  // GPU
};

}  // namespace detail
}  // namespace ag
