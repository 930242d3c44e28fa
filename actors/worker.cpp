#include "actors/worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "actors/messages.h"

namespace troupe {

caf::behavior worker_actor(caf::event_based_actor* self, EngineFactory factory) {
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
  std::shared_ptr<StepEngine> engine = factory();
  auto delay = std::make_shared<double>(0.0);
  return {
      [=](step_atom, const std::vector<EngineItem>& items) -> std::vector<int> {
        if (*delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(*delay));
        return engine->step(items);
      },
      [=](release_atom, uint64_t seq) { engine->release(seq); },
      [=](crash_atom) -> caf::result<void> {
        spdlog::warn("worker: injected crash");
        throw std::runtime_error("injected fault: worker crash");
      },
      [=](slow_atom, double seconds) { *delay = seconds; },
  };
}

}  // namespace troupe
