#include "actors/router.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <tuple>
#include <vector>

#include "actors/wire_checks.h"
#include "scheduler/router_log.h"

namespace troupe {

namespace {

// Deadlines and queue wait limits are checked this often.
constexpr auto kTick = std::chrono::milliseconds(50);

using Clock = std::chrono::steady_clock;

// The table's placements and cancellations, as messages to the batchers,
// numbered on each replica's channel (scheduler/replica_link.h).
class BatcherChannel : public ReplicaChannel {
 public:
  BatcherChannel(RouterActor::pointer self, size_t replicas, ReplicaLinkOptions link,
                 Clock::time_point start)
      : self_(self),
        link_options_(link),
        start_(start),
        batchers_(replicas),
        links_(replicas, ReplicaLink(link)) {}
  void assign(int replica, Assignment a) override {
    a.seq = link(replica).send(now());
    self_->send(batchers_.at(size_t(replica)), assign_atom::value, std::move(a));
  }
  void cancel(int replica, uint64_t id) override {
    const uint64_t seq = link(replica).send(now());
    self_->send(batchers_.at(size_t(replica)), cancel_atom::value, id, seq);
  }
  void probe(int replica) {
    const uint64_t seq = link(replica).send(now());
    self_->send(batchers_.at(size_t(replica)), sync_atom::value, seq);
  }
  // A new placement: a new batcher and a channel numbered from 1.
  void set(int replica, BatcherActor b) {
    batchers_.at(size_t(replica)) = std::move(b);
    links_.at(size_t(replica)) = ReplicaLink(link_options_);
  }
  ReplicaLink& link(int replica) { return links_.at(size_t(replica)); }
  const BatcherActor& batcher(int replica) const { return batchers_.at(size_t(replica)); }

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  RouterActor::pointer self_;
  ReplicaLinkOptions link_options_;
  Clock::time_point start_;
  std::vector<BatcherActor> batchers_;
  std::vector<ReplicaLink> links_;
};

struct RouterState {
  std::vector<uint64_t> epoch;  // per replica: the placement its events must carry
  std::vector<bool> broken;     // per replica: its current placement's channel broke
  caf::actor supervisor;        // told about broken channels
  std::unique_ptr<BatcherChannel> channel;
  std::unique_ptr<LoggedRequestTable> table;  // logged when TROUPE_ROUTER_LOG names a file
  std::shared_ptr<RouterShared> shared;
  Metrics* metrics = nullptr;
  std::shared_ptr<FaultBook> faults;
  Clock::time_point start = Clock::now();
  double now() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  // What the labelled gauges were last set to, per replica: publish() runs
  // on every step's events, and a labelled child is found under a lock.
  std::vector<int> published_state;                     // -1: never
  std::vector<std::tuple<int, int, int>> published_kv;  // (used, free, cached); -1s: never
};

void publish(RouterState& s) {
  const RequestTable& t = s.table->table();
  s.shared->live_replicas = t.live_replicas();
  s.shared->ready = t.live_replicas() > 0;
  if (!s.metrics) return;
  const auto& reps = t.replicas();
  s.published_state.resize(reps.size(), -1);
  for (size_t i = 0; i < reps.size(); ++i) {
    const ReplicaState state = reps[i].live     ? ReplicaState::Ready
                               : reps[i].failed ? ReplicaState::FailedPermanently
                                                : ReplicaState::Starting;
    if (s.published_state[i] == int(state)) continue;
    s.published_state[i] = int(state);
    s.metrics->set_replica_state(int(i), state);
  }
  s.metrics->set_running_sequences(t.running());
  s.metrics->set_queue_depth(t.queue_depth());
}

// A replica that is down holds no KV cache: its blocks read 0 (used and
// free) until its next placement reports its own.
void clear_kv_blocks(RouterState& s, int replica) {
  if (!s.metrics) return;
  s.published_kv[size_t(replica)] = {-1, -1, -1};  // the next placement's figures are shown
  s.metrics->set_kv_blocks(replica, 0, 0);
  s.metrics->set_cached_blocks(replica, 0);
}

// The channel to a replica lost, duplicated out of order or never answered
// a message: nothing it says can be trusted any more. Its requests resume
// elsewhere at once, it is fenced (its events ignored until a new
// placement), and the supervisor stops it and places it again.
void channel_broke(RouterActor::pointer self, RouterState& s, int replica, const std::string& why) {
  if (s.broken[size_t(replica)]) return;
  s.broken[size_t(replica)] = true;
  const size_t resumed = s.table->replica_down(replica, false, s.now());
  clear_kv_blocks(s, replica);
  spdlog::warn("replica {}: {}; {} requests to resume", replica, why, resumed);
  if (s.supervisor)
    self->send(caf::actor_cast<SupervisorActor>(s.supervisor), broken_atom::value, replica,
               s.epoch[size_t(replica)], "its channel broke: " + why);
  // Told directly too, in case the supervisor's word does not get through.
  self->send_exit(s.channel->batcher(replica), caf::exit_reason::user_shutdown);
  publish(s);
}

}  // namespace

RouterActor::behavior_type router(RouterActor::pointer self, RouterOptions options,
                                  std::shared_ptr<RouterShared> shared, Metrics* metrics) {
  auto st = std::make_shared<RouterState>();
  st->metrics = metrics;
  st->faults = options.faults;
  st->shared = std::move(shared);
  st->channel = std::make_unique<BatcherChannel>(self, size_t(options.table.replicas), options.link,
                                                 st->start);
  st->epoch.assign(size_t(options.table.replicas), 0);
  st->broken.assign(size_t(options.table.replicas), false);
  st->published_kv.assign(size_t(options.table.replicas), {-1, -1, -1});
  st->table = std::make_unique<LoggedRequestTable>(options.table, options.routing_policy,
                                                   options.routing_seed, options.latency_aware,
                                                   *st->channel, router_log_from_env());
  st->table->on_replicas_changed([st = st.get()] { publish(*st); });
  if (st->faults)
    st->table->on_resumed([st = st.get()](double down, double next_token) {
      // On the fault book's clock.
      const double at = st->faults->now();
      st->faults->resumed(at - (next_token - down), at);
    });
  publish(*st);
  self->send(self, rtick_atom::value);
  // Shutdown: nothing accepted ends in silence.
  self->set_exit_handler([=](caf::exit_msg& em) {
    st->table->shutdown("the server is shutting down");
    st->shared->ready = false;
    self->quit(em.reason);
  });
  return {
      [=](submit_atom, CompletionRequest& req, std::shared_ptr<CompletionSink>& sink) {
        st->table->submit(std::move(req), std::move(sink), st->now());
        publish(*st);
      },
      [=](cancel_atom, uint64_t id) { st->table->cancel(id, st->now()); },
      [=](events_atom, const StepEvents& ev) {
        // From a batcher, perhaps in another process: its counts feed the
        // routing policy's load view (as size_t) and its step time the
        // policy's rates, so one that makes no sense is dropped whole.
        if (const std::string problem = step_events_problem(ev); !problem.empty()) {
          spdlog::error("router: dropped step events of replica {}: {}", ev.replica, problem);
          return;
        }
        // A replica that outlived its placement (a node declared dead that
        // came back) is fenced: its events speak for an old epoch.
        if (ev.replica < 0 || size_t(ev.replica) >= st->epoch.size() ||
            ev.epoch != st->epoch[size_t(ev.replica)] || st->broken[size_t(ev.replica)])
          return;
        ReplicaLink& link = st->channel->link(ev.replica);
        switch (link.receive(ev.seq, ev.acked)) {
          case SequenceCheck::Verdict::Next:
            break;
          case SequenceCheck::Verdict::Duplicate:
            return;
          case SequenceCheck::Verdict::Gap:
            return channel_broke(self, *st, ev.replica,
                                 "a message from it was lost or overtaken (" +
                                     link.incoming().describe_gap(ev.seq) + ")");
        }
        if (st->metrics) {
          if (ev.batch_sequences > 0)
            st->metrics->observe_step(ev.batch_sequences, ev.batch_tokens);
          auto& kv = st->published_kv[size_t(ev.replica)];
          if (kv != std::tuple{ev.blocks_used, ev.blocks_free, ev.blocks_cached}) {
            kv = {ev.blocks_used, ev.blocks_free, ev.blocks_cached};
            st->metrics->set_kv_blocks(ev.replica, size_t(ev.blocks_used), size_t(ev.blocks_free));
            st->metrics->set_cached_blocks(ev.replica, size_t(ev.blocks_cached));
          }
          st->metrics->add_prefix_cache(ev.replica, ev.prefix_queried, ev.prefix_hits);
        }
        st->table->on_events(ev, st->now());
        publish(*st);
      },
      [=](up_atom, int replica, uint64_t epoch, BatcherActor b) {
        if (replica < 0 || size_t(replica) >= st->epoch.size()) return false;
        // Asked again: its answer was lost, or late.
        if (epoch == st->epoch[size_t(replica)]) return true;
        if (epoch < st->epoch[size_t(replica)]) return false;  // an older placement, late
        st->epoch[size_t(replica)] = epoch;
        st->broken[size_t(replica)] = false;
        st->channel->set(replica, std::move(b));
        spdlog::info("replica {} ready (placement {})", replica, epoch);
        st->table->replica_up(replica, st->now());
        if (st->faults) st->faults->replica_up(replica, st->faults->now());
        publish(*st);
        return true;
      },
      [=](down_atom, int replica, uint64_t epoch, bool permanent) {
        if (replica < 0 || size_t(replica) >= st->epoch.size()) return;
        // Only the placement that is up can go down; a given-up replica is
        // given up whatever placement failed last.
        const bool current = epoch == st->epoch[size_t(replica)];
        if (!current && !permanent) return;
        // Fenced until its next placement is up: events it sent before it
        // went down (still queued here) must not deliver tokens to requests
        // that are resuming elsewhere.
        if (current) st->broken[size_t(replica)] = true;
        const size_t resumed = st->table->replica_down(replica, permanent, st->now());
        clear_kv_blocks(*st, replica);
        spdlog::warn("replica {} down{}; {} requests to resume", replica,
                     permanent ? " for good" : "", resumed);
        publish(*st);
      },
      [=](watch_atom, caf::actor supervisor) { st->supervisor = std::move(supervisor); },
      [=](rtick_atom) {
        const auto& reps = st->table->table().replicas();
        for (size_t r = 0; r < reps.size(); ++r) {
          if (!reps[r].live || st->broken[r]) continue;
          ReplicaLink& link = st->channel->link(int(r));
          switch (link.tick(st->now())) {
            case ReplicaLink::Action::None:
              break;
            case ReplicaLink::Action::Probe:
              st->channel->probe(int(r));
              break;
            case ReplicaLink::Action::Broken:
              channel_broke(self, *st, int(r),
                            "it acknowledged nothing for " +
                                std::to_string(int(link.waiting_s(st->now()) * 1000)) + " ms");
              break;
          }
        }
        st->table->tick(st->now());
        publish(*st);
        self->delayed_send(self, kTick, rtick_atom::value);
      },
  };
}

}  // namespace troupe
