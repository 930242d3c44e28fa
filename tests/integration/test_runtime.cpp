// The actor runtime through its C++ interface: routing, continuous batching,
// crash recovery by supervision, restart limits, cancellation, overload.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "actors/runtime.h"
#include "gpu/generate.h"
#include "metrics/metrics.h"
#include "support/recording_sink.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::RecordingSink;

std::shared_ptr<const Model> fortune() {
  static auto m = Model::load(test::model_path("fortune"), DType::F32);
  return m;
}

std::vector<int> prompt_for(int i) {
  std::vector<int> p{1};
  for (int k = 0; k < 3 + i % 9; ++k) p.push_back(5 + (i * 131 + k * 17) % 1900);
  return p;
}

CompletionRequest request(uint64_t id, std::vector<int> prompt, int max_tokens,
                          float temperature = 0, uint64_t seed = 0) {
  CompletionRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.top_p = temperature > 0 ? 0.95f : 1.0f;
  r.timeout_s = 120;
  return r;
}

std::vector<int> reference(const std::vector<int>& prompt, int max_tokens, float temperature = 0,
                           uint64_t seed = 0) {
  GenerateRequest g;
  g.prompt = prompt;
  g.max_tokens = max_tokens;
  g.sampling.temperature = temperature;
  g.sampling.seed = seed;
  g.sampling.top_p = temperature > 0 ? 0.95f : 1.0f;
  return generate(*fortune(), 1, g).ids;
}

std::shared_ptr<const Checkpoint> fortune_checkpoint() {
  static auto ck = std::make_shared<const Checkpoint>(load_checkpoint(test::model_path("fortune")));
  return ck;
}

std::shared_ptr<EngineBuilder> engines() {
  return std::make_shared<EngineBuilder>(fortune_checkpoint(), DType::F32);
}

Config config(int replicas) {
  Config c;
  c.model.path = test::model_path("fortune").string();
  c.parallel.replicas = replicas;
  c.devices = {DeviceSpec{DeviceKind::Cpu, 1, 0}};
  c.kv_cache.blocks = 256;
  c.batching.max_batch_sequences = 8;
  c.batching.max_batch_tokens = 256;
  c.batching.prefill_chunk_tokens = 16;  // long prompts prefill over several steps
  c.routing.policy = "least_outstanding";
  return c;
}

TEST(Runtime, ConcurrentGreedyRequestsEqualGenerate) {
  ActorRuntime rt(config(2), engines());
  ASSERT_TRUE(rt.wait_live(2, 30));
  EXPECT_TRUE(rt.ready());
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 32; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    rt.submit(request(uint64_t(i + 1), prompt_for(i), 12 + i % 20), sinks.back());
  }
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(sinks[size_t(i)]->wait()) << i;
    ASSERT_FALSE(sinks[size_t(i)]->error()) << sinks[size_t(i)]->error()->message;
    EXPECT_EQ(sinks[size_t(i)]->tokens(), reference(prompt_for(i), 12 + i % 20)) << "request " << i;
    EXPECT_EQ(sinks[size_t(i)]->violations(), 0);
  }
}

// Scheduling ahead (on or off) and the engine's choice of one thread or
// its pool change when tokens come, never which: greedy and seeded
// requests, some ending by EOS, all give generate()'s tokens.
TEST(Runtime, EveryWayOfSchedulingGivesTheSameTokens) {
  for (bool ahead : {true, false})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(ahead ? "ahead" : "one step at a time") + ", " +
                   std::to_string(threads) + " threads");
      Config c = config(1);
      c.batching.async_scheduling = ahead;
      c.devices = {DeviceSpec{DeviceKind::Cpu, threads, 0}};
      ActorRuntime rt(c, engines());
      ASSERT_TRUE(rt.wait_live(1, 30));
      const int n = 20;
      std::vector<std::shared_ptr<RecordingSink>> sinks;
      for (int i = 0; i < n; ++i) {
        sinks.push_back(std::make_shared<RecordingSink>());
        rt.submit(request(uint64_t(i + 1), prompt_for(i), 40, i % 3 ? 0.8f : 0.0f, uint64_t(i)),
                  sinks.back());
      }
      int short_of_max = 0;
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(sinks[size_t(i)]->wait()) << i;
        ASSERT_FALSE(sinks[size_t(i)]->error()) << sinks[size_t(i)]->error()->message;
        const auto want = reference(prompt_for(i), 40, i % 3 ? 0.8f : 0.0f, uint64_t(i));
        EXPECT_EQ(sinks[size_t(i)]->tokens(), want) << "request " << i;
        EXPECT_EQ(sinks[size_t(i)]->violations(), 0);
        short_of_max += want.size() < 40;
      }
      EXPECT_GT(short_of_max, 0);  // some ended by EOS, with an item planned ahead dropped
    }
}

// A metric's value in a /metrics text (0 when absent).
double metric(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? 0 : std::stod(text.substr(at + series.size() + 2));
}

// Prefix caching changes where a sequence's keys and values come from,
// never what they are: conversations (each turn the last one, its answer
// and a new question) and prompts sharing a long start give the tokens and
// log-probabilities, bit for bit, that computing every prompt gives, in
// every layout and cache type. Some turns run while the turn before them
// still decodes (sharing blocks a live sequence holds).
TEST(Runtime, PrefixCachingChangesNoTokenNorLogprob) {
  struct Layout {
    const char* name;
    int pipeline, tensor;
    DType kv;
  };
  for (const Layout& l :
       {Layout{"one device", 1, 1, DType::F32}, Layout{"two stages", 2, 1, DType::F32},
        Layout{"two shards, f16 cache", 1, 2, DType::F16}}) {
    SCOPED_TRACE(l.name);
    std::vector<std::vector<int>> tokens[2];
    std::vector<std::vector<std::optional<TokenLogprobs>>> logprobs[2];
    double hits = 0;
    for (int caching = 0; caching < 2; ++caching) {
      Config c = config(1);
      c.parallel.pipeline = l.pipeline;
      c.parallel.tensor = l.tensor;
      c.devices.assign(size_t(l.pipeline * l.tensor), DeviceSpec{DeviceKind::Cpu, 1, 0});
      c.kv_cache.dtype = l.kv;
      c.kv_cache.prefix_caching = caching == 1;
      Metrics metrics;
      ActorRuntime rt(c, engines(), &metrics);
      ASSERT_TRUE(rt.wait_live(1, 30));
      std::vector<int> system{1};
      for (int k = 0; k < 37; ++k) system.push_back(40 + (k * 53) % 1800);
      std::vector<std::vector<int>> turns(4, system);
      uint64_t id = 1;
      for (int round = 0; round < 3; ++round) {
        std::vector<std::shared_ptr<RecordingSink>> sinks;
        for (size_t t = 0; t < turns.size(); ++t) {
          for (int k = 0; k < 5 + int(t); ++k)
            turns[t].push_back(7 + int((t * 97 + size_t(round) * 31 + size_t(k) * 13) % 1900));
          auto r = request(id++, turns[t], 12 + 3 * int(t), t % 2 ? 0.8f : 0.0f, t);
          r.sampling.logprobs = 2;
          sinks.push_back(std::make_shared<RecordingSink>());
          rt.submit(r, sinks.back());
          // The next conversation starts while this one runs.
          if (t == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        for (size_t t = 0; t < turns.size(); ++t) {
          ASSERT_TRUE(sinks[t]->wait());
          ASSERT_FALSE(sinks[t]->error()) << sinks[t]->error()->message;
          // A later turn finds at least the system prompt's two full blocks.
          if (!caching) {
            EXPECT_EQ(sinks[t]->cached_tokens(), 0);
          } else if (round > 0) {
            EXPECT_GE(sinks[t]->cached_tokens(), 32);
          }
          tokens[caching].push_back(sinks[t]->tokens());
          logprobs[caching].push_back(sinks[t]->logprobs());
          const auto answer = sinks[t]->tokens();
          turns[t].insert(turns[t].end(), answer.begin(), answer.end());
        }
      }
      hits = metric(metrics.render(), "troupe_prefix_cache_hits_total{replica=\"0\"}");
    }
    ASSERT_EQ(tokens[0].size(), tokens[1].size());
    for (size_t i = 0; i < tokens[0].size(); ++i) {
      EXPECT_EQ(tokens[1][i], tokens[0][i]) << "request " << i;
      ASSERT_EQ(logprobs[1][i].size(), logprobs[0][i].size()) << "request " << i;
      for (size_t k = 0; k < logprobs[0][i].size(); ++k) {
        ASSERT_TRUE(logprobs[0][i][k] && logprobs[1][i][k]);
        EXPECT_EQ(logprobs[1][i][k]->logprob, logprobs[0][i][k]->logprob)
            << "request " << i << " token " << k;
        ASSERT_EQ(logprobs[1][i][k]->top.size(), logprobs[0][i][k]->top.size());
        for (size_t j = 0; j < logprobs[0][i][k]->top.size(); ++j) {
          EXPECT_EQ(logprobs[1][i][k]->top[j].token, logprobs[0][i][k]->top[j].token);
          EXPECT_EQ(logprobs[1][i][k]->top[j].logprob, logprobs[0][i][k]->top[j].logprob);
        }
      }
    }
    // Each later turn finds at least the system prompt's two full blocks.
    EXPECT_GE(hits, 8 * 32.0);
  }
}

TEST(Runtime, ReplicaCrashMidGenerationLosesNothingAndChangesNothing) {
  ActorRuntime rt(config(2), engines());
  ASSERT_TRUE(rt.wait_live(2, 30));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  const int n = 8;
  for (int i = 0; i < n; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    // Half greedy, half seeded sampling: both must replay exactly.
    rt.submit(request(uint64_t(100 + i), prompt_for(i), 60, i % 2 ? 0.9f : 0.0f, 7 + uint64_t(i)),
              sinks.back());
  }
  ASSERT_TRUE(sinks[0]->wait_tokens(3));
  rt.inject_crash(0);
  rt.inject_crash(1);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(sinks[size_t(i)]->wait()) << i;
    ASSERT_FALSE(sinks[size_t(i)]->error()) << sinks[size_t(i)]->error()->message;
    EXPECT_EQ(sinks[size_t(i)]->tokens(),
              reference(prompt_for(i), 60, i % 2 ? 0.9f : 0.0f, 7 + uint64_t(i)))
        << "request " << i;
    EXPECT_EQ(sinks[size_t(i)]->violations(), 0);
  }
  const auto st = rt.replica_status();
  EXPECT_EQ(st[0].restarts + st[1].restarts, 2);
  EXPECT_TRUE(rt.wait_live(2, 30));
}

// Each device of a parallel layout is a shard actor: killing one mid-step
// aborts its group, supervision rebuilds the replica, and every request ends
// with exactly the single-device tokens, for every shard position.
TEST(Runtime, ShardKilledMidStepIsRecoveredBySupervisionWithNoLostRequest) {
  struct Case {
    int replicas, pipeline, tensor, device;
  };
  for (const Case c : {Case{1, 2, 2, 3}, Case{1, 2, 2, 0}, Case{2, 1, 2, 1}, Case{1, 3, 1, 1}}) {
    SCOPED_TRACE("R=" + std::to_string(c.replicas) + " P=" + std::to_string(c.pipeline) +
                 " T=" + std::to_string(c.tensor) + " shard " + std::to_string(c.device));
    Config o = config(c.replicas);
    o.parallel.pipeline = c.pipeline;
    o.parallel.tensor = c.tensor;
    ActorRuntime rt(o, engines());
    ASSERT_TRUE(rt.wait_live(c.replicas, 30));
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    const int n = 6;
    for (int i = 0; i < n; ++i) {
      sinks.push_back(std::make_shared<RecordingSink>());
      rt.submit(request(uint64_t(300 + i), prompt_for(i), 80, i % 2 ? 0.9f : 0.0f, 3 + uint64_t(i)),
                sinks.back());
    }
    // Tokens are flowing on every replica: the kill lands mid-generation.
    ASSERT_TRUE(sinks[0]->wait_tokens(3));
    ASSERT_TRUE(sinks[1]->wait_tokens(3));
    for (int r = 0; r < c.replicas; ++r) rt.inject_shard_crash(r, c.device);
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(sinks[size_t(i)]->wait()) << i;
      ASSERT_FALSE(sinks[size_t(i)]->error()) << sinks[size_t(i)]->error()->message;
      EXPECT_EQ(sinks[size_t(i)]->tokens(),
                reference(prompt_for(i), 80, i % 2 ? 0.9f : 0.0f, 3 + uint64_t(i)))
          << "request " << i;
      EXPECT_EQ(sinks[size_t(i)]->violations(), 0);
    }
    int restarts = 0;
    const int stage = c.device / c.tensor, rank = c.device % c.tensor;
    for (const auto& st : rt.replica_status()) {
      restarts += st.restarts;
      // The replica died because that shard was killed, not for any other reason.
      EXPECT_NE(st.last_death.find("shard (stage " + std::to_string(stage) + ", rank " +
                                   std::to_string(rank) + ")"),
                std::string::npos)
          << st.last_death;
      EXPECT_NE(st.last_death.find("killed mid-step"), std::string::npos) << st.last_death;
    }
    EXPECT_EQ(restarts, c.replicas);
    EXPECT_TRUE(rt.wait_live(c.replicas, 30));
    // The rebuilt group serves as before.
    auto after = std::make_shared<RecordingSink>();
    rt.submit(request(400, prompt_for(7), 20), after);
    ASSERT_TRUE(after->wait());
    EXPECT_EQ(after->tokens(), reference(prompt_for(7), 20));
  }
}

// Stages are placed from measured layer times within each device's memory:
// a first device that holds one layer gets exactly one, and the answer is
// the same.
TEST(Runtime, PipelineStagesRespectDeviceMemory) {
  const auto ckpt = fortune_checkpoint();
  const LayerProfile p = profile_layers(*ckpt, DType::F32, {});
  Config o = config(1);
  o.parallel.pipeline = 2;
  const int64_t kv_per_layer = int64_t(o.kv_cache.blocks) * o.kv_cache.block_tokens * 2 *
                               ckpt->config.kv_dim() * int64_t(sizeof(float));
  o.devices = {DeviceSpec{DeviceKind::Cpu, 1, int64_t(p.weight_bytes[0]) + kv_per_layer + 1024},
               DeviceSpec{DeviceKind::Cpu, 1, 0}};
  ActorRuntime rt(o, engines());
  ASSERT_EQ(rt.stage_layers().size(), 1u);
  EXPECT_EQ(rt.stage_layers()[0], (std::vector<std::pair<int, int>>{{0, 1}, {1, 5}}));
  ASSERT_TRUE(rt.wait_live(1, 30));
  auto sink = std::make_shared<RecordingSink>();
  rt.submit(request(1, prompt_for(3), 30), sink);
  ASSERT_TRUE(sink->wait());
  EXPECT_EQ(sink->tokens(), reference(prompt_for(3), 30));
  // No split fits: start-up says so.
  o.devices = {DeviceSpec{DeviceKind::Cpu, 1, 1024}};
  EXPECT_THROW(ActorRuntime(o, engines()), std::invalid_argument);
}

// A two-stage replica keeps two steps in flight over two groups of
// sequences (so both stages work at once), and the answers do not change.
TEST(Runtime, PipelineKeepsAStepPerStageInFlight) {
  Config o = config(1);
  o.parallel.pipeline = 2;
  Metrics metrics;
  ActorRuntime rt(o, engines(), &metrics);
  ASSERT_TRUE(rt.wait_live(1, 30));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 6; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    auto r = request(uint64_t(500 + i), prompt_for(i), 40);
    r.ignore_eos = true;
    rt.submit(r, sinks.back());
  }
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(sinks[size_t(i)]->wait());
    GenerateRequest g;
    g.prompt = prompt_for(i);
    g.max_tokens = 40;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    EXPECT_EQ(sinks[size_t(i)]->tokens(), generate(*fortune(), 1, g).ids) << i;
  }
  const std::string text = metrics.render();
  const auto at = text.find("troupe_pipeline_steps_total{replica=\"0\",overlapped=\"true\"} ");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stod(text.substr(text.find('}', at) + 2)), 20.0);
}

TEST(Runtime, RestartIntensityLimitKeepsAReplicaDownAndRequestsGet503) {
  auto o = config(1);
  o.supervision.max_restarts = 1;
  o.supervision.within_s = 60;
  ActorRuntime rt(o, engines());
  ASSERT_TRUE(rt.wait_live(1, 30));
  rt.inject_crash(0);  // restart 1 of 1
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(rt.wait_live(1, 30));
  auto sink = std::make_shared<RecordingSink>();
  // Past EOS, so that it is still generating when the crash lands (ended by
  // EOS it could finish first, and the 503 would have nothing to end).
  auto long_one = request(1, prompt_for(1), 200);
  long_one.ignore_eos = true;
  rt.submit(long_one, sink);
  ASSERT_TRUE(sink->wait_tokens(2));
  rt.inject_crash(0);  // over the limit: stays down
  ASSERT_TRUE(sink->wait(30));
  ASSERT_TRUE(sink->error());
  EXPECT_EQ(sink->error()->kind, ServiceErrorKind::Unavailable);
  EXPECT_FALSE(rt.ready());
  EXPECT_TRUE(rt.replica_status()[0].failed);
  auto late = std::make_shared<RecordingSink>();
  rt.submit(request(2, prompt_for(2), 4), late);
  ASSERT_TRUE(late->wait(10));
  ASSERT_TRUE(late->error());
  EXPECT_EQ(late->error()->kind, ServiceErrorKind::Unavailable);
}

TEST(Runtime, CancelEndsTheRequestAndFreesItsBlocks) {
  auto o = config(1);
  o.kv_cache.blocks = 16;  // one full-context sequence (256 tokens / 16)
  ActorRuntime rt(o, engines());
  ASSERT_TRUE(rt.wait_live(1, 30));
  auto sink = std::make_shared<RecordingSink>();
  rt.submit(request(1, prompt_for(3), 250), sink);
  ASSERT_TRUE(sink->wait_tokens(2));
  rt.cancel(1);
  ASSERT_TRUE(sink->wait(10));
  EXPECT_FALSE(sink->error());
  EXPECT_EQ(sink->reason(), FinishReason::Cancelled);
  // Its blocks are back: a request that needs most of the cache runs.
  auto next = std::make_shared<RecordingSink>();
  rt.submit(request(2, prompt_for(4), 200), next);
  ASSERT_TRUE(next->wait(60));
  EXPECT_FALSE(next->error());
  EXPECT_EQ(next->tokens(), reference(prompt_for(4), 200));
}

TEST(Runtime, ACancelledRequestIsNotResumedAfterACrash) {
  ActorRuntime rt(config(1), engines());
  ASSERT_TRUE(rt.wait_live(1, 30));
  auto sink = std::make_shared<RecordingSink>();
  rt.submit(request(1, prompt_for(5), 250), sink);
  ASSERT_TRUE(sink->wait_tokens(2));
  rt.cancel(1);
  rt.inject_crash(0);
  ASSERT_TRUE(sink->wait(30));
  EXPECT_FALSE(sink->error());
  EXPECT_EQ(sink->reason(), FinishReason::Cancelled);
  EXPECT_LT(sink->tokens().size(), 250u);
  EXPECT_EQ(sink->violations(), 0);
}

TEST(Runtime, OverloadIsRefusedWithRetryAfter) {
  auto o = config(1);
  o.batching.max_batch_sequences = 1;
  o.batching.max_waiting = 0;
  o.admission.max_queue = 2;
  ActorRuntime rt(o, engines());
  ASSERT_TRUE(rt.wait_live(1, 30));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 10; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    rt.submit(request(uint64_t(i + 1), prompt_for(i), 30), sinks.back());
  }
  int refused = 0, ok = 0;
  for (auto& s : sinks) {
    ASSERT_TRUE(s->wait());
    if (s->error()) {
      EXPECT_EQ(s->error()->kind, ServiceErrorKind::QueueFull);
      EXPECT_GT(s->error()->retry_after_s, 0);
      ++refused;
    } else {
      ++ok;
    }
  }
  EXPECT_GE(refused, 5);
  EXPECT_GE(ok, 3);
}

TEST(Runtime, DeadlinePassedIsATimeout) {
  ActorRuntime rt(config(1), engines());
  ASSERT_TRUE(rt.wait_live(1, 30));
  // No KV blocks for the next 5 s: the request cannot start before its deadline.
  FaultRequest refuse;
  refuse.order.kind = FaultKind::KvAllocFail;
  refuse.duration_s = 5;
  rt.inject(refuse);
  auto sink = std::make_shared<RecordingSink>();
  // 200 tokens, no early stop: over the deadline even if the refusal has
  // not reached the batcher yet.
  auto r = request(1, prompt_for(1), 200);
  r.ignore_eos = true;
  r.timeout_s = 0.1;
  rt.submit(r, sink);
  ASSERT_TRUE(sink->wait(10));
  ASSERT_TRUE(sink->error());
  EXPECT_EQ(sink->error()->kind, ServiceErrorKind::Timeout);
}

}  // namespace
}  // namespace troupe
