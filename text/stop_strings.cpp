#include "text/stop_strings.h"

#include <algorithm>

namespace troupe {

StopStringFilter::StopStringFilter(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

size_t StopStringFilter::held_tail_length() const {
  size_t hold = 0;
  for (const std::string& s : stops_) {
    size_t k = std::min(s.size() - 1, pending_.size());
    for (; k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) break;
    }
    hold = std::max(hold, k);
  }
  return hold;
}

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  pending_ += text;
  // Only the held tail (shorter than every stop string) precedes the new text,
  // so a match found here cannot start in text already released.
  // The earliest match; of two at one place, the one listed first.
  size_t first = std::string::npos, length = 0;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) first = at, length = s.size();
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first + (include_stop_ ? length : 0));
    pending_.clear();
    return out;
  }
  size_t keep = held_tail_length();
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopStringFilter::flush() {
  if (stopped_) return {};
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace troupe
