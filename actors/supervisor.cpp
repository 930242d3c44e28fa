#include "actors/supervisor.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>

#include "actors/messages.h"

namespace troupe {

namespace {

using Clock = std::chrono::steady_clock;

struct Slot {
  caf::actor batcher;
  std::deque<Clock::time_point> restarts;  // within the window
  bool failed = false;
};

struct SupervisorState {
  SupervisorOptions opts;
  caf::actor router;
  ModelConfig model;
  std::shared_ptr<SupervisorShared> shared;
  std::vector<Slot> slots;
};

void start(caf::event_based_actor* self, SupervisorState& s, int i) {
  s.slots[size_t(i)].batcher =
      self->spawn<caf::monitored>(batcher_actor, s.router, s.model, s.opts.batchers[size_t(i)]);
}

}  // namespace

caf::behavior supervisor_actor(caf::event_based_actor* self, caf::actor router, ModelConfig model,
                               SupervisorOptions options, std::shared_ptr<SupervisorShared> shared,
                               Metrics* metrics) {
  auto st = std::make_shared<SupervisorState>();
  st->opts = std::move(options);
  st->router = std::move(router);
  st->model = std::move(model);
  st->shared = std::move(shared);
  st->slots.resize(size_t(st->opts.replicas));
  for (int i = 0; i < st->opts.replicas; ++i) start(self, *st, i);
  self->set_down_handler([=](caf::down_msg& dm) {
    SupervisorState& s = *st;
    for (size_t i = 0; i < s.slots.size(); ++i) {
      Slot& slot = s.slots[i];
      if (!slot.batcher || slot.batcher.address() != dm.source) continue;
      slot.batcher = caf::actor{};
      const auto now = Clock::now();
      const auto window = std::chrono::duration<double>(s.opts.window_s);
      while (!slot.restarts.empty() && now - slot.restarts.front() > window)
        slot.restarts.pop_front();
      const bool give_up = int(slot.restarts.size()) >= s.opts.max_restarts;
      const std::string why = self->system().render(dm.reason);
      spdlog::warn("replica {} died ({}); {}", i, why,
                   give_up ? "restart limit reached, it stays down" : "restarting");
      {
        std::lock_guard<std::mutex> l(s.shared->mu);
        s.shared->last_death[i] = why;
      }
      self->send(s.router, down_atom::value, int(i), give_up);
      if (give_up) {
        slot.failed = true;
        s.shared->failed[i] = true;
        return;
      }
      slot.restarts.push_back(now);
      ++s.shared->restarts[i];
      if (metrics) metrics->replica_restarted(int(i));
      start(self, s, int(i));
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
        if (replica >= 0 && size_t(replica) < st->slots.size() &&
            st->slots[size_t(replica)].batcher)
          self->send(st->slots[size_t(replica)].batcher, a);
      },
      [=](crash_atom a, int replica, int device) {
        if (replica >= 0 && size_t(replica) < st->slots.size() &&
            st->slots[size_t(replica)].batcher)
          self->send(st->slots[size_t(replica)].batcher, a, device);
      },
      [=](slow_atom a, int replica, double seconds) {
        if (replica >= 0 && size_t(replica) < st->slots.size() &&
            st->slots[size_t(replica)].batcher)
          self->send(st->slots[size_t(replica)].batcher, a, seconds);
      },
  };
}

}  // namespace troupe
