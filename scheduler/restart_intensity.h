#pragma once
// Erlang/OTP's restart intensity for one supervised child: at most
// `max_restarts` restarts within any `window_s` seconds; the death past that
// is final. Plain: time comes in as `now` (seconds on a monotonic clock).
#include <deque>

namespace troupe {

class RestartIntensity {
 public:
  RestartIntensity(int max_restarts, double window_s);

  // The child died at `now`: true (and counted) when it may restart, false
  // when the limit is reached and it stays down.
  bool allow_restart(double now);
  int restarts() const { return total_; }

 private:
  int max_restarts_;
  double window_s_;
  std::deque<double> recent_;  // restart times within the window
  int total_ = 0;
};

}  // namespace troupe
