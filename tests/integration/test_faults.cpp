// Faults injected inside the runtime (faults/, actors/fault_injector.h):
// each kind once, with the effect that confirms it, while requests run and
// still end token-exact; and a fault that cannot take effect is recorded as
// failed, not silently dropped.
#include <gtest/gtest.h>

#include <thread>

#include "actors/runtime.h"
#include "gpu/generate.h"
#include "support/recording_sink.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::RecordingSink;

std::shared_ptr<const Checkpoint> checkpoint() {
  static auto ck = std::make_shared<const Checkpoint>(load_checkpoint(test::model_path("fortune")));
  return ck;
}

std::shared_ptr<const Model> model() {
  static auto m = Model::load(test::model_path("fortune"), DType::F32);
  return m;
}

Config config(int replicas, int tensor = 1) {
  Config c;
  c.model.path = test::model_path("fortune").string();
  c.parallel.replicas = replicas;
  c.parallel.tensor = tensor;
  c.devices = {DeviceSpec{DeviceKind::Cpu, 1, 0}};
  c.kv_cache.blocks = 256;
  c.batching.max_batch_sequences = 8;
  c.routing.policy = "least_outstanding";
  return c;
}

std::vector<int> prompt_for(int i) {
  std::vector<int> p{1};
  for (int k = 0; k < 3 + i % 7; ++k) p.push_back(5 + (i * 97 + k * 31) % 1900);
  return p;
}

CompletionRequest request(uint64_t id, int i, int max_tokens) {
  CompletionRequest r;
  r.id = id;
  r.prompt = prompt_for(i);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
  r.sampling.top_p = i % 2 ? 0.95f : 1.0f;
  r.sampling.seed = 11 + uint64_t(i);
  r.timeout_s = 120;
  return r;
}

std::vector<int> reference(int i, int max_tokens) {
  GenerateRequest g;
  const CompletionRequest r = request(0, i, max_tokens);
  g.prompt = r.prompt;
  g.max_tokens = max_tokens;
  g.sampling = r.sampling;
  g.ignore_eos = true;
  return generate(*model(), 1, g).ids;
}

FaultRequest fault(FaultKind kind, int replica = 0) {
  FaultRequest f;
  f.order.kind = kind;
  f.order.replica = replica;
  return f;
}

FaultRequest kill(FaultRole role, int replica = 0, int device = -1) {
  FaultRequest f = fault(FaultKind::Kill, replica);
  f.order.role = role;
  f.order.device = device;
  return f;
}

// Waits until the fault leaves the states that are still in progress (or,
// with `settled`, until it is ended or failed).
FaultEntry wait_for(const ActorRuntime& rt, uint64_t id, double timeout_s = 30,
                    bool settled = false) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    FaultEntry e;
    for (const auto& f : rt.faults())
      if (f.order.id == id) e = f;
    const bool done = settled ? (e.state == FaultState::Ended || e.state == FaultState::Failed)
                              : (e.state != FaultState::Scheduled && e.state != FaultState::Active);
    if (done || std::chrono::steady_clock::now() > end) return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Runs `n` requests while `inject` injects, and checks every one ends with
// the single-device answer.
void expect_exact_under(ActorRuntime& rt, int n, int max_tokens,
                        const std::function<void()>& inject) {
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < n; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    rt.submit(request(uint64_t(1000 + i), i, max_tokens), sinks.back());
  }
  ASSERT_TRUE(sinks[0]->wait_tokens(2));
  inject();
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(sinks[size_t(i)]->wait(60)) << i;
    ASSERT_FALSE(sinks[size_t(i)]->error()) << sinks[size_t(i)]->error()->message;
    EXPECT_EQ(sinks[size_t(i)]->tokens(), reference(i, max_tokens)) << "request " << i;
    EXPECT_EQ(sinks[size_t(i)]->violations(), 0);
  }
}

TEST(Faults, KillsOfEachRoleAreConfirmedByTheReplicasDeathAndLoseNothing) {
  struct Case {
    FaultRole role;
    int tensor;
    int device;
  };
  for (const Case c : {Case{FaultRole::Worker, 1, -1}, Case{FaultRole::Batcher, 1, -1},
                       Case{FaultRole::Shard, 2, 1}}) {
    SCOPED_TRACE(std::string(fault_role_name(c.role)));
    ActorRuntime rt(config(2, c.tensor), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
    ASSERT_TRUE(rt.wait_live(2, 60));
    uint64_t id = 0;
    expect_exact_under(rt, 6, 40, [&] { id = rt.inject(kill(c.role, 0, c.device)).order.id; });
    const FaultEntry e = wait_for(rt, id);
    EXPECT_EQ(e.state, FaultState::Confirmed) << e.error;
    EXPECT_NE(e.effect.find("replica 0 died"), std::string::npos) << e.effect;
    EXPECT_GE(e.detected, e.started);
    ASSERT_TRUE(rt.wait_live(2, 30));
    EXPECT_EQ(rt.replica_status()[0].restarts, 1);
    EXPECT_GE(wait_for(rt, id).recovered, e.detected);
  }
}

TEST(Faults, AStepErrorKillsTheReplicaAndIsConfirmed) {
  ActorRuntime rt(config(2), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(rt.wait_live(2, 60));
  uint64_t id = 0;
  expect_exact_under(rt, 6, 40, [&] { id = rt.inject(fault(FaultKind::StepError, 1)).order.id; });
  const FaultEntry e = wait_for(rt, id);
  EXPECT_EQ(e.state, FaultState::Confirmed) << e.error;
  EXPECT_NE(rt.replica_status()[1].last_death.find("step failed"), std::string::npos)
      << rt.replica_status()[1].last_death;
}

TEST(Faults, SlowStepsAreMeasuredAndEndAfterTheirDuration) {
  ActorRuntime rt(config(1), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(rt.wait_live(1, 60));
  FaultRequest f = fault(FaultKind::Slow);
  f.order.factor = 3;
  f.duration_s = 0.5;
  uint64_t id = 0;
  expect_exact_under(rt, 4, 60, [&] { id = rt.inject(f).order.id; });
  const FaultEntry e = wait_for(rt, id, 30, true);
  EXPECT_EQ(e.state, FaultState::Ended) << e.error;
  EXPECT_NE(e.effect.find("instead of"), std::string::npos) << e.effect;
  EXPECT_GE(e.ended - e.started, 0.5);
  EXPECT_EQ(rt.replica_status()[0].restarts, 0);
}

// A lasting fault lasts its duration across a restart of its replica:
// the new placement refuses KV blocks too, until the fault ends.
TEST(Faults, ALastingFaultOutlivesARestartOfItsReplica) {
  ActorRuntime rt(config(1), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(rt.wait_live(1, 60));
  constexpr double kLasts = 4;
  FaultRequest f = fault(FaultKind::KvAllocFail);
  f.duration_s = kLasts;
  const auto injected = std::chrono::steady_clock::now();
  const uint64_t id = rt.inject(f).order.id;
  const uint64_t killed = rt.inject(kill(FaultRole::Worker)).order.id;
  ASSERT_EQ(wait_for(rt, killed).state, FaultState::Confirmed);
  ASSERT_TRUE(rt.wait_live(1, 30));
  ASSERT_EQ(rt.replica_status()[0].restarts, 1);
  auto sink = std::make_shared<RecordingSink>();
  rt.submit(request(7, 0, 5), sink);
  ASSERT_TRUE(sink->wait(60));
  ASSERT_FALSE(sink->error()) << sink->error()->message;
  EXPECT_EQ(sink->tokens(), reference(0, 5));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - injected).count();
  EXPECT_GE(took, kLasts - 0.1) << "the restarted replica served while the fault lasted";
  EXPECT_EQ(wait_for(rt, id, 30, true).state, FaultState::Ended);
}

TEST(Faults, RefusedKvBlocksStallRequestsWhichThenFinishExactly) {
  ActorRuntime rt(config(1), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(rt.wait_live(1, 60));
  FaultRequest f = fault(FaultKind::KvAllocFail);
  f.duration_s = 0.5;
  uint64_t id = 0;
  expect_exact_under(rt, 6, 40, [&] { id = rt.inject(f).order.id; });
  const FaultEntry e = wait_for(rt, id, 30, true);
  EXPECT_EQ(e.state, FaultState::Ended) << e.error;
  EXPECT_NE(e.effect.find("refused KV blocks"), std::string::npos) << e.effect;
}

TEST(Faults, AFaultThatCannotTakeEffectFails) {
  ActorRuntime rt(config(1), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(rt.wait_live(1, 60));
  // One device: no shard actor to kill.
  FaultEntry e = wait_for(rt, rt.inject(kill(FaultRole::Shard, 0, 3)).order.id);
  EXPECT_EQ(e.state, FaultState::Failed);
  EXPECT_NE(e.error.find("one device"), std::string::npos) << e.error;
  // A lasting fault over an idle replica: no step ran, no effect was seen.
  FaultRequest slow = fault(FaultKind::Slow);
  slow.order.factor = 2;
  slow.duration_s = 0.2;
  e = wait_for(rt, rt.inject(slow).order.id, 30, true);
  EXPECT_EQ(e.state, FaultState::Failed);
  EXPECT_NE(e.error.find("no effect"), std::string::npos) << e.error;
  EXPECT_EQ(rt.replica_status()[0].restarts, 0);
}

// A one-shot fault whose effect did not come within the book's window
// (15 s: no step ran) fails, and is withdrawn from the actor holding it:
// a worker's next step, a shard's. It never fires later: requests after it
// end exactly and no replica restarts. (With a device per replica the
// worker holds a step error; with shard actors the shard does, for a step
// error and for a shard's kill.)
TEST(Faults, AFaultGivenUpOnIsWithdrawnAndNeverFiresLater) {
  ActorRuntime whole(config(1), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ActorRuntime sharded(config(2, 2), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(whole.wait_live(1, 60));
  ASSERT_TRUE(sharded.wait_live(2, 60));
  const uint64_t in_worker = whole.inject(fault(FaultKind::StepError, 0)).order.id;
  const uint64_t in_shard = sharded.inject(fault(FaultKind::StepError, 0)).order.id;
  const uint64_t shard_kill = sharded.inject(kill(FaultRole::Shard, 1, 1)).order.id;
  const auto withdrawn = [](const ActorRuntime& rt, uint64_t id) {
    const FaultEntry e = wait_for(rt, id, 40);
    EXPECT_EQ(e.state, FaultState::Failed) << e.effect;
    EXPECT_NE(e.error.find("no effect seen within 15 s"), std::string::npos) << e.error;
    for (int i = 0; i < 1000; ++i) {  // the withdrawal's answer follows within moments
      for (const FaultEntry& f : rt.faults())
        if (f.order.id == id && f.withdrawn >= 0) return f;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "fault " << id << " was not withdrawn: " << e.error;
    return e;
  };
  EXPECT_NE(withdrawn(whole, in_worker).error.find("its next step will not fail"),
            std::string::npos);
  EXPECT_NE(withdrawn(sharded, in_shard).error.find("will not die in its next step"),
            std::string::npos);
  EXPECT_NE(withdrawn(sharded, shard_kill).error.find("will not die in its next step"),
            std::string::npos);
  expect_exact_under(whole, 4, 20, [] {});
  expect_exact_under(sharded, 6, 20, [] {});
  EXPECT_EQ(whole.replica_status()[0].restarts, 0) << whole.replica_status()[0].last_death;
  for (const ReplicaStatus& r : sharded.replica_status()) EXPECT_EQ(r.restarts, 0) << r.last_death;
  for (const ActorRuntime* rt : {&whole, &sharded})
    for (const FaultEntry& f : rt->faults()) {
      EXPECT_EQ(f.state, FaultState::Failed);
      EXPECT_LT(f.died_late, 0) << f.effect;
    }
}

TEST(Faults, AFaultStartsAtItsTime) {
  ActorRuntime rt(config(1), std::make_shared<EngineBuilder>(checkpoint(), DType::F32));
  ASSERT_TRUE(rt.wait_live(1, 60));
  FaultRequest f = kill(FaultRole::Worker);
  f.at_s = 0.3;
  const FaultEntry added = rt.inject(f);
  EXPECT_EQ(added.state, FaultState::Scheduled);
  const FaultEntry e = wait_for(rt, added.order.id);
  EXPECT_EQ(e.state, FaultState::Confirmed) << e.error;
  EXPECT_GE(e.started - e.added, 0.3);
}

}  // namespace
}  // namespace troupe
