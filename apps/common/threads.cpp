#include "apps/common/threads.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/core.h>

#include "apps/common/clock.h"
#include "core/error.h"
#include "core/parallel.h"

namespace ag::apps {

CpuJiffies parse_proc_stat(std::string_view text, const std::vector<bool>& cpus) {
  CpuJiffies j;
  bool any = false;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice" (the aggregate "cpu " skipped)
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || !std::isdigit(static_cast<unsigned char>(line[3])))
      continue;
    std::istringstream f(line.substr(3));
    size_t n = 0;
    f >> n;
    uint64_t v[8] = {};
    int got = 0;
    while (got < 8 && f >> v[got]) ++got;
    check(got >= 4, "/proc/stat: the line '{}' has {} counters, expected at least 4", line, got);
    if (!cpus.empty() && (n >= cpus.size() || !cpus[n])) continue;
    any = true;
    const uint64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // user nice system irq softirq steal
    j.busy += busy;
    j.total += busy + v[3] + v[4];  // + idle iowait
  }
  check(any, "/proc/stat: no per-CPU line (cpuN) for the CPUs this process may run on");
  return j;
}

int free_cores(int cores, double others) {
  cores = std::max(cores, 1);
  const double free = double(cores) - std::max(others, 0.0);
  return std::clamp(int(std::lround(free)), 1, cores);
}

int next_thread_count(int have, int want, bool first, int& pending_up) {
  if (want > have && !first && pending_up != want) {
    pending_up = want;
    return have;
  }
  pending_up = 0;
  return want;
}

double AutoThreads::clock() const { return source_.clock ? source_.clock() : now_seconds(); }

std::optional<AutoThreads::Sample> AutoThreads::sample() const {
  return source_.sample ? source_.sample() : system_sample();
}

std::optional<AutoThreads::Sample> AutoThreads::system_sample() const {
  std::ifstream f("/proc/stat");
  if (!f) return std::nullopt;
  std::stringstream text;
  text << f.rdbuf();
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return std::nullopt;
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) return std::nullopt;
  Sample s;
  try {
    s.busy = double(parse_proc_stat(text.str(), cpus_).busy) / double(hz);
  } catch (const Error&) {
    return std::nullopt;
  }
  s.self = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  s.wall = now_seconds();
  return s;
}

void AutoThreads::start(double interval_s) {
  cpu_set_t set;
  CPU_ZERO(&set);
  cpus_.clear();
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) cpus_.resize(size_t(i) + 1), cpus_[size_t(i)] = true;
  }
  cores_ = std::max(1, num_threads());  // every core (OMP_NUM_THREADS where set): the most this takes
  interval_ = interval_s;
  pending_up_ = 0;
  const std::optional<Sample> s0 = sample();
  active_ = s0.has_value();
  if (active_) last_ = *s0;
}

std::optional<std::string> AutoThreads::settle(double min_s) {
  if (!active_) return std::nullopt;
  const double waited = clock() - last_.wall;
  if (waited < min_s) std::this_thread::sleep_for(std::chrono::duration<double>(min_s - waited));
  const std::optional<Sample> s = sample();
  return s ? update(*s, true) : std::nullopt;
}

std::optional<std::string> AutoThreads::poll() {
  if (!active_) return std::nullopt;
  if (clock() - last_.wall < interval_) return std::nullopt;
  const std::optional<Sample> s = sample();
  if (!s) return std::nullopt;
  return update(*s, false);
}

std::optional<std::string> AutoThreads::update(const Sample& now, bool first) {
  const double dt = now.wall - last_.wall;
  if (dt <= 0) return std::nullopt;
  others_ = std::max(0.0, ((now.busy - last_.busy) - (now.self - last_.self)) / dt);
  last_ = now;
  const int have = num_threads(), next = next_thread_count(have, free_cores(cores_, others_), first, pending_up_);
  if (next == have) return std::nullopt;
  set_num_threads(next);
  return fmt::format("threads: {} of {} cores (other processes use {:.1f} of them; --threads N fixes the count)",
                     next, cores_, others_);
}

AutoThreads& auto_threads() {
  static AutoThreads a;
  return a;
}

}  // namespace ag::apps
