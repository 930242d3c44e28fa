#pragma once
// Every accepted request's life, in one plain class: admission (the bounded
// priority queue), placement on a replica (the routing policy), delivery of
// its tokens to the client exactly once, resumption on another replica when
// its replica dies, its deadline, and cancellation. Time comes in as `now`
// (seconds on any monotonic clock); nothing here blocks or knows of actors,
// so the router actor is a thin adapter over it and the simulator can drive
// the same object.
//
// A request's KV blocks are not booked here but by the scheduler of the
// replica that holds them (scheduler/replica_scheduler.h): they belong to
// that replica's devices, and ending a request there frees them.
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/admission_queue.h"
#include "scheduler/replica_messages.h"
#include "scheduler/routing_policy.h"
#include "service/completion_service.h"

namespace troupe {

// How the table reaches the replicas (actor messages in the runtime).
class ReplicaChannel {
 public:
  virtual ~ReplicaChannel() = default;
  virtual void assign(int replica, Assignment a) = 0;
  // Stop the request there; the replica reports it done (Cancelled).
  virtual void cancel(int replica, uint64_t id) = 0;
};

struct RequestTableOptions {
  int replicas = 1;
  int max_seq_len = 0;  // prompts longer than this are refused
  int max_batch_sequences = 32;
  int max_waiting_per_replica = 256;  // placed but not yet running, per replica
  AdmissionQueueOptions admission;
};

class RequestTable {
 public:
  RequestTable(RequestTableOptions options, std::unique_ptr<RoutingPolicy> policy,
               ReplicaChannel& replicas);
  const RoutingPolicy& policy() const { return *policy_; }

  // Admits the request (its deadline is now + timeout_s) or ends it at once
  // through its sink: BadRequest (duplicate id, empty or too long prompt,
  // invalid priority), QueueFull with Retry-After, or Unavailable when every
  // replica was given up on.
  void submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink, double now);
  // The client went away: a request running on a live replica is stopped
  // there and ends as Cancelled when the replica says so; any other ends
  // now. Unknown ids are ignored.
  void cancel(uint64_t id, double now);
  // A replica's step (or its ended requests): tokens are delivered by index,
  // so a token is never delivered twice nor out of order, also across
  // resumption; completions end their requests.
  void on_events(const StepEvents& events, double now);
  // A replica is (again) ready to take requests.
  void replica_up(int replica, double now);
  // A replica died: its requests resume on live replicas, ahead of the
  // queue, from the tokens already delivered (cancelled ones end instead).
  // With `permanent` it will not come back; when none is left, everything
  // ends with Unavailable. Returns how many requests will resume.
  size_t replica_down(int replica, bool permanent, double now);
  // Deadlines and queue wait limits; then places what it can.
  void tick(double now);
  // Everything still open ends with Unavailable(why).
  void shutdown(const std::string& why);
  // Called whenever a replica comes up or goes down, before any request is
  // told about it: whoever shows readiness (the router's /ready) is never
  // behind what a client has already heard.
  void on_replicas_changed(std::function<void()> fn) { replicas_changed_ = std::move(fn); }
  // Called when a request whose replica died delivers its next token: how
  // long after the death it took (on the table's clock).
  void on_resumed(std::function<void(double down, double next_token)> fn) {
    resumed_ = std::move(fn);
  }

  struct ReplicaView {
    bool live = false;
    bool failed = false;  // given up on
    size_t outstanding = 0;
    size_t running = 0;
    size_t queued_tokens = 0;
  };
  const std::vector<ReplicaView>& replicas() const { return replicas_; }
  int live_replicas() const;
  size_t size() const { return requests_.size(); }
  // Requests waiting for a replica: the admission queue and resumptions.
  size_t queue_depth() const { return queue_.size() + resume_.size(); }
  size_t running() const;
  bool holds(uint64_t id) const { return requests_.count(id) != 0; }
  // Where a request runs now (nullopt: queued, resuming or unknown).
  std::optional<int> placement(uint64_t id) const;
  // Tokens delivered to a request's client so far.
  std::vector<int> delivered(uint64_t id) const;

 private:
  struct Request {
    CompletionRequest req;
    std::shared_ptr<CompletionSink> sink;
    std::vector<int> delivered;
    int replica = -1;     // where it runs now; -1 while queued or resuming
    double deadline = 0;  // absolute, on the table's clock; 0: none
    bool resuming = false;
    bool cancelled = false;             // asked its replica to stop; ends instead of resuming
    bool prompt_logprobs_sent = false;  // once, before its first token
    double orphaned_at = -1;            // its replica died then; reset by its next token
  };

  RequestInfo info(const Request& r) const;
  bool has_capacity(const ReplicaView& r) const;
  // Brings the policy's view of replica i (and the counts kept beside it) up
  // to date; called after every change to replicas_[i].
  void refresh(size_t i);
  std::optional<size_t> choose(const Request& r, double now);
  void place(Request& r, size_t replica, double now);
  void dispatch(double now);
  // Ends a request (removing it from every queue) and tells its client.
  void end_with_error(uint64_t id, ServiceErrorKind kind, const std::string& message,
                      double retry_after = 0);
  void end_cancelled(uint64_t id);
  Request take(uint64_t id);

  RequestTableOptions options_;
  std::unique_ptr<RoutingPolicy> policy_;
  ReplicaChannel& channel_;
  AdmissionQueue queue_;
  std::deque<uint64_t> resume_;  // requests of dead replicas, served first
  std::unordered_map<uint64_t, Request> requests_;
  std::vector<ReplicaView> replicas_;
  std::function<void()> replicas_changed_;
  std::function<void(double, double)> resumed_;
  // What the policy sees, kept up to date replica by replica rather than
  // rebuilt per decision: at a thousand replicas the rebuild would dominate.
  std::vector<ReplicaLoad> loads_;
  size_t with_capacity_ = 0;  // replicas that can take a request now
  size_t failed_ = 0;         // replicas given up on
  // (deadline, id), earliest first; entries of requests that ended earlier
  // are skipped when they come up, so tick() never scans every request.
  using Deadline = std::pair<double, uint64_t>;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
};

}  // namespace troupe
