#include "scheduler/admission_queue.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe {
namespace {

// Enough dequeue times for a good rate estimate; beyond it the window is
// shortened instead of growing memory with the request rate.
constexpr size_t kMaxPopTimes = 4096;

void check_wait(double max_wait_s, const std::string& field) {
  if (std::isnan(max_wait_s)) {
    throw std::invalid_argument("admission." + field + " must be a number (<= 0: no limit)");
  }
}

}  // namespace

std::string_view admit_status_name(AdmitStatus s) {
  switch (s) {
    case AdmitStatus::Admitted:
      return "admitted";
    case AdmitStatus::QueueFull:
      return "admission queue full";
    case AdmitStatus::LevelFull:
      return "admission queue full for this priority";
    case AdmitStatus::InvalidPriority:
      return "invalid priority";
    case AdmitStatus::DuplicateId:
      return "request id already queued";
  }
  return "unknown";
}

void AdmissionQueueOptions::validate() const {
  if (max_size == 0) throw std::invalid_argument("admission.max_queue must be >= 1");
  if (priority_levels == 0) throw std::invalid_argument("admission.priority_levels must be >= 1");
  if (!levels.empty() && levels.size() != priority_levels) {
    throw std::invalid_argument("admission.levels must have one entry per priority level (" +
                                std::to_string(priority_levels) + "), got " +
                                std::to_string(levels.size()));
  }
  check_wait(max_wait_s, "queue_timeout_s");
  for (size_t i = 0; i < levels.size(); ++i) {
    check_wait(levels[i].max_wait_s, "levels[" + std::to_string(i) + "].queue_timeout_s");
  }
  if (!(std::isfinite(rate_window_s) && rate_window_s > 0)) {
    throw std::invalid_argument("admission.rate_window_s must be > 0");
  }
  if (!(std::isfinite(min_retry_after_s) && min_retry_after_s > 0 &&
        std::isfinite(max_retry_after_s) && max_retry_after_s >= min_retry_after_s)) {
    throw std::invalid_argument(
        "admission retry-after bounds must satisfy 0 < min_retry_after_s <= max_retry_after_s");
  }
}

AdmissionQueue::AdmissionQueue(AdmissionQueueOptions options) : opt_(std::move(options)) {
  opt_.validate();
  levels_.resize(opt_.priority_levels);
  for (size_t i = 0; i < levels_.size(); ++i) {
    levels_[i].opt = opt_.levels.empty() ? PriorityLevelOptions{opt_.max_wait_s, opt_.on_timeout, 0}
                                         : opt_.levels[i];
  }
}

AdmitResult AdmissionQueue::push(uint64_t id, int priority, double now_s) {
  if (!first_seen_at_) first_seen_at_ = now_s;
  if (priority < 0 || size_t(priority) >= levels_.size()) {
    return {AdmitStatus::InvalidPriority, 0};
  }
  if (contains(id)) return {AdmitStatus::DuplicateId, 0};
  // Requests past their limit free their slots before we judge the bound.
  apply_timeouts(now_s);
  Level& level = levels_[size_t(priority)];
  if (size() >= opt_.max_size) return {AdmitStatus::QueueFull, retry_after_s(now_s)};
  if (level.opt.max_size > 0 && level.size() >= level.opt.max_size) {
    return {AdmitStatus::LevelFull, retry_after_s(now_s)};
  }
  level.fresh.push_back({id, now_s});
  index_.emplace(id, Where{size_t(priority), false, std::prev(level.fresh.end())});
  return {AdmitStatus::Admitted, 0};
}

// Within a level, `fresh` is in arrival order and shares one limit, so the
// expired requests are exactly a prefix of it.
void AdmissionQueue::apply_timeouts(double now_s) {
  for (size_t l = 0; l < levels_.size(); ++l) {
    Level& level = levels_[l];
    if (level.opt.max_wait_s <= 0) continue;
    while (!level.fresh.empty() && now_s - level.fresh.front().enqueued_at > level.opt.max_wait_s) {
      const uint64_t id = level.fresh.front().id;
      if (level.opt.on_timeout == TimeoutAction::Reject) {
        expired_.push_back(id);
        index_.erase(id);
        level.fresh.pop_front();
      } else {
        // splice keeps the iterator valid, so the index only changes its flag.
        level.delayed.splice(level.delayed.end(), level.fresh, level.fresh.begin());
        index_.at(id).delayed = true;
      }
    }
  }
}

std::optional<uint64_t> AdmissionQueue::pop(double now_s) {
  if (!first_seen_at_) first_seen_at_ = now_s;
  apply_timeouts(now_s);
  for (size_t l = levels_.size(); l-- > 0;) {
    Level& level = levels_[l];
    EntryList& from = !level.fresh.empty() ? level.fresh : level.delayed;
    if (from.empty()) continue;
    const uint64_t id = from.front().id;
    from.pop_front();
    index_.erase(id);
    record_pop(now_s);
    return id;
  }
  return std::nullopt;
}

std::vector<uint64_t> AdmissionQueue::expire(double now_s) {
  apply_timeouts(now_s);
  return std::exchange(expired_, {});
}

bool AdmissionQueue::remove(uint64_t id) {
  auto found = index_.find(id);
  if (found == index_.end()) {
    // Expired but not yet collected: forget it too, so the caller never
    // answers a request it has already ended.
    auto it = std::find(expired_.begin(), expired_.end(), id);
    if (it == expired_.end()) return false;
    expired_.erase(it);
    return true;
  }
  const Where& w = found->second;
  Level& level = levels_[w.level];
  (w.delayed ? level.delayed : level.fresh).erase(w.it);
  index_.erase(found);
  return true;
}

size_t AdmissionQueue::size_by_priority(int priority) const {
  if (priority < 0 || size_t(priority) >= levels_.size()) return 0;
  return levels_[size_t(priority)].size();
}

void AdmissionQueue::record_pop(double now_s) {
  pop_times_.push_back(now_s);
  const double cutoff = now_s - opt_.rate_window_s;
  while (!pop_times_.empty() && (pop_times_.front() < cutoff || pop_times_.size() > kMaxPopTimes)) {
    pop_times_.pop_front();
  }
}

double AdmissionQueue::dequeue_rate(double now_s) const {
  const double cutoff = now_s - opt_.rate_window_s;
  const auto first = std::lower_bound(pop_times_.begin(), pop_times_.end(), cutoff);
  const size_t count = size_t(pop_times_.end() - first);
  if (count == 0) return 0;
  double span = opt_.rate_window_s;
  // Just after start-up, or when the cap dropped older pops, the pops we
  // hold cover less than the full window.
  if (first_seen_at_) span = std::min(span, now_s - *first_seen_at_);
  if (pop_times_.size() == kMaxPopTimes && first == pop_times_.begin()) {
    span = std::min(span, now_s - pop_times_.front());
  }
  return double(count) / std::max(span, 1e-3);
}

double AdmissionQueue::retry_after_s(double now_s) const {
  const double rate = dequeue_rate(now_s);
  if (rate <= 0) return opt_.max_retry_after_s;
  const double drain_s = double(std::max<size_t>(size(), 1)) / rate;
  return std::clamp(drain_s, opt_.min_retry_after_s, opt_.max_retry_after_s);
}

}  // namespace troupe
