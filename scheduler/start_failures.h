#pragma once
// A replica's failed starts (a node could not build it: it does not fit
// there, or the node refused): the next try waits, longer after each
// failure in a row, and goes to another node while one can take it. Without
// this a start that fails at once was retried at once on the same node
// (the freest), and the replica used up its restart intensity within
// milliseconds although another node could have held it. Plain: time comes
// in as `now` (seconds on a monotonic clock).
#include <map>
#include <set>

namespace troupe {

struct StartBackoffOptions {
  double first_delay_s = 0.2;  // after the first failure in a row
  double max_delay_s = 5.0;    // the delay doubles per failure up to this
  double avoid_for_s = 30.0;   // a node that failed is passed over this long
};

class StartFailures {
 public:
  explicit StartFailures(StartBackoffOptions options = {});

  // A start of this replica failed on `node` at `now`.
  void failed(int node, double now);
  // A start succeeded: the next failure waits the first delay again. The
  // nodes that failed stay passed over for their time.
  void started() { in_a_row_ = 0; }
  // A node joined: it failed no start, so the next try need not wait (the
  // nodes that failed stay passed over); the delay after another failure
  // keeps growing.
  void node_joined() { next_try_ = 0; }

  // Whether a new start may be tried at `now`.
  bool may_try(double now) const { return now >= next_try_; }
  double next_try() const { return next_try_; }
  // Nodes to pass over at `now` (those that failed within avoid_for_s).
  std::set<int> avoid(double now) const;
  int in_a_row() const { return in_a_row_; }

 private:
  StartBackoffOptions options_;
  int in_a_row_ = 0;
  double next_try_ = 0;
  std::map<int, double> failed_at_;  // node -> its last failure
};

}  // namespace troupe
