#pragma once
// Ctrl-C saves and exits cleanly: the first SIGINT or SIGTERM only sets a flag that the training
// loop polls between steps (then it saves a checkpoint, writes the report and returns); a second
// one exits at once (status 128 + signal), for when saving itself hangs.
//
//   StopGuard stop;                         // installs the handlers, restores the old ones at scope end
//   for (step...) { ...; if (stop_requested()) { save(); break; } }
namespace ag::apps {

void install_stop_handlers();    // SIGINT and SIGTERM -> the flag (keeps the previous handlers)
void restore_stop_handlers();    // puts the previous handlers back; the flag keeps its value
bool stop_requested();           // a signal arrived since the last clear
int stop_signal();               // which one (SIGINT, SIGTERM), 0 when none
void clear_stop_request();

struct StopGuard {
  StopGuard() { install_stop_handlers(); }
  ~StopGuard() { restore_stop_handlers(); }
  StopGuard(const StopGuard&) = delete;
  StopGuard& operator=(const StopGuard&) = delete;
};

}  // namespace ag::apps
