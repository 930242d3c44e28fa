#include "actors/worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <thread>

#include "actors/shard.h"
#include "scheduler/microbatch_tuner.h"

namespace troupe {

namespace {

void publish_stages(const StepEngine& engine, int replica, Metrics& metrics) {
  const EngineStats st = engine.stats();
  for (size_t s = 0; s < st.stages.size(); ++s) {
    const StageStats& g = st.stages[s];
    metrics.set_stage(replica, int(s), g.busy_s, st.bubble_fraction(int(s)),
                      g.busy_s > 0 ? g.comm_s / g.busy_s : 0.0, double(g.comm_bytes));
  }
}

struct WorkerState {
  std::unique_ptr<StepEngine> engine;
  std::vector<ShardActor> shards;
  std::vector<MemberActor> members;        // this replica's parts on other nodes
  std::unique_ptr<MicrobatchTuner> tuner;  // pipelines only
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double delay_s = 0;  // fault injection: added to every step
  // Steps in flight: worker id -> (engine ticket, the batcher's promise).
  std::map<uint64_t, std::pair<uint64_t, caf::typed_response_promise<std::vector<int>>>> pending;
  uint64_t next_id = 1;
};

}  // namespace

WorkerActor::behavior_type worker(WorkerActor::pointer self, EngineFactory factory, int replica,
                                  Metrics* metrics, std::vector<MemberActor> members) {
  // A throwing step ends this actor (the linked batcher follows, and the
  // supervisor restarts the replica); log it here instead of CAF's stdout.
  self->set_exception_handler([](std::exception_ptr& eptr) -> caf::error {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      spdlog::error("worker: {}", e.what());
      return caf::make_error(caf::sec::runtime_error, e.what());
    } catch (...) {
      return caf::make_error(caf::sec::runtime_error, "unknown exception");
    }
  });
  auto st = std::make_shared<WorkerState>();
  // Linked before building: the parts meet at a rendezvous, and a part that
  // fails there (or later) must take this replica down, and this one it.
  for (const MemberActor& m : members) self->link_to(m);
  st->members = std::move(members);
  auto spawned = std::make_shared<std::vector<ShardActor>>();
  st->engine = factory(shard_launcher(self, replica, spawned));
  st->shards = *spawned;
  if (st->engine->stages() > 1) st->tuner = std::make_unique<MicrobatchTuner>(st->engine->stages());
  return {
      [=](step_atom, std::vector<StepItem>& items) -> caf::result<std::vector<int>> {
        auto rp = self->make_response_promise<std::vector<int>>();
        if (st->delay_s > 0)
          std::this_thread::sleep_for(std::chrono::duration<double>(st->delay_s));
        if (st->tuner) {
          size_t tokens = 0;
          for (const auto& it : items) tokens += it.tokens.size();
          const double now =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - st->start).count();
          // Micro-batches fill the pipeline only when no other step does; no
          // more of them than sequences (a sequence is not split).
          const int m = st->pending.empty() ? st->tuner->choose(tokens, now) : 1;
          st->engine->set_microbatches(std::min(int(items.size()), m));
        }
        if (metrics && !st->shards.empty())
          metrics->pipeline_step_launched(replica, !st->pending.empty());
        // Steps are launched without waiting: with a pipeline the batcher
        // keeps one per group of sequences in flight, and each is answered
        // when the engine reports it done.
        const uint64_t id = st->next_id++;
        st->pending.emplace(id, std::make_pair(uint64_t(0), rp));
        WorkerActor me = caf::actor_cast<WorkerActor>(self);
        auto on_done = [me, id] { caf::anon_send(me, stepdone_atom::value, id); };
        if (st->members.empty()) {
          st->pending.at(id).first = st->engine->launch(std::move(items), on_done);
        } else {
          // Every part runs the step, cut alike, in the order steps come.
          const int m = st->engine->microbatches_for(items.size());
          for (const MemberActor& member : st->members)
            self->send(member, step_atom::value, items, m);
          st->pending.at(id).first = st->engine->launch_split(std::move(items), m, on_done);
        }
        return rp;
      },
      [=](stepdone_atom, uint64_t id) {
        auto it = st->pending.find(id);
        if (it == st->pending.end()) return;
        auto [ticket, rp] = it->second;
        st->pending.erase(it);
        auto out = st->engine->finish(ticket);  // throws the step's error: this worker dies
        if (st->tuner)
          for (const auto& smp : st->engine->last_samples())
            st->tuner->observe(smp.stage, smp.tokens, smp.seconds);
        if (metrics && !st->shards.empty()) publish_stages(*st->engine, replica, *metrics);
        rp.deliver(std::move(out));
      },
      [=](release_atom, uint64_t seq) { st->engine->release(seq); },
      [=](crash_atom) -> caf::result<void> {
        spdlog::warn("worker: injected crash");
        throw std::runtime_error("injected fault: worker crash");
      },
      [=](crash_atom a, int device) {
        if (device < 0 || size_t(device) >= st->shards.size()) {
          spdlog::warn("worker: no shard {} to crash (this replica has {})", device,
                       st->shards.size());
          return;
        }
        self->send(st->shards[size_t(device)], a);
      },
      [=](slow_atom, double seconds) { st->delay_s = seconds; },
  };
}

}  // namespace troupe
