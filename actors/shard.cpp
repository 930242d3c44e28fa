#include "actors/shard.h"

#include <spdlog/spdlog.h>

#include <set>
#include <stdexcept>
#include <string>

#include "actors/death_report.h"

namespace troupe {

namespace {

std::string shard_name(int replica, int stage, int rank) {
  return "replica " + std::to_string(replica) + " shard (stage " + std::to_string(stage) +
         ", rank " + std::to_string(rank) + ")";
}

// Stops its shard actor when the engine lets go of the device, and waits
// until the actor has ended: its jobs use the engine's device state. The
// queue's closing is not that moment: a shard that fails or is killed
// closes its queue first and only then abandons its own job and the queued
// ones, each of which fails its step inside the engine (aborting the
// group's communicators, releasing credits). An engine destroyed when the
// queue closed was used after it was freed.
class ShardRunner : public DeviceRunner {
 public:
  ShardRunner(ShardActor actor, std::shared_ptr<std::latch> ended)
      : actor_(std::move(actor)), ended_(std::move(ended)) {}
  ~ShardRunner() override {
    caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
    ended_->wait();
  }

 private:
  ShardActor actor_;
  std::shared_ptr<std::latch> ended_;
};

}  // namespace

ShardActor::behavior_type shard(ShardActor::pointer self, std::shared_ptr<DeviceQueue> queue,
                                std::shared_ptr<std::latch> ended, int replica, int stage,
                                int rank) {
  const std::string name = shard_name(replica, stage, rank);
  // However the actor ends (a failed job, an injected crash, a link or an
  // exit message), its queue closes, so no job of it is left waiting. This
  // runs once no handler of it can run again, so signalling `ended` here,
  // after the close has abandoned the queued jobs, is what makes it safe to
  // free the engine.
  self->attach_functor([queue, ended, name](const caf::error&) {
    queue->close(name + " exited");
    queue->set_notify({});  // drops the queue's handle on this actor
    ended->count_down();
  });
  self->set_exception_handler(die_naming(name));
  auto armed = std::make_shared<std::set<uint64_t>>();  // the faults it dies of, by id
  return {
      [=](run_atom) {
        auto job = queue->try_pop();
        if (!job) return;
        if (!armed->empty()) {
          const std::string why = "injected fault: " + name + " killed mid-step";
          queue->close(why);
          job->abandon(why);
          throw std::runtime_error(why);
        }
        run_device_job(*job, *queue, stage, rank);
      },
      [=](crash_atom, uint64_t fault, bool arm, const FaultInjectorActor& reporter) {
        if (arm) {
          spdlog::warn("{}: armed to die at its next step", name);
          armed->insert(fault);
          return;
        }
        // Withdrawn (the coordinator gave up on its effect): only if it is
        // still armed, which a shard that died of it no longer is.
        if (armed->erase(fault) == 0) return;
        spdlog::info("{}: fault {} withdrawn", name, fault);
        if (reporter)
          self->send(
              reporter, fault_atom::value,
              FaultReport{fault, FaultOutcome::Withdrawn, name + " will not die in its next step"});
      },
  };
}

DeviceLauncher shard_launcher(caf::local_actor* worker, int replica,
                              std::shared_ptr<std::vector<PlacedShard>> spawned) {
  return [worker, replica, spawned](int stage, int rank, std::shared_ptr<DeviceQueue> queue) {
    auto ended = std::make_shared<std::latch>(1);
    ShardActor a =
        worker->spawn<caf::detached + caf::linked>(shard, queue, ended, replica, stage, rank);
    spawned->push_back({a, stage, rank});
    queue->set_notify([a] { caf::anon_send(a, run_atom::value); });
    return std::make_unique<ShardRunner>(std::move(a), std::move(ended));
  };
}

ShardActor shard_of(const std::vector<PlacedShard>& shards, int stage, int rank) {
  for (const PlacedShard& s : shards)
    if (s.stage == stage && s.rank == rank) return s.actor;
  return {};
}

}  // namespace troupe
