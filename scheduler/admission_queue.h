#pragma once
// The bounded priority queue in front of the replicas, after Triton's queue
// policy: N priority levels (higher served first, FIFO within one), a global
// bound and optional per-level bounds (a push beyond them is refused, so the
// server answers 429 with Retry-After instead of growing), and a maximum wait
// per level with an action at the limit. Plain class: time comes in as `now_s`
// (seconds on a monotonic clock); nothing here blocks, sleeps or locks.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe {

enum class TimeoutAction {
  // The request leaves the queue; expire() hands its id back so the caller
  // can answer it (503/504). Nothing is dropped silently.
  Reject,
  // The request keeps its place in the queue but, like Triton's DELAY, is
  // served only after the requests of its level that are still within their
  // wait limit (it still goes before every lower level).
  Keep,
};

struct PriorityLevelOptions {
  double max_wait_s = 0;  // <= 0: no limit
  TimeoutAction on_timeout = TimeoutAction::Reject;
  size_t max_size = 0;  // 0: only the global bound applies
};

struct AdmissionQueueOptions {
  size_t max_size = 256;       // all levels together
  size_t priority_levels = 2;  // valid priorities: 0 .. priority_levels - 1
  // Defaults for every level; `levels` (if not empty, one entry per level,
  // index = priority) overrides them.
  double max_wait_s = 30;
  TimeoutAction on_timeout = TimeoutAction::Reject;
  std::vector<PriorityLevelOptions> levels;
  // Retry-After: how long the current queue takes to drain at the dequeue
  // rate of the last `rate_window_s`, clamped to [min, max]. With no dequeue
  // in the window the queue is stalled, and the answer is the max.
  double rate_window_s = 30;
  double min_retry_after_s = 1;
  double max_retry_after_s = 60;

  // Throws std::invalid_argument naming the bad field.
  void validate() const;
};

enum class AdmitStatus {
  Admitted,
  QueueFull,        // global bound reached: 429
  LevelFull,        // this priority level's bound reached: 429
  InvalidPriority,  // outside 0 .. levels-1: 400 (refused, not clamped, so a
                    // client never silently gets another priority than it asked)
  DuplicateId,      // the id is already queued: a caller bug, refused
};

std::string_view admit_status_name(AdmitStatus s);

struct AdmitResult {
  AdmitStatus status = AdmitStatus::Admitted;
  double retry_after_s = 0;  // > 0 for QueueFull and LevelFull

  bool admitted() const { return status == AdmitStatus::Admitted; }
};

class AdmissionQueue {
 public:
  explicit AdmissionQueue(AdmissionQueueOptions options);

  AdmitResult push(uint64_t id, int priority, double now_s);

  // The next request to serve, or nullopt. Applies the wait limits first;
  // requests it rejects are held for the next expire() call.
  std::optional<uint64_t> pop(double now_s);

  // Ids rejected for waiting too long (by this call or an earlier pop); the
  // caller must answer each of them.
  std::vector<uint64_t> expire(double now_s);

  // Takes a request out (client gone). False when it was not queued.
  bool remove(uint64_t id);

  bool contains(uint64_t id) const { return index_.count(id) != 0; }
  size_t size() const { return index_.size(); }
  bool empty() const { return index_.empty(); }
  size_t size_by_priority(int priority) const;  // 0 for an invalid priority
  size_t priority_levels() const { return levels_.size(); }

  // Suggested Retry-After for a refused request, from the recent dequeue rate.
  double retry_after_s(double now_s) const;
  // Requests handed out by pop() per second over the recent window.
  double dequeue_rate(double now_s) const;

 private:
  struct Entry {
    uint64_t id;
    double enqueued_at;
  };
  using EntryList = std::list<Entry>;
  struct Level {
    PriorityLevelOptions opt;
    EntryList fresh;    // within the wait limit, FIFO
    EntryList delayed;  // past it with action Keep, FIFO
    size_t size() const { return fresh.size() + delayed.size(); }
  };
  struct Where {
    size_t level;
    bool delayed;
    EntryList::iterator it;
  };

  void apply_timeouts(double now_s);
  void record_pop(double now_s);

  AdmissionQueueOptions opt_;
  std::vector<Level> levels_;
  std::unordered_map<uint64_t, Where> index_;
  std::vector<uint64_t> expired_;
  std::deque<double> pop_times_;         // within rate_window_s, capped
  std::optional<double> first_seen_at_;  // shortens the window at start-up
};

}  // namespace troupe
