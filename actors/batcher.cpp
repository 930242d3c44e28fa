#include "actors/batcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "actors/wire_checks.h"
#include "actors/worker.h"
#include "scheduler/replica_link.h"

namespace troupe {

namespace {

using Clock = std::chrono::steady_clock;

struct BatcherState {
  RouterActor router;
  uint64_t epoch = 0;
  WorkerActor worker;
  std::unique_ptr<ReplicaScheduler> sched;
  int vocab_size = 0;
  int context_length = 0;
  bool lookahead = false;
  bool up = false;
  // When the last step was answered: a step launched ahead of it started
  // on the device then, not when it was sent (the routing policy learns
  // the replica's speed from these times).
  Clock::time_point last_answer;
  // The channel with the router (scheduler/replica_link.h).
  SequenceCheck from_router;
  uint64_t sent = 0;
  // Injected refusals of KV blocks, by fault id, while they last: blocks
  // are refused while any is on; each is confirmed once.
  struct KvFault {
    FaultInjectorActor reporter;
    uint64_t refusals_before = 0;
    bool confirmed = false;
  };
  std::map<uint64_t, KvFault> kv_faults;
};

// Every message to the router is numbered and carries what it had received.
void tell_router(BatcherActor::pointer self, BatcherState& s, StepEvents ev) {
  ev.seq = ++s.sent;
  ev.acked = s.from_router.last();
  self->send(s.router, events_atom::value, std::move(ev));
}

// A message from the router, in order: handle it. A duplicate is dropped; a
// gap means one was lost or overtaken, and this replica cannot know what it
// missed: it exits, and supervision places it again (its requests resume).
bool in_order(BatcherActor::pointer self, BatcherState& s, uint64_t seq) {
  switch (s.from_router.accept(seq)) {
    case SequenceCheck::Verdict::Next:
      return true;
    case SequenceCheck::Verdict::Duplicate:
      return false;
    case SequenceCheck::Verdict::Gap:
      break;
  }
  const std::string why = "replica " + std::to_string(s.sched->replica()) +
                          ": a message from the router was lost (" +
                          s.from_router.describe_gap(seq) + ")";
  spdlog::error("{}", why);
  self->quit(caf::make_error(caf::sec::runtime_error, why));
  return false;
}

void report(BatcherActor::pointer self, const FaultInjectorActor& to, uint64_t id,
            FaultOutcome outcome, std::string text) {
  if (to) self->send(to, fault_atom::value, FaultReport{id, outcome, std::move(text)});
}

// The refusal's effect is seen once a planned step wanted blocks it was refused.
void confirm_kv_fault(BatcherActor::pointer self, BatcherState& s) {
  for (auto& [id, f] : s.kv_faults) {
    if (f.confirmed || s.sched->refusals() == f.refusals_before) continue;
    report(self, f.reporter, id, FaultOutcome::Confirmed,
           "replica " + std::to_string(s.sched->replica()) + " was refused KV blocks (" +
               std::to_string(s.sched->running()) + " running, " +
               std::to_string(s.sched->waiting()) + " waiting)");
    f.confirmed = true;
  }
}

// Hands the scheduler's side effects on: engine state to drop, to the
// worker (before any later step), and requests that ended idle, to the router.
void flush(BatcherActor::pointer self, BatcherState& s) {
  for (uint64_t id : s.sched->take_released()) self->send(s.worker, release_atom::value, id);
  if (auto ended = s.sched->take_ended()) tell_router(self, s, std::move(*ended));
}

void schedule(BatcherActor::pointer self, std::shared_ptr<BatcherState> st) {
  if (!st->up) return;
  while (st->sched->can_launch()) {
    auto step = st->sched->next_step();
    flush(self, *st);
    confirm_kv_fault(self, *st);
    if (!step) return;
    const uint64_t id = step->id;
    const auto t0 = Clock::now();
    self->request(st->worker, caf::infinite, step_atom::value, std::move(step->items))
        .then(
            [=](const StepOutput& out) {
              const auto now = Clock::now();
              const auto start = st->lookahead ? std::max(t0, st->last_answer) : t0;
              st->last_answer = now;
              const double took = std::chrono::duration<double>(now - start).count();
              st->sched->observe_step_time(took);
              StepEvents ev =
                  st->sched->finish_step(id, out.ids, took, out.logprobs, out.prompt_logprobs);
              flush(self, *st);
              tell_router(self, *st, std::move(ev));
              schedule(self, st);
            },
            [=](caf::error& err) {
              // With several steps in flight, the others' requests fail with
              // request_receiver_down once the worker is gone; the link brings
              // the reason it died, which is what supervision should see.
              if (err == caf::sec::request_receiver_down) return;
              spdlog::error("replica {}: step failed: {}", st->sched->replica(),
                            self->system().render(err));
              self->quit(err);
            });
  }
}

// The router learns of this placement from one message; lost (a link that
// drops messages), the replica would run and never be given work, so it is
// asked until answered. A repeat is answered alike.
void announce(BatcherActor::pointer self, std::shared_ptr<BatcherState> st) {
  constexpr auto kAnswerWithin = std::chrono::seconds(2);
  self->request(st->router, kAnswerWithin, up_atom::value, st->sched->replica(), st->epoch,
                caf::actor_cast<BatcherActor>(self))
      .then(
          [=](bool current) {
            if (st->up) return;
            if (!current) {
              // Placed anew meanwhile: the supervisor stops this one.
              spdlog::info("replica {}: placement {} was superseded before it served",
                           st->sched->replica(), st->epoch);
              return;
            }
            st->up = true;
            // Its own load (an empty KV cache) at once, the channel's first
            // message: what the router shows of this replica is this
            // placement's from the start, not the last one's.
            tell_router(self, *st, st->sched->load_report());
            schedule(self, st);
          },
          [=](caf::error& err) {
            if (err != caf::sec::request_timeout) return self->quit(err);
            spdlog::warn(
                "replica {}: the router did not answer its placement {} being up; "
                "telling it again",
                st->sched->replica(), st->epoch);
            announce(self, st);
          });
}

void probe(BatcherActor::pointer self, std::shared_ptr<BatcherState> st) {
  PlannedStep step = st->sched->probe_step();
  const uint64_t id = step.id;
  self->request(st->worker, caf::infinite, step_atom::value, std::move(step.items))
      .then(
          [=](const StepOutput&) {
            st->sched->finish_probe(id);
            flush(self, *st);
            announce(self, st);
          },
          [=](caf::error& err) { self->quit(err); });
}

}  // namespace

BatcherActor::behavior_type batcher(BatcherActor::pointer self, RouterActor router,
                                    BatcherOptions options) {
  auto st = std::make_shared<BatcherState>();
  st->router = std::move(router);
  st->epoch = options.scheduler.epoch;
  st->sched = std::make_unique<ReplicaScheduler>(options.scheduler);
  st->vocab_size = options.vocab_size;
  st->context_length = options.scheduler.stop.context_length;
  st->lookahead = options.scheduler.lookahead;
  st->worker = self->spawn<caf::detached + caf::linked>(
      worker, options.engine, options.scheduler.replica, options.metrics, options.parts);
  probe(self, st);
  return {
      [=](assign_atom, Assignment& a) {
        if (!in_order(self, *st, a.seq)) return;
        // From the router, in the coordinator's process. One the engine
        // would refuse (a token outside the vocabulary, sampling the
        // sampler throws on) would kill the worker, and then every replica
        // it is resumed on: it ends here instead, as the server's cancel.
        if (const std::string problem = assignment_problem(a, st->vocab_size, st->context_length);
            !problem.empty()) {
          spdlog::error("replica {}: refused an assignment: {}", st->sched->replica(), problem);
          StepEvents ev = st->sched->load_report();
          ev.done.push_back({a.id, FinishReason::Cancelled, 0});
          tell_router(self, *st, std::move(ev));
          return;
        }
        st->sched->add(std::move(a));
        schedule(self, st);
      },
      [=](cancel_atom, uint64_t id, uint64_t seq) {
        if (!in_order(self, *st, seq)) return;
        st->sched->cancel(id);
        schedule(self, st);
      },
      [=](sync_atom, uint64_t seq) {
        if (!in_order(self, *st, seq)) return;
        tell_router(self, *st, st->sched->load_report());
      },
      [=](fault_atom a, FaultOrder& o, FaultInjectorActor& reporter) {
        const int replica = st->sched->replica();
        // From the coordinator's supervisor; the worker takes it as checked here.
        if (const std::string problem = fault_order_problem(o); !problem.empty()) {
          spdlog::error("replica {}: refused a fault order: {}", replica, problem);
          report(self, reporter, o.id, FaultOutcome::Refused, problem);
          return;
        }
        if (o.kind == FaultKind::KvAllocFail) {
          if (o.end) {
            st->kv_faults.erase(o.id);
          } else {
            st->kv_faults[o.id] = {reporter, st->sched->refusals(), false};
            report(self, reporter, o.id, FaultOutcome::Applied,
                   "replica " + std::to_string(replica) + " refuses KV blocks");
          }
          st->sched->refuse_blocks(!st->kv_faults.empty());
          schedule(self, st);
          return;
        }
        if (o.kind == FaultKind::Kill && o.role == FaultRole::Batcher) {
          // Applied at once, so never armed here: nothing to withdraw.
          if (o.end) return;
          report(self, reporter, o.id, FaultOutcome::Applied,
                 "the batcher of replica " + std::to_string(replica) + " exits");
          self->quit(caf::make_error(
              caf::sec::runtime_error,
              "injected fault: batcher of replica " + std::to_string(replica) + " killed"));
          return;
        }
        self->send(st->worker, a, std::move(o), std::move(reporter));
      },
  };
}

}  // namespace troupe
