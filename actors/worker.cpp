#include "actors/worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
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
  return {
      [=](step_atom, const std::vector<EngineItem>& items) -> std::vector<int> {
        if (*delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(*delay));
        if (tuner) {
          size_t tokens = 0;
          for (const auto& it : items) tokens += it.tokens.size();
          const double now =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          // No more micro-batches than sequences: a sequence is not split.
          parallel->set_microbatches(std::min(int(items.size()), tuner->choose(tokens, now)));
        }
        auto out = engine->step(items);
        if (tuner)
          for (const auto& smp : parallel->last_samples())
            tuner->observe(smp.stage, smp.tokens, smp.seconds);
        if (parallel && metrics) publish_stages(*parallel, replica, *metrics);
        return out;
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
