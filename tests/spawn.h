#pragma once
// Child processes for the tests that run programs as a user would (the apps, mpirun): spawned
// with their output in files, waited for with a deadline so that a hung program fails its test
// instead of hanging the suite.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "tests/helpers.h"

extern char** environ;

namespace ag::test {

// A spawned app: its stdout and stderr go to files in `log_dir`.
struct Child {
  pid_t pid = -1;
  std::string out_path, err_path;
  std::string out() const { return read_bytes(out_path); }
  std::string err() const { return read_bytes(err_path); }
  std::string output() const { return out() + err(); }
};

// posix_spawn (safe in the multithreaded test process, unlike fork + arbitrary code) with default
// SIGINT/SIGTERM dispositions and an empty signal mask, whatever the test runner set, and
// OMP_WAIT_POLICY=PASSIVE so its idle OpenMP threads do not spin on the shared cores.
// `extra_env`: "NAME=value" entries added to (or replacing) the inherited environment.
inline Child spawn_app(const std::vector<std::string>& args, const std::string& log_dir, const std::string& tag,
                       const std::vector<std::string>& extra_env = {}) {
  Child c;
  c.out_path = log_dir + "/" + tag + ".out";
  c.err_path = log_dir + "/" + tag + ".err";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> env, overrides = extra_env;
  overrides.emplace_back("OMP_WAIT_POLICY=PASSIVE");
  auto overridden = [&overrides](const char* e) {
    for (const std::string& o : overrides)
      if (std::strncmp(e, o.c_str(), o.find('=') + 1) == 0) return true;
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e)
    if (!overridden(*e)) env.emplace_back(*e);
  env.insert(env.end(), overrides.begin(), overrides.end());
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  REQUIRE_MESSAGE(rc == 0, "cannot spawn ", args[0], ": ", std::strerror(rc));
  return c;
}

// The exit code, 128 + the signal if one ended it, or -1 after `timeout_s` (the child is then
// killed, so that a hung app fails the test instead of hanging the suite).
inline int wait_exit(const Child& c, double timeout_s = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    REQUIRE(r >= 0);
    if (r == c.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Runs an app to its end; the exit code must be `expected` (the output is shown otherwise).
inline Child run_app(const std::vector<std::string>& args, const std::string& log_dir, const std::string& tag,
                     int expected = 0, const std::vector<std::string>& extra_env = {}) {
  Child c = spawn_app(args, log_dir, tag, extra_env);
  const int rc = wait_exit(c);
  INFO("command: " << fmt::format("{}", fmt::join(args, " ")));
  INFO("output:\n" << c.output());
  REQUIRE(rc == expected);
  return c;
}

}  // namespace ag::test
