#pragma once
// --threads 0: every core that no other process is using.
//
// Why. OpenMP's threads meet at a barrier after every parallel region (hundreds per training step).
// When another busy process holds one of the cores, one of our threads waits for its time slice
// (milliseconds) at each barrier while the others spin on theirs, and the team runs at the pace of
// that thread (docs/benchmarks.md, "Threads beside another process"). So the apps use the cores no
// other process uses, measured at start and re-measured as the run goes (the other process may
// start or end later). attograd's CPU results are the same bits at any thread count
// (core/parallel.h), so this changes the speed only, never a number. An explicit --threads N is
// always kept as given.
//
// The load of the other processes, from two samples of /proc/stat (Linux):
//   busy(t)  = user + nice + system + irq + softirq + steal jiffies of the CPUs this process may run
//              on (sched_getaffinity), summed; / USER_HZ gives CPU seconds
//   self(t)  = this process's user + system CPU seconds (getrusage)
//   others   = ((busy(t1) - busy(t0)) - (self(t1) - self(t0))) / (t1 - t0)    in cores, >= 0
//   threads  = clamp(round(cores - others), 1, cores)                          (free_cores)
// Fewer threads are taken at once (a core shared costs far more than a core unused); more only when
// two samples in a row agree, so that a build that pauses a moment does not make the count flap.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ag::apps {

// The summed busy and total jiffies of the CPUs in `cpus` (bit i: cpuN with N = i; an empty mask
// means all) from the text of /proc/stat. Throws ag::Error when no "cpuN" line is there.
struct CpuJiffies {
  uint64_t busy = 0, total = 0;
};
CpuJiffies parse_proc_stat(std::string_view text, const std::vector<bool>& cpus = {});

// The thread count for `cores` usable cores when other processes use `others` of them (see above).
int free_cores(int cores, double others);

// One decision of the governor: the thread count after a sample that asks for `want` threads while
// `have` run: fewer at once; more only on the first sample or when the previous sample asked for the
// same count (`pending_up` holds that request between samples; 0: none).
int next_thread_count(int have, int want, bool first, int& pending_up);

// The governor of --threads 0. start() takes the first sample; settle() the second, at least
// `min_s` seconds later (it sleeps the rest; the apps load their data in between), and sets the
// thread count; poll() (after each training step; cheap) re-measures every `interval_s` seconds.
// settle() and poll() return a line to print when they changed the count. Inactive (nothing
// changes) until start(), and where /proc/stat cannot be read.
class AutoThreads {
 public:
  // One reading, in seconds: the wall clock, this process's own CPU time (getrusage) and the busy
  // time of the CPUs it may run on (/proc/stat).
  struct Sample {
    double wall = 0, self = 0, busy = 0;
  };
  // Where the readings come from. Empty functions read the system (the steady clock, /proc/stat
  // and getrusage); tests give their own, to feed the governor known loads.
  struct Source {
    std::function<double()> clock;                  // wall seconds: poll() reads it before sampling
    std::function<std::optional<Sample>()> sample;  // nullopt: nothing readable
  };
  AutoThreads() = default;
  explicit AutoThreads(Source source) : source_(std::move(source)) {}

  void start(double interval_s = 5);
  std::optional<std::string> settle(double min_s = 0.1);
  std::optional<std::string> poll();
  void stop() { active_ = false; }
  bool active() const { return active_; }
  int cores() const { return cores_; }  // the most threads it takes
  double last_others() const { return others_; }  // cores used by other processes at the last sample

 private:
  double clock() const;
  std::optional<Sample> sample() const;
  std::optional<Sample> system_sample() const;
  std::optional<std::string> update(const Sample& now, bool first);

  Source source_;
  bool active_ = false;
  int cores_ = 1;
  double interval_ = 5, others_ = 0;
  int pending_up_ = 0;  // a larger count seen at the previous sample, waiting for a second
  Sample last_;
  std::vector<bool> cpus_;
};

// The process's governor: apply_run_options starts it for --threads 0 in a job of one process; the
// Run constructor settles it (before the apps measure the peak FLOP/s on the threads they will
// use) and Run::step_done polls it.
AutoThreads& auto_threads();

}  // namespace ag::apps
