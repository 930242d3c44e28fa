#include "actors/supervisor.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "scheduler/restart_intensity.h"

namespace troupe {

namespace {

struct Slot {
  BatcherActor batcher;
  RestartIntensity intensity;
};

struct SupervisorState {
  SupervisorOptions opts;
  RouterActor router;
  std::shared_ptr<SupervisorShared> shared;
  std::vector<Slot> slots;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

void start(SupervisorActor::pointer self, SupervisorState& s, size_t i) {
  s.slots[i].batcher = self->spawn<caf::monitored>(batcher, s.router, s.opts.batchers[i]);
}

// The replica's batcher, if it is up (fault injection goes nowhere otherwise).
BatcherActor* live(SupervisorState& s, int replica) {
  if (replica < 0 || size_t(replica) >= s.slots.size() || !s.slots[size_t(replica)].batcher)
    return nullptr;
  return &s.slots[size_t(replica)].batcher;
}

}  // namespace

SupervisorActor::behavior_type supervisor(SupervisorActor::pointer self, RouterActor router,
                                          SupervisorOptions options,
                                          std::shared_ptr<SupervisorShared> shared,
                                          Metrics* metrics) {
  auto st = std::make_shared<SupervisorState>();
  st->opts = std::move(options);
  st->router = std::move(router);
  st->shared = std::move(shared);
  for (size_t i = 0; i < st->opts.batchers.size(); ++i)
    st->slots.push_back(
        {BatcherActor{}, RestartIntensity(st->opts.max_restarts, st->opts.window_s)});
  for (size_t i = 0; i < st->slots.size(); ++i) start(self, *st, i);
  self->set_down_handler([=](caf::down_msg& dm) {
    SupervisorState& s = *st;
    for (size_t i = 0; i < s.slots.size(); ++i) {
      Slot& slot = s.slots[i];
      if (!slot.batcher || slot.batcher.address() != dm.source) continue;
      slot.batcher = BatcherActor{};
      const bool restart = slot.intensity.allow_restart(s.now());
      const std::string why = self->system().render(dm.reason);
      spdlog::warn("replica {} died ({}); {}", i, why,
                   restart ? "restarting" : "restart limit reached, it stays down");
      {
        std::lock_guard<std::mutex> l(s.shared->mu);
        s.shared->last_death[i] = why;
      }
      self->send(s.router, down_atom::value, int(i), !restart);
      if (!restart) {
        s.shared->failed[i] = true;
        return;
      }
      ++s.shared->restarts[i];
      if (metrics) metrics->replica_restarted(int(i));
      start(self, s, i);
      return;
    }
  });
  // Shutdown: take the replicas down with us (workers are linked to them).
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto& slot : st->slots)
      if (slot.batcher) self->send_exit(slot.batcher, em.reason);
    self->quit(em.reason);
  });
  return {
      [=](crash_atom a, int replica) {
        if (auto* b = live(*st, replica)) self->send(*b, a);
      },
      [=](crash_atom a, int replica, int device) {
        if (auto* b = live(*st, replica)) self->send(*b, a, device);
      },
      [=](slow_atom a, int replica, double seconds) {
        if (auto* b = live(*st, replica)) self->send(*b, a, seconds);
      },
  };
}

}  // namespace troupe
