#include "actors/worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <stdexcept>
#include <thread>
#include <unordered_map>

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
  std::vector<PlacedShard> shards;
  ReplicaParts parts;       // its devices' parts, and the parts on other nodes (members)
  uint64_t part_steps = 0;  // steps sent to the members so far (numbered from 1)
  std::unique_ptr<MicrobatchTuner> tuner;  // pipelines only
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  using Promise = caf::typed_response_promise<StepOutput>;
  struct Pending {
    uint64_t ticket = 0;
    Promise promise;
    std::chrono::steady_clock::time_point launched;
    std::vector<uint64_t> seqs;  // per item: its sequence (the last sampled ids)
  };
  std::map<uint64_t, Pending> pending;  // steps in flight, by this worker's id
  uint64_t next_id = 1;
  // Steps planned ahead (ReplicaSchedulerOptions::lookahead) wait here
  // until every step before them is answered, and take their sequences'
  // last sampled ids in place of kSampledToken; the steps behind them wait
  // too, so that steps are answered in the order they came.
  struct Held {
    std::vector<StepItem> items;
    Promise promise;
  };
  std::deque<Held> held;
  bool launching_held = false;
  std::unordered_map<uint64_t, int> last_sampled;  // by sequence, until released
  // Injected faults: the next step throws (the fault's id; 0: none);
  // every step takes `factor` times as long while a slow fault lasts (the
  // largest factor of those on; each reported once, with the first step it
  // slowed).
  uint64_t throw_next_step = 0;
  struct Slow {
    double factor = 1;
    FaultInjectorActor reporter;
    bool confirmed = false;
  };
  std::map<uint64_t, Slow> slow;
};

void report(WorkerActor::pointer self, const FaultInjectorActor& to, uint64_t id,
            FaultOutcome outcome, std::string text) {
  if (to) self->send(to, fault_atom::value, FaultReport{id, outcome, std::move(text)});
}

// Three significant digits: a fast step is a fraction of a millisecond.
std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g ms", seconds * 1000);
  return text;
}

std::string factor_text(double factor) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", factor);
  return text;
}

// Applies a fault aimed at this replica's engine, shards or remote parts.
// A kill or step error's effect is the replica's death, which the
// supervisor sees; here it is only applied (or refused).
void apply_fault(WorkerActor::pointer self, WorkerState& st, int replica, const FaultOrder& o,
                 const FaultInjectorActor& reporter) {
  const std::string name = "replica " + std::to_string(replica);
  const auto refuse = [&](const std::string& why) {
    report(self, reporter, o.id, FaultOutcome::Refused, why);
  };
  const auto applied = [&](const std::string& what) {
    report(self, reporter, o.id, FaultOutcome::Applied, what);
  };
  // Devices are the replica's, stage-major, wherever they run: one on a
  // part on another node is that part's to arm (or disarm).
  const auto to_shard = [&](int device, bool arm) -> std::string {
    const ReplicaParts& p = st.parts;
    const int devices = p.hosts.empty() ? int(st.shards.size()) : int(p.hosts.size());
    if (devices == 0) return name + " has one device and no shard actors: kill its worker instead";
    if (device < 0 || device >= devices)
      return name + " has " + std::to_string(devices) + " devices; no device " +
             std::to_string(device);
    const int stage = device / p.tensor, rank = device % p.tensor;
    const int part = p.hosts.empty() ? p.leader : p.hosts[size_t(device)];
    if (part == p.leader) {
      const ShardActor shard = shard_of(st.shards, stage, rank);
      if (!shard) return name + " runs no shard of device " + std::to_string(device);
      self->send(shard, crash_atom::value, o.id, arm, reporter);
      return "";
    }
    const size_t m = size_t(member_of_part(part, p.leader));
    if (m >= st.parts.members.size())
      return name + " has no part " + std::to_string(part) + " for device " +
             std::to_string(device);
    self->send(st.parts.members[m], crash_atom::value, stage, rank, o.id, arm, reporter);
    return "";
  };
  const auto kill_shard = [&](int device) {
    if (const std::string problem = to_shard(device, true); !problem.empty())
      return refuse(problem);
    applied(name + ": device " + std::to_string(device) + " dies in its next step");
  };
  // A withdrawal: the shard disarms it if it still holds it, and says so.
  const auto disarm_shard = [&](int device) { to_shard(device, false); };
  if (o.end) {
    // Ends a lasting fault, or withdraws a one-shot one given up on. Kills
    // of a worker or a remote part are applied at once: never held armed.
    switch (o.kind) {
      case FaultKind::Kill:
        if (o.role == FaultRole::Shard) disarm_shard(o.device);
        return;
      case FaultKind::StepError:
        if (!st.shards.empty()) return disarm_shard(o.device < 0 ? 0 : o.device);
        if (st.throw_next_step == o.id) {
          st.throw_next_step = 0;
          report(self, reporter, o.id, FaultOutcome::Withdrawn,
                 name + ": its next step will not fail");
        }
        return;
      case FaultKind::Slow:
        st.slow.erase(o.id);
        return;
      case FaultKind::KvAllocFail:
        return;
    }
    return;
  }
  switch (o.kind) {
    case FaultKind::Kill:
      switch (o.role) {
        case FaultRole::Worker:
          spdlog::warn("worker of {}: killed by an injected fault", name);
          applied("the worker of " + name + " throws");
          throw std::runtime_error("injected fault: worker of " + name + " killed");
        case FaultRole::Shard:
          return kill_shard(o.device);
        case FaultRole::Member: {
          if (o.device < 0 || size_t(o.device) >= st.parts.members.size())
            return refuse(name + " has " + std::to_string(st.parts.members.size()) +
                          " part(s) on other nodes; no member " + std::to_string(o.device));
          // Named by its part's number, as the coordinator's log names it.
          const int part = part_of_member(o.device, st.parts.leader);
          const std::string what = "part " + std::to_string(part) + " of " + name;
          self->send_exit(
              st.parts.members[size_t(o.device)],
              caf::make_error(caf::sec::runtime_error, "injected fault: " + what + " killed"));
          return applied(what + " (member " + std::to_string(o.device) +
                         ", on another node) exits");
        }
        case FaultRole::Batcher:
          return refuse("a batcher's kill is applied by the batcher");
      }
      return;
    case FaultKind::StepError:
      // With shard actors, a device's step is its shard's job: it fails
      // mid-step for the rest of the group.
      if (!st.shards.empty()) return kill_shard(o.device < 0 ? 0 : o.device);
      if (o.device > 0)
        return refuse(name + " has one device; no device " + std::to_string(o.device));
      st.throw_next_step = o.id;
      return applied(name + ": its next step throws");
    case FaultKind::Slow:
      st.slow[o.id] = {o.factor, reporter, false};
      return applied(name + ": every step takes " + factor_text(o.factor) + "x as long");
    case FaultKind::KvAllocFail:
      return refuse("KV blocks are refused by the batcher");
  }
}

void complete_step(WorkerActor::pointer self, const std::shared_ptr<WorkerState>& st, int replica,
                   Metrics* metrics, uint64_t id);

// Launches a step now. A step the engine runs to its end inside launch()
// (one device) is answered at once, before this worker reads the next
// step: with lookahead that one is already waiting in the mailbox.
void launch_step(WorkerActor::pointer self, const std::shared_ptr<WorkerState>& st, int replica,
                 Metrics* metrics, std::vector<StepItem> items, WorkerState::Promise rp) {
  std::vector<uint64_t> seqs(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    StepItem& it = items[i];
    seqs[i] = it.seq;
    if (!it.feeds_sampled_token()) continue;
    auto last = st->last_sampled.find(it.seq);
    if (last == st->last_sampled.end())
      throw std::logic_error("replica " + std::to_string(replica) + ": a step feeds sequence " +
                             std::to_string(it.seq) +
                             " the token its previous step sampled, and none did");
    it.tokens[0] = last->second;
  }
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
  st->pending.emplace(id, WorkerState::Pending{0, std::move(rp), std::chrono::steady_clock::now(),
                                               std::move(seqs)});
  // 0: launching; 1: launch() returned first; 2: done first (inside launch()).
  auto state = std::make_shared<std::atomic<int>>(0);
  WorkerActor me = caf::actor_cast<WorkerActor>(self);
  auto on_done = [me, id, state] {
    int launching = 0;
    if (!state->compare_exchange_strong(launching, 2)) caf::anon_send(me, stepdone_atom::value, id);
  };
  if (st->parts.members.empty()) {
    st->pending.at(id).ticket = st->engine->launch(std::move(items), on_done);
  } else {
    // Every part runs the step, cut alike, in the order steps come.
    const int m = st->engine->microbatches_for(items.size());
    ++st->part_steps;
    for (const MemberActor& member : st->parts.members)
      self->send(member, step_atom::value, items, m, st->part_steps);
    st->pending.at(id).ticket = st->engine->launch_split(std::move(items), m, on_done);
  }
  int launching = 0;
  if (!state->compare_exchange_strong(launching, 1)) complete_step(self, st, replica, metrics, id);
}

// Answers a step the engine is done with, then launches the steps that
// waited for it.
void complete_step(WorkerActor::pointer self, const std::shared_ptr<WorkerState>& st, int replica,
                   Metrics* metrics, uint64_t id) {
  auto it = st->pending.find(id);
  if (it == st->pending.end()) return;
  WorkerState::Pending done = std::move(it->second);
  st->pending.erase(it);
  auto out = st->engine->finish(done.ticket);  // throws the step's error: this worker dies
  for (size_t i = 0; i < out.size() && i < done.seqs.size(); ++i)
    if (out[i] >= 0) st->last_sampled[done.seqs[i]] = out[i];
  double factor = 1;
  for (const auto& [fid, slow] : st->slow) factor = std::max(factor, slow.factor);
  if (factor > 1) {
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - done.launched).count();
    const double extra = (factor - 1) * took;
    std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    for (auto& [fid, slow] : st->slow) {
      if (slow.confirmed) continue;
      report(self, slow.reporter, fid, FaultOutcome::Confirmed,
             "a step of replica " + std::to_string(replica) + " took " + ms(took + extra) +
                 " instead of " + ms(took));
      slow.confirmed = true;
    }
  }
  if (st->tuner)
    for (const auto& smp : st->engine->last_samples())
      st->tuner->observe(smp.stage, smp.tokens, smp.seconds);
  if (metrics && !st->shards.empty()) publish_stages(*st->engine, replica, *metrics);
  StepOutput answer{std::move(out), {}, {}};
  const auto& logprobs = st->engine->last_logprobs();
  if (std::any_of(logprobs.begin(), logprobs.end(), [](const auto& l) { return l.has_value(); }))
    answer.logprobs = logprobs;
  const auto& prompt = st->engine->last_prompt_logprobs();
  if (std::any_of(prompt.begin(), prompt.end(), [](const auto& l) { return !l.empty(); }))
    answer.prompt_logprobs = prompt;
  done.promise.deliver(std::move(answer));
  // One loop launches the held steps, however deep the answers nest.
  if (st->launching_held) return;
  st->launching_held = true;
  while (st->pending.empty() && !st->held.empty()) {
    WorkerState::Held next = std::move(st->held.front());
    st->held.pop_front();
    launch_step(self, st, replica, metrics, std::move(next.items), std::move(next.promise));
  }
  st->launching_held = false;
}

}  // namespace

WorkerActor::behavior_type worker(WorkerActor::pointer self, EngineFactory factory, int replica,
                                  Metrics* metrics, ReplicaParts parts) {
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
  for (const MemberActor& m : parts.members) self->link_to(m);
  st->parts = std::move(parts);
  auto spawned = std::make_shared<std::vector<PlacedShard>>();
  st->engine = factory(shard_launcher(self, replica, spawned));
  st->shards = *spawned;
  if (st->engine->stages() > 1) st->tuner = std::make_unique<MicrobatchTuner>(st->engine->stages());
  return {
      [=](step_atom, std::vector<StepItem>& items) -> caf::result<StepOutput> {
        auto rp = self->make_response_promise<StepOutput>();
        if (st->throw_next_step != 0)
          throw std::runtime_error("injected fault: replica " + std::to_string(replica) +
                                   "'s step failed on its device");
        const bool ahead = std::any_of(items.begin(), items.end(),
                                       [](const StepItem& it) { return it.feeds_sampled_token(); });
        if (!st->held.empty() || (ahead && !st->pending.empty())) {
          st->held.push_back({std::move(items), rp});
          return rp;
        }
        launch_step(self, st, replica, metrics, std::move(items), rp);
        return rp;
      },
      [=](stepdone_atom, uint64_t id) { complete_step(self, st, replica, metrics, id); },
      [=](release_atom, uint64_t seq) {
        st->engine->release(seq);
        st->last_sampled.erase(seq);
      },
      [=](fault_atom, const FaultOrder& o, const FaultInjectorActor& reporter) {
        apply_fault(self, *st, replica, o, reporter);
      },
  };
}

}  // namespace troupe
