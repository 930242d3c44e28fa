#include "actors/worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <thread>

#include "actors/messages.h"
#include "actors/shard.h"
#include "gpu/parallel_engine.h"
#include "scheduler/microbatch_tuner.h"

namespace troupe {

namespace {
void publish_stages(const ParallelEngine& pe, int replica, Metrics& metrics) {
  const ParallelStats st = pe.stats();
  for (size_t s = 0; s < st.stages.size(); ++s) {
    const StageStats& g = st.stages[s];
    metrics.set_stage(replica, int(s), g.busy_s, st.bubble_fraction(int(s)),
                      g.busy_s > 0 ? g.comm_s / g.busy_s : 0.0, double(g.comm_bytes));
  }
}
}  // namespace

caf::behavior worker_actor(caf::event_based_actor* self, EngineFactory factory, int replica,
                           Metrics* metrics) {
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
  // A multi-device engine's devices are shard actors under this worker.
  auto shards = std::make_shared<std::vector<caf::actor>>();
  std::shared_ptr<StepEngine> engine = factory(shard_launcher(self, replica, shards));
  auto* parallel = dynamic_cast<ParallelEngine*>(engine.get());
  // A pipeline's micro-batch count follows its measured stage times.
  std::shared_ptr<MicrobatchTuner> tuner;
  if (parallel && parallel->pipeline() > 1)
    tuner = std::make_shared<MicrobatchTuner>(parallel->pipeline());
  const auto start = std::chrono::steady_clock::now();
  auto delay = std::make_shared<double>(0.0);
  // Pipeline steps in flight: worker id -> (engine ticket, the batcher's promise).
  using Pending =
      std::map<uint64_t, std::pair<uint64_t, caf::typed_response_promise<std::vector<int>>>>;
  auto pending = std::make_shared<Pending>();
  auto next_id = std::make_shared<uint64_t>(1);
  return {
      [=](step_atom,
          const std::vector<EngineItem>& items) -> caf::typed_response_promise<std::vector<int>> {
        auto rp = self->make_response_promise<std::vector<int>>();
        if (*delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(*delay));
        if (!parallel) {
          rp.deliver(engine->step(items));
          return rp;
        }
        // A pipeline's steps are launched without waiting: the batcher keeps
        // one per group of sequences in flight, and their answers come back
        // as the engine reports each step done.
        if (tuner) {
          size_t tokens = 0;
          for (const auto& it : items) tokens += it.tokens.size();
          const double now =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          // Micro-batches fill the pipeline only when no other step does; no
          // more of them than sequences (a sequence is not split).
          const int m = pending->empty() ? tuner->choose(tokens, now) : 1;
          parallel->set_microbatches(std::min(int(items.size()), m));
        }
        if (metrics) metrics->pipeline_step_launched(replica, !pending->empty());
        const uint64_t id = (*next_id)++;
        caf::actor me = caf::actor_cast<caf::actor>(self);
        const uint64_t ticket =
            parallel->launch(items, [me, id] { caf::anon_send(me, stepdone_atom::value, id); });
        pending->emplace(id, std::make_pair(ticket, rp));
        return rp;
      },
      [=](stepdone_atom, uint64_t id) {
        auto it = pending->find(id);
        if (it == pending->end()) return;
        auto [ticket, rp] = it->second;
        pending->erase(it);
        auto out = parallel->finish(ticket);  // throws the step's error: this worker dies
        if (tuner)
          for (const auto& smp : parallel->last_samples())
            tuner->observe(smp.stage, smp.tokens, smp.seconds);
        if (metrics) publish_stages(*parallel, replica, *metrics);
        rp.deliver(std::move(out));
      },
      [=](release_atom, uint64_t seq) { engine->release(seq); },
      [=](crash_atom) -> caf::result<void> {
        spdlog::warn("worker: injected crash");
        throw std::runtime_error("injected fault: worker crash");
      },
      [=](crash_atom a, int device) {
        if (device < 0 || size_t(device) >= shards->size()) {
          spdlog::warn("worker: no shard {} to crash (this replica has {})", device,
                       shards->size());
          return;
        }
        self->send((*shards)[size_t(device)], a);
      },
      [=](slow_atom, double seconds) { *delay = seconds; },
  };
}

}  // namespace troupe
