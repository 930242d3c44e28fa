#include "scheduler/router_log.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace troupe {

namespace {

// Shortest text that reads back as the same double: replay must hand the
// table exactly the times the router did.
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string head(const char* op, double now) {
  return std::string("{\"op\":\"") + op + "\",\"now\":" + num(now);
}

}  // namespace

RouterLog::RouterLog(const std::string& path) : out_(path) {
  if (!out_) throw std::runtime_error("cannot write the router log " + path);
}

void RouterLog::line(const std::string& text) {
  // Flushed per line: a server stopped by a signal keeps its whole record.
  out_ << text << '\n' << std::flush;
}

void RouterLog::options(const RequestTableOptions& o, std::string_view policy, uint64_t seed,
                        const LatencyAwareOptions& la, bool prompt_tokens) {
  prompt_tokens_ = prompt_tokens;
  const AdmissionQueueOptions& a = o.admission;
  line("{\"op\":\"options\",\"replicas\":" + std::to_string(o.replicas) +
       ",\"max_seq_len\":" + std::to_string(o.max_seq_len) +
       ",\"max_batch_sequences\":" + std::to_string(o.max_batch_sequences) +
       ",\"max_waiting_per_replica\":" + std::to_string(o.max_waiting_per_replica) +
       ",\"policy\":\"" + std::string(policy) + "\",\"seed\":" + std::to_string(seed) +
       ",\"admission\":{\"max_size\":" + std::to_string(a.max_size) + ",\"priority_levels\":" +
       std::to_string(a.priority_levels) + ",\"max_wait_s\":" + num(a.max_wait_s) +
       ",\"keep\":" + (a.on_timeout == TimeoutAction::Keep ? "true" : "false") +
       ",\"rate_window_s\":" + num(a.rate_window_s) + ",\"min_retry_after_s\":" +
       num(a.min_retry_after_s) + ",\"max_retry_after_s\":" + num(a.max_retry_after_s) +
       "},\"latency_aware\":{\"ema_alpha\":" + num(la.ema_alpha) +
       ",\"prior_step_s\":" + num(la.prior_step_s) +
       ",\"prior_prefill_tokens_per_s\":" + num(la.prior_prefill_tokens_per_s) +
       ",\"batch_cost_per_seq\":" + num(la.batch_cost_per_seq) +
       ",\"stale_after_s\":" + num(la.stale_after_s) + ",\"forget_tau_s\":" + num(la.forget_tau_s) +
       ",\"probe_interval_s\":" + num(la.probe_interval_s) +
       ",\"probe_every_requests\":" + std::to_string(la.probe_every_requests) + "}}");
}

void RouterLog::submit(double now, const CompletionRequest& r) {
  std::string tokens;
  if (prompt_tokens_) {
    tokens = ",\"tokens\":[";
    for (size_t i = 0; i < r.prompt.size(); ++i) {
      if (i) tokens += ',';
      tokens += std::to_string(r.prompt[i]);
    }
    tokens += "]";
  }
  line(head("submit", now) + ",\"id\":" + std::to_string(r.id) +
       ",\"prompt\":" + std::to_string(r.prompt.size()) + tokens +
       ",\"max_tokens\":" + std::to_string(r.max_tokens) +
       ",\"priority\":" + std::to_string(r.priority) + ",\"timeout_s\":" + num(r.timeout_s) + "}");
}

void RouterLog::cancel(double now, uint64_t id) {
  line(head("cancel", now) + ",\"id\":" + std::to_string(id) + "}");
}

void RouterLog::events(double now, const StepEvents& ev) {
  std::string s = head("events", now) + ",\"replica\":" + std::to_string(ev.replica) +
                  ",\"step_s\":" + num(ev.step_s) +
                  ",\"batch_sequences\":" + std::to_string(ev.batch_sequences) +
                  ",\"batch_tokens\":" + std::to_string(ev.batch_tokens) +
                  ",\"prefill_tokens\":" + std::to_string(ev.prefill_tokens) +
                  ",\"running\":" + std::to_string(ev.running) +
                  ",\"queued_tokens\":" + std::to_string(ev.queued_tokens) + ",\"tokens\":[";
  for (size_t i = 0; i < ev.tokens.size(); ++i)
    s += (i ? ",[" : "[") + std::to_string(ev.tokens[i].id) + "," +
         std::to_string(ev.tokens[i].index) + "]";
  s += "],\"done\":[";
  for (size_t i = 0; i < ev.done.size(); ++i)
    s += (i ? ",[" : "[") + std::to_string(ev.done[i].id) + "," +
         std::to_string(int(ev.done[i].reason)) + "," +
         std::to_string(ev.done[i].completion_tokens) + "]";
  line(s + "]}");
}

void RouterLog::up(double now, int replica) {
  line(head("up", now) + ",\"replica\":" + std::to_string(replica) + "}");
}

void RouterLog::down(double now, int replica, bool permanent) {
  line(head("down", now) + ",\"replica\":" + std::to_string(replica) +
       ",\"permanent\":" + (permanent ? "true" : "false") + "}");
}

void RouterLog::tick(double now) {
  line(head("tick", now) + "}");
}

void RouterLog::assigned(int replica, const Assignment& a) {
  line("{\"op\":\"assign\",\"replica\":" + std::to_string(replica) +
       ",\"id\":" + std::to_string(a.id) + ",\"tokens\":" + std::to_string(a.tokens.size()) + "}");
}

void RouterLog::stopped(int replica, uint64_t id) {
  line("{\"op\":\"stop\",\"replica\":" + std::to_string(replica) + ",\"id\":" + std::to_string(id) +
       "}");
}

std::unique_ptr<RouterLog> router_log_from_env() {
  const char* path = std::getenv("TROUPE_ROUTER_LOG");
  if (path == nullptr || *path == '\0') return nullptr;
  return std::make_unique<RouterLog>(path);
}

void LoggedChannel::assign(int replica, Assignment a) {
  if (log_) log_->assigned(replica, a);
  inner_.assign(replica, std::move(a));
}

void LoggedChannel::cancel(int replica, uint64_t id) {
  if (log_) log_->stopped(replica, id);
  inner_.cancel(replica, id);
}

LoggedRequestTable::LoggedRequestTable(const RequestTableOptions& options, std::string_view policy,
                                       uint64_t seed, const LatencyAwareOptions& latency_aware,
                                       ReplicaChannel& replicas, std::unique_ptr<RouterLog> log)
    : log_(std::move(log)),
      channel_(replicas, log_.get()),
      table_(options, make_routing_policy(policy, seed, latency_aware), channel_) {
  if (log_) log_->options(options, policy, seed, latency_aware, table_.policy().reads_prompt());
}

void LoggedRequestTable::submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink,
                                double now) {
  if (log_) log_->submit(now, request);
  table_.submit(std::move(request), std::move(sink), now);
}

void LoggedRequestTable::cancel(uint64_t id, double now) {
  if (log_) log_->cancel(now, id);
  table_.cancel(id, now);
}

void LoggedRequestTable::on_events(const StepEvents& events, double now) {
  if (log_) log_->events(now, events);
  table_.on_events(events, now);
}

void LoggedRequestTable::replica_up(int replica, double now) {
  if (log_) log_->up(now, replica);
  table_.replica_up(replica, now);
}

size_t LoggedRequestTable::replica_down(int replica, bool permanent, double now) {
  if (log_) log_->down(now, replica, permanent);
  return table_.replica_down(replica, permanent, now);
}

void LoggedRequestTable::tick(double now) {
  if (log_) log_->tick(now);
  table_.tick(now);
}

}  // namespace troupe
