#pragma once
// The coordinator's record of the faults injected at run time: what was
// ordered, when it started, when its effect was seen (a fault with no
// observed effect fails), and, for a fault that takes a replica down, when
// that was detected and when the replica served again. Thread-safe: the
// admin endpoint writes and reads it on HTTP threads, actors on theirs.
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "faults/fault_order.h"

namespace troupe {

enum class FaultState {
  Scheduled,  // waiting for its start time
  Active,     // ordered; its effect not seen yet
  Confirmed,  // its effect was seen (a lasting fault may still be on)
  Ended,      // a lasting fault, confirmed and now over
  Failed,     // refused where it was aimed, or no effect seen in time
};

std::string_view fault_state_name(FaultState s);

struct FaultEntry {
  FaultOrder order;
  double at_s = 0;        // start, after it was added
  double duration_s = 0;  // lasting faults
  FaultState state = FaultState::Scheduled;
  // Seconds on the book's clock; negative: not yet.
  double added = -1, started = -1, confirmed = -1, ended = -1;
  double detected = -1;   // the replica it took down was seen dead
  double recovered = -1;  // ... and serving again
  // A fault that failed for want of an effect is withdrawn from the actor
  // holding it: when that actor said it disarmed it. Or, if its replica
  // died before the withdrawal was acknowledged, when that was seen (that
  // death may be its effect, late).
  bool expired = false;
  double withdrawn = -1;
  double died_late = -1;
  std::string effect;  // what was seen
  std::string error;   // why it failed
};

class FaultBook {
 public:
  // A fault started more than `confirm_within_s` ago (a lasting one: ended)
  // with no effect seen fails.
  explicit FaultBook(double confirm_within_s = 15);

  // Seconds since the book was made: the clock of every time it records.
  double now() const;

  // Records an order (its id is assigned here) and returns it with the id.
  FaultOrder add(FaultOrder order, double at_s, double duration_s, double now);
  std::optional<FaultEntry> get(uint64_t id) const;
  std::vector<FaultEntry> list() const;

  void started(uint64_t id, double now);
  // From the actor that applied it.
  void report(const FaultReport& r, double now);
  void fail(uint64_t id, const std::string& why, double now);
  // A lasting fault's duration is over; one never confirmed fails.
  void ended(uint64_t id, double now);
  // The supervisor saw replica `replica` die of `why`: an injected fault's
  // death (the reason says so) confirms the first started of the kills and
  // step errors aimed at it that wait for their effect; any other death
  // confirms none.
  void replica_died(int replica, const std::string& why, double now);
  // The replica serves again (after a death this book confirmed).
  void replica_up(int replica, double now);
  // Fails faults whose effect did not come within the window, and returns
  // their orders: each is still armed wherever it went (a worker's next
  // step, a shard's) and must be withdrawn from there, or it fires later.
  std::vector<FaultOrder> expire(double now);

  // A request whose replica died delivered its next token (elsewhere):
  // when the death was seen and when that token came. The latest
  // kMaxResumes are kept, for a chaos run to match with its faults.
  struct Resume {
    double down = 0, next_token = 0;
  };
  static constexpr size_t kMaxResumes = 200000;
  void resumed(double down, double next_token);
  std::vector<Resume> resumes() const;

 private:
  FaultEntry* find(uint64_t id);

  double confirm_within_s_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;
  std::vector<FaultEntry> entries_;
  std::deque<Resume> resumes_;
  uint64_t next_id_ = 1;
};

}  // namespace troupe
