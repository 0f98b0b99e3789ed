// --threads 0: the cores other processes leave free (apps/common/threads.h).
#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <doctest/doctest.h>
#include <fmt/core.h>

#include "apps/common/threads.h"
#include "core/error.h"
#include "core/parallel.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::apps;

TEST_CASE("threads: /proc/stat sums busy and total jiffies of the CPUs asked for") {
  // user nice system idle iowait irq softirq steal guest guest_nice; the aggregate line is skipped
  const std::string text =
      "cpu  999 999 999 999 999 999 999 999 0 0\n"
      "cpu0 100 2 30 500 7 1 4 5 0 0\n"
      "cpu1 10 0 3 900 0 0 0 0 0 0\n"
      "cpu3 50 0 0 50\n"  // an old kernel's four counters
      "intr 123 4 5\n"
      "ctxt 6789\n";
  const CpuJiffies all = parse_proc_stat(text);
  // busy = user + nice + system + irq + softirq + steal; total = busy + idle + iowait
  CHECK(all.busy == (100 + 2 + 30 + 1 + 4 + 5) + (10 + 3) + 50);
  CHECK(all.total == (142 + 500 + 7) + (13 + 900) + (50 + 50));
  const CpuJiffies one = parse_proc_stat(text, {false, true});
  CHECK(one.busy == 13);
  CHECK(one.total == 913);
  const CpuJiffies zero_and_three = parse_proc_stat(text, {true, false, false, true});
  CHECK(zero_and_three.busy == 142 + 50);
  CHECK_THROWS_WITH_AS(parse_proc_stat("cpu  1 2 3 4\nintr 5\n"), doctest::Contains("no per-CPU line"), Error);
  CHECK_THROWS_WITH_AS(parse_proc_stat(text, {false, false, true}), doctest::Contains("no per-CPU line"), Error);
  CHECK_THROWS_WITH_AS(parse_proc_stat("cpu0 1 2\n"), doctest::Contains("'cpu0 1 2' has 2 counters"), Error);
}

TEST_CASE("threads: the free cores, and more threads only when two samples agree") {
  CHECK(free_cores(2, 0.0) == 2);
  CHECK(free_cores(2, 0.4) == 2);   // a light load: 1.6 rounds to 2
  CHECK(free_cores(2, 0.67) == 1);  // one busy thread beside our two gets 2/3 of a core
  CHECK(free_cores(2, 1.0) == 1);
  CHECK(free_cores(2, 3.5) == 1);   // never fewer than one
  CHECK(free_cores(16, 5.2) == 11);
  CHECK(free_cores(4, -0.1) == 4);  // rounding noise below zero
  CHECK(free_cores(0, 0.0) == 1);

  int pending = 0;
  CHECK(next_thread_count(2, 1, false, pending) == 1);  // fewer: at once
  CHECK(pending == 0);
  CHECK(next_thread_count(1, 2, false, pending) == 1);  // more: the first sample asking waits
  CHECK(pending == 2);
  CHECK(next_thread_count(1, 2, false, pending) == 2);  // the second agrees
  CHECK(pending == 0);
  CHECK(next_thread_count(1, 4, false, pending) == 1);
  CHECK(next_thread_count(1, 3, false, pending) == 1);  // another count: waits again
  CHECK(next_thread_count(1, 1, false, pending) == 1);  // the load came back: the request is dropped
  CHECK(pending == 0);
  CHECK(next_thread_count(1, 3, false, pending) == 1);
  CHECK(next_thread_count(1, 3, true, pending) == 3);  // at start, the measured count at once
}

TEST_CASE("threads: a busy process beside this one is measured and its core left to it") {
  const int before = num_threads();
  ag::test::TempDir tmp("threads");
  // a shell that spins on one core, for at most 30 s: timeout passes the SIGTERM below on to it
  ag::test::Child busy =
      ag::test::spawn_app({"/usr/bin/timeout", "30", "/bin/sh", "-c", "while :; do :; done"}, tmp.file(""), "busy");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // running
  AutoThreads a;
  a.start();
  REQUIRE(a.active());  // Linux: /proc/stat is there
  const std::optional<std::string> line = a.settle(1.0);
  ::kill(busy.pid, SIGTERM);
  CHECK(ag::test::wait_exit(busy, 10) == 128 + SIGTERM);  // timeout ends the shell and then itself
  INFO("others " << a.last_others());
  // the spinning shell holds a core the whole second (other tests running beside only add to it)
  CHECK(a.last_others() > 0.6);
  CHECK(a.last_others() < double(omp_get_num_procs()) + 0.2);
  const int cores = before;
  CHECK(num_threads() == free_cores(cores, a.last_others()));
  if (num_threads() != before) {
    REQUIRE(line.has_value());
    CHECK(line->find(fmt::format("threads: {} of {} cores", num_threads(), cores)) == 0);
  } else {
    CHECK_FALSE(line.has_value());
  }
  a.stop();
  CHECK_FALSE(a.poll().has_value());
  set_num_threads(before);
}

TEST_CASE("threads: poll re-measures once an interval has passed: fewer threads at once, more when two samples agree") {
  const int before = num_threads();
  set_num_threads(4);  // the most the governor takes: 4 cores
  // the readings the governor gets (AutoThreads::Source): the test sets the clock and the CPU
  // seconds; others = (d busy - d self) / d wall
  double wall = 0, self = 0, busy = 0;
  bool readable = true;
  int samples = 0;
  AutoThreads a(AutoThreads::Source{[&] { return wall; }, [&]() -> std::optional<AutoThreads::Sample> {
                                      if (!readable) return std::nullopt;
                                      ++samples;
                                      return AutoThreads::Sample{wall, self, busy};
                                    }});
  // every second our threads use as many CPU seconds as there are threads, the others `load`
  auto advance = [&](double seconds, double load) {
    wall += seconds;
    self += seconds * num_threads();
    busy += seconds * (num_threads() + load);
  };
  auto line = [](int threads, const char* others) {
    return fmt::format("threads: {} of 4 cores (other processes use {} of them; --threads N fixes the count)", threads,
                       others);
  };
  CHECK_FALSE(a.poll().has_value());  // not started: nothing read
  CHECK(samples == 0);
  a.start(5);  // at 0 s
  REQUIRE(a.active());
  CHECK(a.cores() == 4);
  advance(1, 1.0);  // one other process on a core: 4 - 1 = 3 threads, at once
  CHECK(a.settle(0) == line(3, "1.0"));
  CHECK(num_threads() == 3);
  CHECK(a.last_others() == doctest::Approx(1.0).epsilon(1e-12));
  advance(3, 0.0);  // 3 s after the last sample, under the 5 s interval: not even sampled
  CHECK_FALSE(a.poll().has_value());
  CHECK(samples == 2);
  CHECK(num_threads() == 3);
  advance(2, 0.0);  // 5 s: sampled; the core is free again over those 5 s, but one sample waits
  CHECK_FALSE(a.poll().has_value());
  CHECK(samples == 3);
  CHECK(a.last_others() == doctest::Approx(0.0).epsilon(1e-12));
  CHECK(num_threads() == 3);
  advance(5, 0.0);  // the second sample agrees: 4
  CHECK(a.poll() == line(4, "0.0"));
  CHECK(num_threads() == 4);
  advance(5, 2.6);  // 2.6 cores taken: round(4 - 2.6) = 1, at once
  CHECK(a.poll() == line(1, "2.6"));
  CHECK(num_threads() == 1);
  advance(5, 0.0);  // /proc/stat unreadable at this poll: nothing changes, the last sample stays
  readable = false;
  CHECK_FALSE(a.poll().has_value());
  CHECK(num_threads() == 1);
  CHECK(a.last_others() == doctest::Approx(2.6).epsilon(1e-12));
  readable = true;
  advance(5, 0.8);  // measured over the 10 s since the last sample: (0 + 0.8) 5 / 10 = 0.4 -> round(3.6) = 4, waits
  CHECK_FALSE(a.poll().has_value());
  CHECK(a.last_others() == doctest::Approx(0.4).epsilon(1e-12));
  CHECK(num_threads() == 1);
  advance(5, 0.4);  // agrees: 4
  CHECK(a.poll() == line(4, "0.4"));
  CHECK(num_threads() == 4);
  wall += 5, self += 30, busy += 20;  // this process's own seconds outgrew the busy ones (rounding of
                                       // the counters): no load below zero, the count stays
  CHECK_FALSE(a.poll().has_value());
  CHECK(a.last_others() == 0);
  CHECK(num_threads() == 4);
  const int sampled = samples;
  a.stop();
  advance(50, 3.0);
  CHECK_FALSE(a.poll().has_value());  // stopped: not read
  CHECK(samples == sampled);
  CHECK(num_threads() == 4);

  AutoThreads unreadable(AutoThreads::Source{[&] { return wall; }, [] { return std::optional<AutoThreads::Sample>(); }});
  unreadable.start(5);  // no /proc/stat: inactive, and the count is left alone
  CHECK_FALSE(unreadable.active());
  advance(10, 3.0);
  CHECK_FALSE(unreadable.settle(0).has_value());
  CHECK_FALSE(unreadable.poll().has_value());
  CHECK(num_threads() == 4);
  set_num_threads(before);
}
