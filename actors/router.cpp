#include "actors/router.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <vector>

#include "actors/wire_checks.h"
#include "scheduler/router_log.h"

namespace troupe {

namespace {

// Deadlines and queue wait limits are checked this often.
constexpr auto kTick = std::chrono::milliseconds(50);

// The table's placements and cancellations, as messages to the batchers.
class BatcherChannel : public ReplicaChannel {
 public:
  BatcherChannel(RouterActor::pointer self, size_t replicas) : self_(self), batchers_(replicas) {}
  void assign(int replica, Assignment a) override {
    self_->send(batchers_.at(size_t(replica)), assign_atom::value, std::move(a));
  }
  void cancel(int replica, uint64_t id) override {
    self_->send(batchers_.at(size_t(replica)), cancel_atom::value, id);
  }
  void set(int replica, BatcherActor b) { batchers_.at(size_t(replica)) = std::move(b); }

 private:
  RouterActor::pointer self_;
  std::vector<BatcherActor> batchers_;
};

struct RouterState {
  std::vector<uint64_t> epoch;  // per replica: the placement its events must carry
  std::unique_ptr<BatcherChannel> channel;
  std::unique_ptr<LoggedRequestTable> table;  // logged when TROUPE_ROUTER_LOG names a file
  std::shared_ptr<RouterShared> shared;
  Metrics* metrics = nullptr;
  std::shared_ptr<FaultBook> faults;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

void publish(RouterState& s) {
  const RequestTable& t = s.table->table();
  s.shared->live_replicas = t.live_replicas();
  s.shared->ready = t.live_replicas() > 0;
  if (!s.metrics) return;
  const auto& reps = t.replicas();
  for (size_t i = 0; i < reps.size(); ++i)
    s.metrics->set_replica_state(int(i), reps[i].live     ? ReplicaState::Ready
                                         : reps[i].failed ? ReplicaState::FailedPermanently
                                                          : ReplicaState::Starting);
  s.metrics->set_running_sequences(t.running());
  s.metrics->set_queue_depth(t.queue_depth());
}

}  // namespace

RouterActor::behavior_type router(RouterActor::pointer self, RouterOptions options,
                                  std::shared_ptr<RouterShared> shared, Metrics* metrics) {
  auto st = std::make_shared<RouterState>();
  st->metrics = metrics;
  st->faults = options.faults;
  st->shared = std::move(shared);
  st->channel = std::make_unique<BatcherChannel>(self, size_t(options.table.replicas));
  st->epoch.assign(size_t(options.table.replicas), 0);
  st->table = std::make_unique<LoggedRequestTable>(options.table, options.routing_policy,
                                                   options.routing_seed, *st->channel,
                                                   router_log_from_env());
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
            ev.epoch != st->epoch[size_t(ev.replica)])
          return;
        if (st->metrics) {
          if (ev.batch_sequences > 0)
            st->metrics->observe_step(ev.batch_sequences, ev.batch_tokens);
          st->metrics->set_kv_blocks(ev.replica, size_t(ev.blocks_used), size_t(ev.blocks_free));
        }
        st->table->on_events(ev, st->now());
        publish(*st);
      },
      [=](up_atom, int replica, uint64_t epoch, BatcherActor b) {
        if (replica < 0 || size_t(replica) >= st->epoch.size()) return;
        if (epoch <= st->epoch[size_t(replica)]) return;  // an older placement, late
        st->epoch[size_t(replica)] = epoch;
        st->channel->set(replica, std::move(b));
        spdlog::info("replica {} ready (placement {})", replica, epoch);
        st->table->replica_up(replica, st->now());
        if (st->faults) st->faults->replica_up(replica, st->faults->now());
        publish(*st);
      },
      [=](down_atom, int replica, uint64_t epoch, bool permanent) {
        if (replica < 0 || size_t(replica) >= st->epoch.size()) return;
        // Only the placement that is up can go down; a given-up replica is
        // given up whatever placement failed last.
        const bool current = epoch == st->epoch[size_t(replica)];
        if (!current && !permanent) return;
        const size_t resumed = st->table->replica_down(replica, permanent, st->now());
        spdlog::warn("replica {} down{}; {} requests to resume", replica,
                     permanent ? " for good" : "", resumed);
        publish(*st);
      },
      [=](rtick_atom) {
        st->table->tick(st->now());
        publish(*st);
        self->delayed_send(self, kTick, rtick_atom::value);
      },
  };
}

}  // namespace troupe
