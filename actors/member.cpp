#include "actors/member.h"

#include <spdlog/spdlog.h>

#include <map>
#include <stdexcept>

#include "actors/death_report.h"
#include "actors/shard.h"

namespace troupe {

namespace {

struct MemberState {
  EngineFactory factory;
  std::unique_ptr<StepEngine> engine;
  std::vector<PlacedShard> shards;
  StepLimits limits;
  std::map<uint64_t, uint64_t> pending;  // member step id -> engine ticket
  uint64_t next_id = 1;
  uint64_t next_step = 1;  // the leader's step number due next
  uint64_t repeated = 0;   // steps that came twice
};

}  // namespace

MemberActor::behavior_type member(MemberActor::pointer self, EngineFactory factory, int replica,
                                  std::string name, StepLimits limits) {
  self->set_exception_handler(die_naming(name));
  auto st = std::make_shared<MemberState>();
  st->factory = std::move(factory);
  st->limits = limits;
  // Told to exit (a fault, its replica stopped): the other parts hear why
  // at once, in their collectives' errors, before this part's teardown
  // tells them only that it was shut down.
  self->set_exit_handler([self, st, name](caf::exit_msg& em) {
    if (st->engine && em.reason != caf::exit_reason::normal)
      st->engine->abort_peers(name + " exited: " + self->system().render(em.reason));
    self->quit(em.reason);
  });
  return {
      [=](build_atom) {
        // Blocks until every part has met at the rendezvous (bounded by the
        // communicators' timeout): this actor is detached.
        auto spawned = std::make_shared<std::vector<PlacedShard>>();
        st->engine = st->factory(shard_launcher(self, replica, spawned));
        st->shards = *spawned;
        st->limits.vocab_size = st->engine->config().vocab_size;
        st->limits.context_length = st->engine->config().max_seq_len;
        st->limits.kv_blocks = st->engine->kv_blocks();
        st->limits.block_tokens = st->engine->block_tokens();
        spdlog::info("{}: built", name);
      },
      [=](step_atom, std::vector<StepItem>& items, int microbatches, uint64_t number) {
        if (!st->engine) throw std::logic_error("a step reached a part that was never built");
        // Steps cross the coordinator. One that arrives twice already ran;
        // one that never arrived would leave the other parts waiting in a
        // collective for this one until its timeout: the replica fails now.
        if (number < st->next_step) {
          // Logged at the 1st, 10th, 100th, ... such step: a link that
          // duplicates does so by the hundred.
          const uint64_t n = ++st->repeated;
          if (n == 1 || n == 10 || n == 100 || n % 1000 == 0)
            spdlog::warn("{}: step {} from the leader came again and was not run again ({} so far)",
                         name, number, n);
          return;
        }
        if (number != st->next_step)
          throw std::runtime_error("a step from the leader was lost on the way (expected step " +
                                   std::to_string(st->next_step) + ", got " +
                                   std::to_string(number) + ")");
        ++st->next_step;
        // From the leader's worker, in another process. A step this part
        // cannot run fails the replica, as the engine's own refusal would;
        // checked first, since the engine sizes its buffers by it.
        if (const std::string problem = step_problem(items, microbatches, st->limits);
            !problem.empty())
          throw std::invalid_argument("a step from the leader: " + problem);
        const uint64_t id = st->next_id++;
        MemberActor me = caf::actor_cast<MemberActor>(self);
        st->pending[id] = st->engine->launch_split(std::move(items), microbatches, [me, id] {
          caf::anon_send(me, stepdone_atom::value, id);
        });
      },
      [=](stepdone_atom, uint64_t id) {
        auto it = st->pending.find(id);
        if (it == st->pending.end()) return;
        const uint64_t ticket = it->second;
        st->pending.erase(it);
        st->engine->finish(ticket);  // throws the step's error: this part dies
      },
      [=](crash_atom, int stage, int rank, uint64_t fault, bool arm,
          const FaultInjectorActor& reporter) {
        // The leader's worker found the device on this part; the shard
        // reports its own withdrawal, and its death is the replica's.
        if (const ShardActor shard = shard_of(st->shards, stage, rank)) {
          self->send(shard, crash_atom::value, fault, arm, reporter);
          return;
        }
        const std::string why = name + " runs no device (stage " + std::to_string(stage) +
                                ", rank " + std::to_string(rank) + ")";
        spdlog::error("fault {}: {}", fault, why);
        if (arm && reporter)
          self->send(reporter, fault_atom::value, FaultReport{fault, FaultOutcome::Refused, why});
      },
  };
}

}  // namespace troupe
