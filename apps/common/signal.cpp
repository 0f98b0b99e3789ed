// SIGINT/SIGTERM -> a flag (see signal.h). A signal handler may only touch lock-free atomics and
// call async-signal-safe functions (write, _exit), so that is all this one does.
#include "apps/common/signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace ag::apps {

namespace {
std::atomic<int> g_signal{0};  // the first signal received, 0 when none
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_old_int {}, g_old_term {};
bool g_installed = false;

void on_stop_signal(int sig) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) {
    const char msg[] = "\n[stop requested: finishing the step, saving; press Ctrl-C again to quit now]\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    return;
  }
  const char msg[] = "\n[second stop signal: exiting immediately]\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
  _exit(128 + sig);
}
}  // namespace

void install_stop_handlers() {
  if (g_installed) return;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read in the data loader resumes instead of failing EINTR
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  g_installed = true;
}

void restore_stop_handlers() {
  if (!g_installed) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

bool stop_requested() { return g_signal.load() != 0; }
int stop_signal() { return g_signal.load(); }
void clear_stop_request() { g_signal.store(0); }

}  // namespace ag::apps
