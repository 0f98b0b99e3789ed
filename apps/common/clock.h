#pragma once
// The one clock of the apps: seconds on the steady clock, which never jumps, so the difference of
// two readings is a duration (the time of day is not its business).
#include <chrono>

namespace ag::apps {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// The seconds since `t0`, a reading of now_seconds().
inline double seconds_since(double t0) { return now_seconds() - t0; }

}  // namespace ag::apps
