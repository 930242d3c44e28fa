#include "actors/fault_injector.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

#include "actors/wire_checks.h"

namespace troupe {

namespace {

constexpr auto kTick = std::chrono::milliseconds(250);

}  // namespace

FaultInjectorActor::behavior_type fault_injector(FaultInjectorActor::pointer self,
                                                 std::shared_ptr<FaultBook> book,
                                                 SupervisorActor supervisor) {
  auto delayed = std::make_shared<std::set<uint64_t>>();  // waiting for their start time
  self->send(self, ftick_atom::value);
  return {
      [=](fault_atom a, uint64_t id) {
        const auto e = book->get(id);
        if (!e || e->state != FaultState::Scheduled) return;
        if (e->at_s > 0 && delayed->insert(id).second) {
          self->delayed_send(self, fault_delay(e->at_s), a, id);
          return;
        }
        delayed->erase(id);
        book->started(id, book->now());
        self->send(supervisor, a, e->order, caf::actor_cast<FaultInjectorActor>(self));
        if (fault_lasts(e->order.kind))
          self->delayed_send(self, fault_delay(e->duration_s), fend_atom::value, id);
      },
      [=](fault_atom, const FaultReport& r) {
        // From the actor that applied the order, perhaps on a node. The book
        // keeps the text and GET /admin/faults serves it as JSON (which
        // cannot hold bytes that are not UTF-8): a report that makes no
        // sense is dropped, and the fault fails for want of an effect.
        if (const std::string problem = fault_report_problem(r); !problem.empty()) {
          spdlog::error("fault injector: dropped a {}", problem);
          return;
        }
        book->report(r, book->now());
      },
      [=](fend_atom, uint64_t id) {
        const auto e = book->get(id);
        if (!e) return;
        FaultOrder end = e->order;
        end.end = true;
        self->send(supervisor, fault_atom::value, end, caf::actor_cast<FaultInjectorActor>(self));
        book->ended(id, book->now());
      },
      [=](ftick_atom t) {
        // A fault given up on is still armed wherever it went (a worker's
        // next step, a shard's, a replica's list of faults to pass on once
        // it runs): withdrawn there, by the same path, so that it does not
        // fire later on a book that says it failed.
        for (FaultOrder withdraw : book->expire(book->now())) {
          withdraw.end = true;
          self->send(supervisor, fault_atom::value, withdraw,
                     caf::actor_cast<FaultInjectorActor>(self));
        }
        self->delayed_send(self, kTick, t);
      },
  };
}

}  // namespace troupe
