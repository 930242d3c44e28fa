#include "scheduler/restart_intensity.h"

#include <stdexcept>

namespace troupe {

RestartIntensity::RestartIntensity(int max_restarts, double window_s)
    : max_restarts_(max_restarts), window_s_(window_s) {
  if (max_restarts < 0) throw std::invalid_argument("supervision.max_restarts must be >= 0");
  if (!(window_s > 0)) throw std::invalid_argument("supervision.within_s must be positive");
}

bool RestartIntensity::allow_restart(double now) {
  while (!recent_.empty() && now - recent_.front() > window_s_) recent_.pop_front();
  if (int(recent_.size()) >= max_restarts_) return false;
  recent_.push_back(now);
  ++total_;
  return true;
}

}  // namespace troupe
