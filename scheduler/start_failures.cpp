#include "scheduler/start_failures.h"

#include <algorithm>
#include <cmath>

namespace troupe {

StartFailures::StartFailures(StartBackoffOptions options) : options_(options) {}

void StartFailures::failed(int node, double now) {
  ++in_a_row_;
  const double delay = std::min(
      options_.max_delay_s, options_.first_delay_s * std::ldexp(1.0, std::min(in_a_row_, 30) - 1));
  next_try_ = now + delay;
  failed_at_[node] = now;
}

std::set<int> StartFailures::avoid(double now) const {
  std::set<int> out;
  for (const auto& [node, at] : failed_at_)
    if (now - at < options_.avoid_for_s) out.insert(node);
  return out;
}

}  // namespace troupe
