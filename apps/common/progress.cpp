// The progress bar (see progress.h).
#include "apps/common/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "apps/common/report.h"

namespace ag::apps {

std::string format_progress(const ProgressState& s, int bar_width) {
  std::string line = s.label.empty() ? "" : s.label + "  ";
  const bool known_total = s.total > 0;
  if (known_total) {
    const int digits = int(std::to_string(s.total).size());
    const double frac = std::clamp(double(s.step) / double(s.total), 0.0, 1.0);
    line += fmt::format("{:>{}}/{}  {:5.1f}%", s.step, digits, s.total, 100 * frac);
    if (bar_width > 0) {
      const int filled = int(frac * bar_width);
      line += fmt::format(" |{}{}|", std::string(size_t(filled), '#'), std::string(size_t(bar_width - filled), ' '));
    }
  } else {
    line += fmt::format("{}", s.step);
  }
  line += "  " + format_rate(s.rate, "it");
  double remaining = NAN;
  if (known_total && std::isfinite(s.rate) && s.rate > 0) remaining = double(std::max<int64_t>(s.total - s.step, 0)) / s.rate;
  line += fmt::format("  {}<{}", format_duration(s.elapsed), format_duration(remaining));
  for (const auto& f : s.fields) line += fmt::format("  {} {:.4g}", f.name, f.value);
  return line;
}

namespace {
double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressBar::ProgressBar(int64_t total, ProgressOptions opt)
    : out_(opt.out ? opt.out : stderr), opt_(std::move(opt)), total_(total) {
  if (!opt_.clock) opt_.clock = steady_seconds;
  tty_ = opt_.tty < 0 ? ::isatty(::fileno(out_)) != 0 : opt_.tty != 0;
  if (opt_.log_every <= 0) opt_.log_every = std::max<int64_t>(1, total / 20);
  start_ = last_time_ = opt_.clock();
}

ProgressBar::~ProgressBar() {
  if (!done_) finish();
}

double ProgressBar::rate() const { return sec_per_step_ > 0 ? 1.0 / sec_per_step_ : 0.0; }
double ProgressBar::elapsed() const { return opt_.clock() - start_; }

ProgressState ProgressBar::state() const {
  return ProgressState{opt_.label, step_, total_, rate(), elapsed(), fields_};
}

void ProgressBar::update(int64_t step, std::vector<ProgressField> fields) {
  if (done_) return;
  const double now = opt_.clock();
  if (step > last_step_) {
    const double spi = (now - last_time_) / double(step - last_step_);
    sec_per_step_ = sec_per_step_ == 0 ? spi : 0.3 * spi + 0.7 * sec_per_step_;
    last_step_ = step, last_time_ = now;
  }
  step_ = step;
  fields_ = std::move(fields);
  const bool last = total_ > 0 && step >= total_;
  if (tty_) {
    if (last || now - last_draw_ >= opt_.redraw_seconds) draw(false), last_draw_ = now;
  } else {
    const bool every_n = step / opt_.log_every > last_logged_step_ / opt_.log_every;
    if (last || every_n || now - last_draw_ >= opt_.log_seconds) {
      draw(false);
      last_draw_ = now, last_logged_step_ = step;
    }
  }
}

void ProgressBar::draw(bool final_draw) {
  std::string line = format_progress(state(), tty_ ? opt_.bar_width : 0);
  if (tty_) {
    // A line longer than the terminal wraps, and \r then only returns to the start of the last
    // row: cut it to the terminal's width.
    struct winsize ws {};
    if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col)
      line.resize(size_t(ws.ws_col) - 1);
    fmt::print(out_, "\r{}\x1b[K{}", line, final_draw ? "\n" : "");
    line_open_ = !final_draw;
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void ProgressBar::print(const std::string& line) {
  if (tty_ && line_open_) {
    fmt::print(out_, "\r\x1b[K{}\n", line);
    line_open_ = false;
    if (!done_) draw(false);
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (done_) return;
  done_ = true;
  // Plain mode already printed the last step's line when update() reached it.
  if (tty_ || last_logged_step_ != step_ || step_ == 0) draw(true);
}

}  // namespace ag::apps
