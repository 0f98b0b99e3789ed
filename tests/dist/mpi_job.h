#pragma once
// What the tests that start programs under mpirun share (tests/dist/test_dist.cpp with dist_check,
// tests/dist/test_dist_apps.cpp with the apps): the skips in a build without MPI (or NCCL and its
// GPUs), the environment
// Open MPI needs here, and a Job: one temporary folder whose commands run with that environment.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/memory.h"
#include "dist/dist.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

namespace ag::test {

// Reports the case as skipped (CTest lists it so) in a build without MPI.
inline bool skip_without_mpi() {
  if (dist::mpi_available()) return false;
  MESSAGE("[skipped: no MPI in this build (libopenmpi-dev)]");
  return true;
}

// Reports the case as skipped in a build without MPI or NCCL, or on a machine with fewer than
// `gpus` GPUs (NCCL: one GPU per rank).
inline bool skip_without_nccl_gpus(int gpus) {
  if (skip_without_mpi()) return true;
  if (!dist::nccl_available()) {
    MESSAGE("[skipped: no NCCL in this build (ATTOGRAD_NCCL)]");
    return true;
  }
  if (cuda::device_count() < gpus) {
    MESSAGE("[skipped: no " << gpus << " CUDA devices (NCCL needs one GPU per rank; " << cuda::device_count()
                            << " visible)]");
    return true;
  }
  return false;
}

// Open MPI refuses to run as root (as CI does) unless told twice that it is meant. Each job keeps
// its session directory in its own folder: under /tmp, two mpirun started at the same moment (CTest
// runs cases in parallel) race to create the shared /tmp/ompi.<host>.<uid> and one of them fails
// with "mkdir ... File exists". Under AddressSanitizer, LeakSanitizer would report what Open MPI's
// own initialisation keeps until exit in every rank: leak checking is off for the ranks (the same
// code is leak-checked in-process).
inline std::vector<std::string> mpi_env(const std::string& session_dir) {
  std::vector<std::string> env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                  "TMPDIR=" + session_dir, "OMPI_MCA_orte_tmpdir_base=" + session_dir};
  if (const char* asan = std::getenv("ASAN_OPTIONS")) env.push_back(std::string("ASAN_OPTIONS=") + asan + ":detect_leaks=0");
  return env;
}

// |a - b| <= atol + rtol |b| element by element; reports the worst element.
inline void check_close(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol,
                        const std::string& what) {
  REQUIRE(a.size() == b.size());
  REQUIRE_FALSE(a.empty());
  size_t worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < a.size(); ++i) {
    const double excess = std::abs(a[i] - b[i]) - (atol + rtol * std::abs(b[i]));
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  INFO(what << ": worst element " << worst << ": " << a[worst] << " vs " << b[worst]);
  CHECK(worst_excess <= 0);
}

// A temporary folder and the environment of its mpirun commands.
struct Job {
  explicit Job(const std::string& tag) : dir("dist_" + tag) {}
  TempDir dir;
  std::vector<std::string> env = mpi_env(dir.dir.string());
  std::string path(const std::string& f) const { return dir.dir.string() + "/" + f; }
  // `cmd` (a program and its arguments) as `n` ranks of one job, on any number of cores.
  static std::vector<std::string> mpirun(int n, const std::vector<std::string>& cmd) {
    std::vector<std::string> full = {ATTOGRAD_MPIEXEC, "-np", std::to_string(n), "--oversubscribe"};
    full.insert(full.end(), cmd.begin(), cmd.end());
    return full;
  }
  Child run(const std::vector<std::string>& cmd, const std::string& tag, int expected = 0) {
    return run_app(cmd, dir.dir.string(), tag, expected, env);
  }
};

}  // namespace ag::test
