#pragma once
// A training progress bar on stderr.
//   On a terminal (isatty): one line redrawn in place with \r, at most ~10 times a second:
//     train  1234/5000  24.7% |######                  | 12.3 it/s  1:40<5:06  loss 2.345  lr 0.0003
//   Elsewhere (a log file, CI): the same text as plain lines, one every `log_every` steps or every
//   `log_seconds`, whichever comes first, and one at the end.
// it/s is smoothed (an exponential moving average of seconds per step, weight 0.3 on the newest
// interval, as tqdm does), so the ETA = remaining steps / rate does not jump with every step.
//
//   ProgressBar bar(total, {.label = "train"});
//   for (step = 1..total) { ...; bar.update(step, {{"loss", loss}, {"lr", lr}}); }
//   bar.finish();
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace ag::apps {

struct ProgressField {
  std::string name;
  double value;  // printed with 4 significant digits
};

// What one line shows; format_progress is a pure function of it (tests, custom front ends).
struct ProgressState {
  std::string label;
  int64_t step = 0, total = 0;   // total <= 0: unknown (no percent, bar or ETA)
  double rate = 0;               // steps per second; 0 or non-finite: not known yet
  double elapsed = 0;            // seconds
  std::vector<ProgressField> fields;
};
// bar_width 0 leaves the bar out. The ETA is shown as "elapsed<remaining" (tqdm's form).
std::string format_progress(const ProgressState& s, int bar_width = 24);

struct ProgressOptions {
  std::string label{};
  int bar_width = 24;
  double redraw_seconds = 0.1;   // terminal: minimum time between redraws
  int64_t log_every = 0;         // plain: a line every this many steps (0: total / 20, at least 1)
  double log_seconds = 10;       // plain: or when this long has passed since the last line
  int tty = -1;                  // -1: isatty(fileno(out)); 0 or 1 forces the mode
  std::FILE* out = nullptr;      // nullptr: stderr
  std::function<double()> clock{}; // seconds, monotonic; empty: std::chrono::steady_clock
};

class ProgressBar {
 public:
  explicit ProgressBar(int64_t total, ProgressOptions opt = {});
  ~ProgressBar();  // finish() if not done yet
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `step` steps are done (1 after the first). Draws when due; the last step always draws.
  void update(int64_t step, std::vector<ProgressField> fields = {});
  // A message on its own line (eval results...) that leaves the bar intact below it.
  void print(const std::string& line);
  // Draws the final state and ends the line; later updates are ignored.
  void finish();

  double rate() const;          // smoothed steps per second (0 before two updates)
  double elapsed() const;
  ProgressState state() const;
  bool is_terminal() const { return tty_; }

 private:
  void draw(bool final_draw);
  std::FILE* out_;
  ProgressOptions opt_;
  bool tty_;
  bool done_ = false;
  int64_t total_, step_ = 0, last_step_ = 0;
  double start_, last_time_, last_draw_ = -1e300;
  int64_t last_logged_step_ = 0;
  double sec_per_step_ = 0;      // smoothed; 0 until the first interval
  std::vector<ProgressField> fields_;
  bool line_open_ = false;       // terminal: a partial line is on screen
};

}  // namespace ag::apps
