#include "actors/router.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <unordered_map>

#include "actors/messages.h"
#include "scheduler/routing_policy.h"

namespace troupe {

namespace {

using tick_atom_t = caf::atom_constant<caf::atom("rtick")>;
constexpr auto kTick = std::chrono::milliseconds(50);

struct Request {
  CompletionRequest req;
  std::shared_ptr<CompletionSink> sink;
  std::vector<int> delivered;
  int replica = -1;      // where it runs now; -1 while queued
  double submitted = 0;  // seconds
  double deadline = 0;   // absolute seconds; 0: none
  bool resuming = false;
  bool cancelled = false;  // asked the replica to stop; ends instead of resuming
};

struct Replica {
  caf::actor batcher;
  bool live = false;
  bool failed = false;  // gave up restarting it
  size_t outstanding = 0;
  size_t running = 0;
  size_t queued_tokens = 0;
};

using Clock = std::chrono::steady_clock;

struct RouterState {
  RouterOptions opts;
  Metrics* metrics = nullptr;
  std::shared_ptr<RouterShared> shared;
  std::unique_ptr<RoutingPolicy> policy;
  std::unique_ptr<AdmissionQueue> queue;
  std::deque<uint64_t> resume;  // requests of dead replicas, served first
  std::unordered_map<uint64_t, Request> reqs;
  std::vector<Replica> replicas;
  Clock::time_point start = Clock::now();
  double now() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
};

RequestInfo info(const Request& r) {
  return {r.req.id, r.req.prompt.size() + r.delivered.size(), size_t(r.req.max_tokens)};
}

void update_shared(RouterState& s) {
  int live = 0;
  for (const auto& r : s.replicas) live += r.live ? 1 : 0;
  s.shared->live_replicas = live;
  s.shared->ready = live > 0;
  if (s.metrics)
    for (size_t i = 0; i < s.replicas.size(); ++i)
      s.metrics->set_replica_state(int(i), s.replicas[i].live     ? ReplicaState::Ready
                                           : s.replicas[i].failed ? ReplicaState::FailedPermanently
                                                                  : ReplicaState::Starting);
}

void publish_load(RouterState& s) {
  if (!s.metrics) return;
  size_t running = 0;
  for (const auto& r : s.replicas) running += r.running;
  s.metrics->set_running_sequences(running);
  s.metrics->set_queue_depth(s.queue->size() + s.resume.size());
}

void end_with_error(RouterState& s, uint64_t id, ServiceErrorKind kind, const std::string& msg,
                    double retry_after = 0) {
  auto it = s.reqs.find(id);
  if (it == s.reqs.end()) return;
  auto sink = it->second.sink;
  const int replica = it->second.replica;
  if (replica >= 0) {
    Replica& r = s.replicas[size_t(replica)];
    if (r.outstanding > 0) --r.outstanding;
    if (r.live) caf::anon_send(r.batcher, cancel_atom::value, id);
  }
  s.queue->remove(id);
  std::erase(s.resume, id);
  s.reqs.erase(it);
  sink->on_error(ServiceError{kind, msg, retry_after});
}

// The client went away: the request ends as cancelled with what it got.
void end_cancelled(RouterState& s, uint64_t id) {
  auto it = s.reqs.find(id);
  if (it == s.reqs.end()) return;
  auto sink = it->second.sink;
  const int prompt = int(it->second.req.prompt.size()),
            completion = int(it->second.delivered.size());
  s.queue->remove(id);
  std::erase(s.resume, id);
  s.reqs.erase(it);
  sink->on_done(FinishReason::Cancelled, prompt, completion);
}

bool has_capacity(const RouterState& s, const Replica& r) {
  return r.live &&
         r.outstanding < size_t(s.opts.max_batch_sequences + s.opts.max_waiting_per_replica);
}

void place(caf::event_based_actor* self, RouterState& s, Request& r, size_t replica) {
  Replica& rep = s.replicas[replica];
  Assignment a;
  a.id = r.req.id;
  a.tokens = r.req.prompt;
  a.tokens.insert(a.tokens.end(), r.delivered.begin(), r.delivered.end());
  a.prompt_len = int(r.req.prompt.size());
  a.generated = int(r.delivered.size());
  a.max_tokens = r.req.max_tokens;
  a.sampling = r.req.sampling;
  a.ignore_eos = r.req.ignore_eos;
  r.replica = int(replica);
  r.resuming = false;
  ++rep.outstanding;
  rep.queued_tokens += a.tokens.size();
  s.policy->on_dispatch(replica, info(r), s.now());
  self->send(rep.batcher, assign_atom::value, std::move(a));
}

std::optional<size_t> choose(RouterState& s, const Request& r) {
  std::vector<ReplicaLoad> loads;
  for (size_t i = 0; i < s.replicas.size(); ++i) {
    const Replica& rep = s.replicas[i];
    ReplicaLoad l;
    l.index = i;
    l.live = has_capacity(s, rep);
    l.outstanding = rep.outstanding;
    l.queued_tokens = rep.queued_tokens;
    l.running = rep.running;
    l.max_batch_sequences = size_t(s.opts.max_batch_sequences);
    loads.push_back(l);
  }
  return s.policy->choose(loads, info(r), s.now());
}

void dispatch(caf::event_based_actor* self, RouterState& s) {
  // Resumed requests first: their clients are already waiting mid-stream.
  while (!s.resume.empty()) {
    auto& r = s.reqs.at(s.resume.front());
    const auto target = choose(s, r);
    if (!target) return;
    s.resume.pop_front();
    place(self, s, r, *target);
  }
  while (!s.queue->empty()) {
    bool any = false;
    for (const auto& rep : s.replicas) any = any || has_capacity(s, rep);
    if (!any) return;
    const auto id = s.queue->pop(s.now());
    if (!id) return;
    auto it = s.reqs.find(*id);
    if (it == s.reqs.end()) continue;
    const auto target = choose(s, it->second);
    if (!target) {
      s.resume.push_back(*id);  // keeps its turn
      return;
    }
    place(self, s, it->second, *target);
  }
}

void on_events(caf::event_based_actor* self, RouterState& s, const StepEvents& ev) {
  if (ev.replica < 0 || size_t(ev.replica) >= s.replicas.size()) return;
  Replica& rep = s.replicas[size_t(ev.replica)];
  rep.running = size_t(ev.running);
  rep.queued_tokens = 0;
  if (ev.batch_sequences > 0)
    s.policy->on_step(size_t(ev.replica), ev.step_s, size_t(ev.batch_sequences), s.now());
  if (s.metrics) {
    if (ev.batch_sequences > 0) s.metrics->observe_step(ev.batch_sequences, ev.batch_tokens);
    s.metrics->set_kv_blocks(ev.replica, size_t(ev.blocks_used), size_t(ev.blocks_free));
  }
  for (const auto& t : ev.tokens) {
    auto it = s.reqs.find(t.id);
    if (it == s.reqs.end()) continue;
    Request& r = it->second;
    // Exactly once: a resumed sequence regenerates from the first token the
    // client has not seen, and a late token from a dead replica is the same
    // token (deterministic sampling), so index order decides.
    if (size_t(t.index) != r.delivered.size()) continue;
    r.delivered.push_back(t.token);
    r.sink->on_token(t.token);
  }
  for (const auto& d : ev.done) {
    auto it = s.reqs.find(d.id);
    if (it == s.reqs.end() || it->second.replica != ev.replica) continue;
    Request& r = it->second;
    if (d.reason != FinishReason::Cancelled && size_t(d.completion_tokens) != r.delivered.size())
      continue;  // a stale replica's view; the live one will finish it
    if (rep.outstanding > 0) --rep.outstanding;
    s.policy->on_complete(size_t(ev.replica), info(r), s.now());
    auto sink = r.sink;
    const int prompt = int(r.req.prompt.size()), completion = int(r.delivered.size());
    s.reqs.erase(it);
    sink->on_done(d.reason, prompt, completion);
  }
  dispatch(self, s);
  publish_load(s);
}

void on_replica_down(caf::event_based_actor* self, RouterState& s, int replica, bool permanent) {
  if (replica < 0 || size_t(replica) >= s.replicas.size()) return;
  Replica& rep = s.replicas[size_t(replica)];
  rep.live = false;
  rep.failed = permanent;
  rep.outstanding = rep.running = rep.queued_tokens = 0;
  rep.batcher = caf::actor{};
  std::vector<uint64_t> orphans;
  for (auto& [id, r] : s.reqs)
    if (r.replica == replica) orphans.push_back(id);
  // Oldest first, ahead of everything queued.
  std::sort(orphans.begin(), orphans.end());
  size_t resumed = 0;
  for (auto it = orphans.rbegin(); it != orphans.rend(); ++it) {
    Request& r = s.reqs.at(*it);
    if (r.cancelled) {  // the client is gone: nothing to resume for
      end_cancelled(s, *it);
      continue;
    }
    r.replica = -1;
    r.resuming = true;
    s.resume.push_front(*it);
    ++resumed;
  }
  spdlog::warn("replica {} down{}; {} requests to resume", replica, permanent ? " for good" : "",
               resumed);
  update_shared(s);
  bool any_left = false;
  for (const auto& r : s.replicas) any_left = any_left || !r.failed;
  if (!any_left) {
    // Nothing will come back: everything waiting ends now with a clear error.
    std::vector<uint64_t> all;
    for (const auto& [id, r] : s.reqs) all.push_back(id);
    for (uint64_t id : all)
      end_with_error(s, id, ServiceErrorKind::Unavailable, "no live replica: all replicas failed",
                     5);
    return;
  }
  dispatch(self, s);
}

void on_tick(caf::event_based_actor* self, RouterState& s) {
  const double now = s.now();
  for (uint64_t id : s.queue->expire(now))
    end_with_error(s, id, ServiceErrorKind::Unavailable, "timed out waiting in the admission queue",
                   s.queue->retry_after_s(now));
  std::vector<std::pair<uint64_t, bool>> late;
  for (const auto& [id, r] : s.reqs)
    if (r.deadline > 0 && now >= r.deadline) late.emplace_back(id, r.resuming);
  for (auto [id, resuming] : late) {
    if (resuming)
      end_with_error(s, id, ServiceErrorKind::Unavailable,
                     "its replica failed and no live replica could resume it before its deadline",
                     5);
    else
      end_with_error(s, id, ServiceErrorKind::Timeout, "request timed out");
  }
  dispatch(self, s);
}

}  // namespace

caf::behavior router_actor(caf::event_based_actor* self, RouterOptions options,
                           std::shared_ptr<RouterShared> shared, Metrics* metrics) {
  auto st = std::make_shared<RouterState>();
  st->metrics = metrics;
  st->opts = options;
  st->shared = std::move(shared);
  st->policy = make_routing_policy(options.routing_policy, options.routing_seed);
  st->queue = std::make_unique<AdmissionQueue>(options.admission);
  st->replicas.resize(size_t(options.replicas));
  self->send(self, tick_atom_t::value);
  // Shutdown: nothing accepted ends in silence.
  self->set_exit_handler([=](caf::exit_msg& em) {
    std::vector<uint64_t> all;
    for (const auto& [id, r] : st->reqs) all.push_back(id);
    for (uint64_t id : all)
      end_with_error(*st, id, ServiceErrorKind::Unavailable, "the server is shutting down", 5);
    st->shared->ready = false;
    self->quit(em.reason);
  });
  return {
      [=](submit_atom, CompletionRequest& req, std::shared_ptr<CompletionSink>& sink) {
        RouterState& s = *st;
        const uint64_t id = req.id;
        if (s.reqs.count(id)) {
          sink->on_error({ServiceErrorKind::BadRequest, "duplicate request id", 0});
          return;
        }
        if (req.prompt.empty() || int(req.prompt.size()) > s.opts.max_seq_len) {
          sink->on_error(
              {ServiceErrorKind::BadRequest,
               "the prompt must have 1 to " + std::to_string(s.opts.max_seq_len) + " tokens", 0});
          return;
        }
        bool any_alive = false;
        for (const auto& r : s.replicas) any_alive = any_alive || !r.failed;
        if (!any_alive) {
          sink->on_error(
              {ServiceErrorKind::Unavailable, "no live replica: all replicas failed", 5});
          return;
        }
        const double now = s.now();
        const auto res = s.queue->push(id, req.priority, now);
        if (!res.admitted()) {
          if (res.status == AdmitStatus::InvalidPriority)
            sink->on_error(
                {ServiceErrorKind::BadRequest,
                 "priority must be between 0 and " + std::to_string(s.queue->priority_levels() - 1),
                 0});
          else
            sink->on_error(
                {ServiceErrorKind::QueueFull, "the admission queue is full", res.retry_after_s});
          return;
        }
        Request r;
        r.submitted = now;
        r.deadline = req.timeout_s > 0 ? now + req.timeout_s : 0;
        r.req = std::move(req);
        r.sink = std::move(sink);
        s.reqs.emplace(id, std::move(r));
        dispatch(self, s);
        publish_load(s);
      },
      [=](cancel_atom, uint64_t id) {
        RouterState& s = *st;
        auto it = s.reqs.find(id);
        if (it == s.reqs.end()) return;
        if (it->second.replica >= 0 && s.replicas[size_t(it->second.replica)].live) {
          it->second.cancelled = true;
          self->send(s.replicas[size_t(it->second.replica)].batcher, cancel_atom::value, id);
          return;  // the batcher reports it done (cancelled) within a step
        }
        end_cancelled(s, id);
      },
      [=](events_atom, const StepEvents& ev) { on_events(self, *st, ev); },
      [=](up_atom, int replica, caf::actor batcher) {
        if (replica < 0 || size_t(replica) >= st->replicas.size()) return;
        Replica& r = st->replicas[size_t(replica)];
        r.batcher = std::move(batcher);
        r.live = true;
        r.failed = false;
        r.outstanding = r.running = r.queued_tokens = 0;
        update_shared(*st);
        spdlog::info("replica {} ready", replica);
        dispatch(self, *st);
      },
      [=](down_atom, int replica, bool permanent) {
        on_replica_down(self, *st, replica, permanent);
      },
      [=](tick_atom_t) {
        on_tick(self, *st);
        publish_load(*st);
        self->delayed_send(self, kTick, tick_atom_t::value);
      },
  };
}

}  // namespace troupe
