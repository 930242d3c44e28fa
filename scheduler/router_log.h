#pragma once
// A record of everything the request table was told and everything it
// decided, one JSON object per line, so that a run (the real router, or the
// simulator) can be replayed into a fresh table and its decisions compared
// (scheduler/sim/router_replay.h). The router actor writes one when the
// environment variable TROUPE_ROUTER_LOG names a file.
//
// Lines: {"op":"options",...} first, then calls with the `now` the table
// got ("submit", "cancel", "events", "up", "down", "tick") and the table's
// decisions in between ("assign", "stop": a cancellation sent to a replica).
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "scheduler/request_table.h"

namespace troupe {

class RouterLog {
 public:
  // Throws std::runtime_error when the file cannot be written.
  explicit RouterLog(const std::string& path);

  // prompt_tokens: submissions record their prompts' tokens too, not only
  // their number (for a policy that reads them).
  void options(const RequestTableOptions& o, std::string_view policy, uint64_t seed,
               const LatencyAwareOptions& latency_aware, bool prompt_tokens = false);
  void submit(double now, const CompletionRequest& r);
  void cancel(double now, uint64_t id);
  void events(double now, const StepEvents& ev);
  void up(double now, int replica);
  void down(double now, int replica, bool permanent);
  void tick(double now);
  void assigned(int replica, const Assignment& a);
  void stopped(int replica, uint64_t id);

 private:
  void line(const std::string& text);
  std::ofstream out_;
  bool prompt_tokens_ = false;
};

// The router's environment hook: a log when TROUPE_ROUTER_LOG is set, else
// nullptr.
std::unique_ptr<RouterLog> router_log_from_env();

// A channel that notes the table's decisions in a log (when it has one) and
// passes them on.
class LoggedChannel : public ReplicaChannel {
 public:
  LoggedChannel(ReplicaChannel& inner, RouterLog* log) : inner_(inner), log_(log) {}
  void assign(int replica, Assignment a) override;
  void cancel(int replica, uint64_t id) override;

 private:
  ReplicaChannel& inner_;
  RouterLog* log_;
};

// The request table with every call and decision written to a log first,
// when there is one (else the plain table): what the router actor and the
// simulator hold, so that both can be recorded the same way.
class LoggedRequestTable {
 public:
  LoggedRequestTable(const RequestTableOptions& options, std::string_view policy, uint64_t seed,
                     const LatencyAwareOptions& latency_aware, ReplicaChannel& replicas,
                     std::unique_ptr<RouterLog> log = nullptr);

  void submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink, double now);
  void cancel(uint64_t id, double now);
  void on_events(const StepEvents& events, double now);
  void replica_up(int replica, double now);
  size_t replica_down(int replica, bool permanent, double now);
  void tick(double now);
  void shutdown(const std::string& why) { table_.shutdown(why); }
  void on_replicas_changed(std::function<void()> fn) { table_.on_replicas_changed(std::move(fn)); }
  void on_resumed(std::function<void(double, double)> fn) { table_.on_resumed(std::move(fn)); }
  const RequestTable& table() const { return table_; }

 private:
  std::unique_ptr<RouterLog> log_;
  LoggedChannel channel_;
  RequestTable table_;
};

}  // namespace troupe
