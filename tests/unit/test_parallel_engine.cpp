// Tensor and pipeline layouts give the single device's answer, bit for bit:
// identical greedy ids and logits, for mixed prefill/decode batches.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "gpu/comm/in_process_communicator.h"
#include "gpu/parallel_engine.h"
#include "gpu/synth_model.h"
#include "support/engine_driver.h"
#include "support/test_support.h"

namespace troupe {
namespace {

struct Run {
  std::vector<std::vector<int>> ids;       // per sequence
  std::vector<std::vector<float>> logits;  // per step, sampled items' logits
};

// Five sequences join at different steps; prompts are fed in chunks of 4
// while others decode, then each decodes 6 greedy tokens.
Run drive(StepEngine& engine, bool logits, const ModelConfig& c) {
  const int S = 5, extra = 6;
  test::SlotBook book(engine.kv_blocks() / S);
  engine.keep_logits(logits);
  std::vector<std::vector<int>> prompts(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < 3 + 5 * s; ++i)
      prompts[size_t(s)].push_back(1 + (i * 37 + s * 11) % (c.vocab_size - 1));
  std::vector<size_t> fed(S, 0);
  Run run;
  run.ids.resize(S);
  for (int step = 0; step < 60; ++step) {
    std::vector<StepItem> items;
    std::vector<int> who;
    for (int s = 0; s < S; ++s) {
      if (s > step || int(run.ids[size_t(s)].size()) >= extra) continue;
      if (fed[size_t(s)] < prompts[size_t(s)].size()) {
        const size_t n = std::min<size_t>(4, prompts[size_t(s)].size() - fed[size_t(s)]);
        std::vector<int> chunk(prompts[size_t(s)].begin() + long(fed[size_t(s)]),
                               prompts[size_t(s)].begin() + long(fed[size_t(s)] + n));
        fed[size_t(s)] += n;
        items.push_back(book.next(uint64_t(s), chunk, fed[size_t(s)] == prompts[size_t(s)].size()));
      } else {
        items.push_back(book.next(uint64_t(s), {run.ids[size_t(s)].back()}));
      }
      who.push_back(s);
    }
    if (items.empty()) break;
    const auto out = engine.step(items);
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].sample) run.ids[size_t(who[i])].push_back(out[i]);
    if (logits) run.logits.push_back(engine.last_logits());
  }
  for (int s = 0; s < S; ++s) engine.release(uint64_t(s));
  return run;
}

using Layouts = std::vector<std::pair<int, int>>;  // (pipeline, tensor)

void check_layouts(const Checkpoint& ck, DType dtype = DType::F32, DType kv = DType::F32,
                   const Layouts& layouts = {{1, 2}, {2, 1}, {2, 2}, {3, 1}, {1, 4}}) {
  ParallelEngineOptions one;
  one.blocks = 256;
  one.block_tokens = 4;
  one.kv_dtype = kv;
  ParallelEngine ref(ck, dtype, one);
  const Run want = drive(ref, true, ck.config);
  // The single-device Engine agrees bit for bit with the 1x1 layout.
  Engine single(std::make_shared<Model>(ck, dtype), EngineOptions{1, 4, 256, kv});
  const Run single_run = drive(single, true, ck.config);
  EXPECT_EQ(single_run.ids, want.ids);
  EXPECT_EQ(single_run.logits, want.logits);
  for (auto [P, T] : layouts) {
    ParallelEngineOptions l = one;
    l.pipeline = P;
    l.tensor = T;
    ParallelEngine pe(ck, dtype, l);
    const Run got = drive(pe, true, ck.config);
    EXPECT_EQ(got.ids, want.ids) << "layout P=" << P << " T=" << T;
    // Tensor shards add their row-parallel pieces in the one-device order
    // (sum_in_piece_order), so logits are the same floats, not just close.
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t k = 0; k < got.logits.size(); ++k) {
      ASSERT_EQ(got.logits[k].size(), want.logits[k].size());
      for (size_t i = 0; i < got.logits[k].size(); ++i)
        ASSERT_EQ(got.logits[k][i], want.logits[k][i])
            << "layout P=" << P << " T=" << T << " " << dtype_name(dtype) << ", " << dtype_name(kv)
            << " cache, step " << k << ", logit " << i;
    }
    const auto st = pe.stats();
    EXPECT_EQ(int(st.stages.size()), P);
    EXPECT_EQ(int(st.weight_bytes.size()), P * T);
    if (T > 1) {
      EXPECT_GT(st.stages[0].comm_bytes, 0u);
    }
  }
}

// A GGUF's block-quantized weights are cut into tensor shards (the output
// projections by columns, across q4_K and q6_K blocks) and give the
// single device's logits, in f32 and in bf16.
TEST(ParallelEngine, LayoutsMatchSingleDeviceOnAQuantizedGguf) {
  const Checkpoint ck = load_checkpoint(test::data_path("gguf/llama-q4_k_m.gguf"));
  ASSERT_TRUE(ck.layers[0].w_down.is_blocks());
  check_layouts(ck, DType::F32, DType::F32, {{1, 2}, {1, 4}});
  check_layouts(ck, DType::BF16, DType::BF16, {{1, 2}});
}

// Integer products (model.quantized_products: int8) quantize x per block
// of 32 from each piece's start, and pieces are the same in every layout:
// the shards' logits are the single device's, bit for bit.
TEST(ParallelEngine, LayoutsMatchSingleDeviceWithInt8Products) {
  Checkpoint ck = load_checkpoint(test::data_path("gguf/llama-q4_k_m.gguf"));
  ck.quant_products = QuantProducts::Int8;
  check_layouts(ck, DType::F32, DType::F32, {{1, 2}, {1, 4}});
}

TEST(ParallelEngine, LayoutsMatchSingleDeviceOnStories260K) {
  check_layouts(load_checkpoint(test::model_path("stories260K") / "stories260K.bin"));
}

TEST(ParallelEngine, LayoutsMatchSingleDeviceOnGqaRandomModel) {
  check_layouts(synth_checkpoint(synth_preset("tiny"), 3, DType::F32));  // 8 heads, 2 kv heads
}

// Qwen2's q/k/v biases are cut with their heads.
TEST(ParallelEngine, LayoutsMatchSingleDeviceWithProjectionBiases) {
  ModelConfig c = synth_preset("tiny");
  c.qkv_bias = true;
  check_layouts(synth_checkpoint(c, 6, DType::F32));
}

// Qwen3's per-head q/k norms, on heads of 16 while the hidden size is 64.
TEST(ParallelEngine, LayoutsMatchSingleDeviceWithHeadNorms) {
  ModelConfig c = synth_preset("tiny");
  c.qk_norm = true;
  c.head_dim = 16;
  check_layouts(synth_checkpoint(c, 8, DType::F32));
}

TEST(ParallelEngine, LayoutsMatchSingleDeviceWithBf16Weights) {
  check_layouts(synth_checkpoint(synth_preset("tiny"), 4, DType::F32), DType::BF16);
}

// Each shard rounds its own heads' keys and values as one device would.
TEST(ParallelEngine, LayoutsMatchSingleDeviceWithA16BitKvCache) {
  check_layouts(synth_checkpoint(synth_preset("tiny"), 5, DType::F32), DType::F32, DType::F16);
  check_layouts(load_checkpoint(test::model_path("stories260K") / "stories260K.bin"), DType::BF16,
                DType::BF16);
}

TEST(ParallelEngine, ShardsHoldOnlyTheirSlice) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 3, DType::F32);
  ParallelEngineOptions l;
  l.tensor = 2;
  l.blocks = 64;
  ParallelEngine pe(ck, DType::F32, l);
  const Model whole(ck, DType::F32);
  const auto st = pe.stats();
  ASSERT_EQ(st.weight_bytes.size(), 2u);
  for (size_t b : st.weight_bytes) EXPECT_LT(double(b), 0.6 * double(whole.weight_bytes()));
}

TEST(ParallelEngine, BadLayoutsAreRefusedWithAReason) {
  const auto ck = load_checkpoint(test::model_path("fortune"));  // 6 heads, 2 kv heads, 5 layers
  ParallelEngineOptions l;
  l.tensor = 4;
  try {
    ParallelEngine pe(ck, DType::F32, l);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("6 attention heads"), std::string::npos) << e.what();
  }
  l.tensor = 1;
  l.pipeline = 6;
  try {
    ParallelEngine pe(ck, DType::F32, l);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("5 layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Another backend's devices plug in through the options' factories: the
// engine asks for exactly one shard per device with its slice, and one
// local tensor group per stage; a group of the wrong size is refused.
TEST(ParallelEngine, ShardAndGroupFactoriesAreAskedForEachDeviceAndStage) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 3, DType::F32);
  ParallelEngineOptions l;
  l.pipeline = 3;
  l.tensor = 2;
  l.blocks = 128;
  const ShardFactory cpu = cpu_shards(ck, DType::F32, {1}, l.block_tokens, l.blocks);
  std::vector<std::pair<int, ShardSpec>> built;
  std::vector<std::pair<int, int>> groups;
  std::mutex mu;
  l.shards = [&](const ShardSpec& spec, int device) {
    std::lock_guard<std::mutex> lock(mu);
    built.emplace_back(device, spec);
    return cpu(spec, device);
  };
  l.local_group = [&](int stage, int ranks) {
    groups.emplace_back(stage, ranks);
    return make_in_process_communicators(ranks);
  };
  ParallelEngine pe(ck, DType::F32, l);
  ASSERT_EQ(built.size(), 6u);
  for (size_t i = 0; i < built.size(); ++i) {
    const auto& [device, spec] = built[i];
    EXPECT_EQ(device, int(i));
    EXPECT_EQ(spec.tp_rank, device % 2);
    EXPECT_EQ(spec.tp_size, 2);
    EXPECT_EQ(spec.layer_begin, device / 2);  // three layers, one per stage
    EXPECT_EQ(spec.layer_end, device / 2 + 1);
  }
  EXPECT_EQ(groups, (std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {2, 2}}));
  ParallelEngineOptions one;
  one.blocks = 128;
  ParallelEngine ref(ck, DType::F32, one);
  test::SlotBook a(16), b(16);
  EXPECT_EQ(pe.step({a.next(0, {1, 7, 9}), a.next(1, {1, 4})}),
            ref.step({b.next(0, {1, 7, 9}), b.next(1, {1, 4})}));

  l.local_group = [](int, int) { return make_in_process_communicators(1); };
  try {
    ParallelEngine bad(ck, DType::F32, l);
    FAIL() << "a one-rank group was accepted for a stage of two";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("returned 1 ranks for 2"), std::string::npos) << e.what();
  }
}

// A deliberately slow last stage: the first stage runs ahead by at most
// `credits` micro-batches (back-pressure), and the answer is unchanged.
TEST(ParallelEngine, CreditsBoundInFlightMicroBatchesBehindASlowStage) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 5, DType::F32);
  ParallelEngineOptions l;
  l.pipeline = 3;
  l.microbatches = 6;
  l.credits = 1;
  l.blocks = 128;
  l.stage_delay_s = {0, 0, 0.05};
  ParallelEngine pe(ck, DType::F32, l);
  test::SlotBook book(16);
  std::vector<StepItem> items;
  for (int s = 0; s < 6; ++s) items.push_back(book.next(uint64_t(s), {1, 5 + s, 9}));
  const auto out = pe.step(items);
  const auto st = pe.stats();
  ASSERT_EQ(st.max_in_flight.size(), 2u);
  for (int m : st.max_in_flight) {
    EXPECT_GE(m, 1);
    EXPECT_LE(m, 1);  // never more than the credits
  }
  EXPECT_GT(st.bubble_fraction(0), 0.3);  // the fast stage waited
  ParallelEngineOptions one;
  one.blocks = 128;
  ParallelEngine ref(ck, DType::F32, one);
  EXPECT_EQ(out, ref.step(items));
  // More credits: the producer runs further ahead, still never past the bound.
  l.credits = 3;
  ParallelEngine wide(ck, DType::F32, l);
  EXPECT_EQ(wide.step(items), out);
  EXPECT_LE(wide.stats().max_in_flight[1], 3);
  EXPECT_GE(wide.stats().max_in_flight[1], 2);  // the fast stage did run ahead
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// A device runner that a test can kill: it runs its jobs on a thread until
// told to die, then dies when its next job reaches it, while its peers are
// mid-step (what a crashed shard actor does in the serving runtime).
class KillableRunner : public DeviceRunner {
 public:
  explicit KillableRunner(std::shared_ptr<DeviceQueue> q) : q_(std::move(q)) {
    thread_ = std::thread([this] {
      while (auto job = q_->wait_pop()) {
        if (kill_) {
          q_->close("killed by the test");
          job->abandon("killed by the test");
          return;
        }
        job->run();
      }
    });
  }
  ~KillableRunner() override {
    q_->close("stopped");
    thread_.join();
  }
  std::atomic<bool> kill_{false};

 private:
  std::shared_ptr<DeviceQueue> q_;
  std::thread thread_;
};

std::vector<StepItem> prompts(test::SlotBook& book, int n) {
  std::vector<StepItem> items;
  for (int s = 0; s < n; ++s) items.push_back(book.next(uint64_t(s), {1, 5 + s, 9, 3}));
  return items;
}

// Whichever shard dies, the step fails promptly (no peer waits forever in a
// collective or for activations) with a message naming that shard, and
// every later step fails the same way until the group is rebuilt.
TEST(ParallelEngine, AShardThatDiesMidStepFailsTheStepNamingIt) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 7, DType::F32);
  for (int victim = 0; victim < 4; ++victim) {
    SCOPED_TRACE("shard " + std::to_string(victim));
    std::vector<KillableRunner*> runners;
    DeviceLauncher launcher = [&](int, int, std::shared_ptr<DeviceQueue> q) {
      auto r = std::make_unique<KillableRunner>(std::move(q));
      runners.push_back(r.get());
      return r;
    };
    ParallelEngineOptions l;
    l.pipeline = 2;
    l.tensor = 2;
    l.microbatches = 3;
    l.blocks = 64;
    ParallelEngine pe(ck, DType::F32, l, launcher);
    ASSERT_EQ(runners.size(), 4u);
    test::SlotBook book(16);
    pe.step(prompts(book, 3));  // healthy
    runners[size_t(victim)]->kill_ = true;
    std::vector<StepItem> next;
    for (int s = 0; s < 3; ++s) next.push_back(book.next(uint64_t(s), {7}));
    const std::string who =
        "stage " + std::to_string(victim / 2) + ", rank " + std::to_string(victim % 2);
    try {
      pe.step(next);
      FAIL() << "the step survived a dead shard";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("killed by the test"), std::string::npos) << e.what();
    }
    try {
      pe.step(next);
      FAIL() << "a step ran on a group with a dead shard";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(who), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Pipelining across steps: two groups of sequences alternate, each group's
// next step launched as soon as its previous one finished, while the other
// group's step is still in the pipeline. The ids equal one device's.
TEST(ParallelEngine, StepsOfTwoGroupsInFlightGiveTheSingleDeviceIds) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 11, DType::F32);
  const int S = 6, steps = 8;
  auto prompt = [&](int s) {
    std::vector<int> p;
    for (int i = 0; i < 2 + s; ++i) p.push_back(1 + (i * 29 + s * 13) % (ck.config.vocab_size - 1));
    return p;
  };
  // Reference: one device, one sequence at a time.
  std::vector<std::vector<int>> want(S);
  {
    ParallelEngineOptions one;
    one.blocks = 128;
    ParallelEngine ref(ck, DType::F32, one);
    test::SlotBook book(16);
    for (int s = 0; s < S; ++s) {
      std::vector<int> tokens = prompt(s);
      for (int k = 0; k < steps; ++k) {
        want[size_t(s)].push_back(ref.step({book.next(uint64_t(s), tokens)})[0]);
        tokens = {want[size_t(s)].back()};
      }
    }
  }
  for (const auto& [P, T] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{3, 1}}) {
    SCOPED_TRACE("P=" + std::to_string(P) + " T=" + std::to_string(T));
    ParallelEngineOptions l;
    l.pipeline = P;
    l.tensor = T;
    l.microbatches = 1;
    l.blocks = 128;
    ParallelEngine pe(ck, DType::F32, l);
    const int G = P;  // one group per stage keeps every stage busy
    test::SlotBook book(16);
    std::vector<std::vector<StepItem>> group(static_cast<size_t>(G));
    for (int s = 0; s < S; ++s) group[size_t(s % G)].push_back(book.next(uint64_t(s), prompt(s)));
    std::vector<std::vector<int>> got(S);
    std::deque<std::pair<int, uint64_t>> flight;  // (group, ticket)
    std::vector<int> done(size_t(G), 0);
    // Steps in flight may be cut differently (the tuner's choice when
    // nothing else is in flight, one micro-batch otherwise).
    auto launch = [&](int g) {
      pe.set_microbatches(flight.empty() ? 2 : 1);
      return pe.launch(group[size_t(g)]);
    };
    for (int g = 0; g < G; ++g) flight.emplace_back(g, launch(g));
    while (!flight.empty()) {
      const auto [g, ticket] = flight.front();
      flight.pop_front();
      const auto ids = pe.finish(ticket);
      auto& items = group[size_t(g)];
      for (size_t i = 0; i < items.size(); ++i) {
        got[items[i].seq].push_back(ids[i]);
        items[i] = book.next(items[i].seq, {ids[i]});
      }
      if (++done[size_t(g)] < steps) flight.emplace_back(g, launch(g));
    }
    EXPECT_EQ(got, want);
    for (int s = 0; s < S; ++s) pe.release(uint64_t(s));
    EXPECT_THROW(pe.finish(12345), std::invalid_argument);
  }
}

// Runs `check` on a ParallelEngine of each layout (P, T), 128 blocks of 16.
void for_each_layout(const Checkpoint& ck, const std::vector<std::pair<int, int>>& layouts,
                     const std::function<void(ParallelEngine&)>& check) {
  for (auto [P, T] : layouts) {
    SCOPED_TRACE("P=" + std::to_string(P) + " T=" + std::to_string(T));
    ParallelEngineOptions l;
    l.pipeline = P;
    l.tensor = T;
    l.blocks = 128;
    l.block_tokens = 16;
    ParallelEngine pe(ck, DType::F32, l);
    check(pe);
  }
}

// Log-probabilities are the same floats in every layout, greedy or sampled,
// and asking for them changes nothing of what is sampled.
TEST(ParallelEngine, LogprobsAreTheSameInEveryLayout) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 12, DType::F32);
  const int S = 4, steps = 5;
  // Sequence s: greedy or sampled, with 3, 0 or no alternatives.
  auto sampling = [](int s) {
    SamplingParams p;
    p.temperature = s % 2 ? 0.9f : 0.0f;
    p.seed = uint64_t(s);
    p.logprobs = s == 3 ? -1 : (s == 1 ? 0 : 3);
    return p;
  };
  struct Out {
    std::vector<std::vector<int>> ids;
    std::vector<std::vector<std::optional<TokenLogprobs>>> logprobs;
  };
  auto drive_lp = [&](StepEngine& engine, bool ask) {
    test::SlotBook book(16);
    Out out;
    out.ids.resize(S);
    out.logprobs.resize(S);
    std::vector<StepItem> items;
    for (int s = 0; s < S; ++s) {
      items.push_back(book.next(uint64_t(s), {1 + 7 * s, 2 + s, 3}));
      items.back().sampling = sampling(s);
      if (!ask) items.back().sampling.logprobs = -1;
    }
    for (int k = 0; k < steps; ++k) {
      const auto ids = engine.step(items);
      const auto& lps = engine.last_logprobs();
      EXPECT_EQ(lps.size(), items.size());
      for (int s = 0; s < S; ++s) {
        out.ids[size_t(s)].push_back(ids[size_t(s)]);
        out.logprobs[size_t(s)].push_back(lps.empty() ? std::nullopt : lps[size_t(s)]);
        StepItem next = book.next(uint64_t(s), {ids[size_t(s)]});
        next.sampling = items[size_t(s)].sampling;
        next.generated = k + 1;
        items[size_t(s)] = next;
      }
    }
    for (int s = 0; s < S; ++s) engine.release(uint64_t(s));
    return out;
  };
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 16, 128, DType::F32});
  const Out want = drive_lp(single, true);
  EXPECT_EQ(drive_lp(single, false).ids, want.ids);
  for (int s = 0; s < S; ++s)
    for (int k = 0; k < steps; ++k) {
      const auto& lp = want.logprobs[size_t(s)][size_t(k)];
      ASSERT_EQ(lp.has_value(), s != 3) << s;
      if (!lp) continue;
      EXPECT_LE(lp->logprob, 0.0f);
      ASSERT_EQ(lp->top.size(), s == 1 ? 0u : 3u);
      // Greedy takes the likeliest.
      if (s % 2 == 0) {
        EXPECT_EQ(lp->top[0].token, want.ids[size_t(s)][size_t(k)]);
        EXPECT_EQ(lp->top[0].logprob, lp->logprob);
      }
    }
  for_each_layout(ck, {{1, 1}, {1, 2}, {2, 1}, {2, 2}}, [&](ParallelEngine& pe) {
    const Out got = drive_lp(pe, true);
    EXPECT_EQ(got.ids, want.ids);
    for (int s = 0; s < S; ++s)
      for (int k = 0; k < steps; ++k) {
        const auto& a = got.logprobs[size_t(s)][size_t(k)];
        const auto& b = want.logprobs[size_t(s)][size_t(k)];
        ASSERT_EQ(a.has_value(), b.has_value()) << s << " " << k;
        if (!a) continue;
        EXPECT_EQ(a->logprob, b->logprob) << s << " " << k;
        ASSERT_EQ(a->top.size(), b->top.size());
        for (size_t j = 0; j < a->top.size(); ++j) {
          EXPECT_EQ(a->top[j].token, b->top[j].token);
          EXPECT_EQ(a->top[j].logprob, b->top[j].logprob);
        }
      }
  });
}

// Penalties and bias give the same ids in every layout, and a sequence
// prefilled again with its history (resumed elsewhere, or recomputed)
// continues them exactly.
TEST(ParallelEngine, PenaltiesAreTheSameInEveryLayoutAndResumeExactly) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 12, DType::F32);
  const int S = 3, steps = 10;
  auto sampling = [](int s, bool penalties) {
    SamplingParams p;
    p.temperature = s == 1 ? 0.9f : 0.0f;
    p.seed = uint64_t(s);
    p.logprobs = s == 0 ? 2 : -1;
    if (!penalties) return p;
    p.frequency_penalty = s == 0 ? -2.0f : 0.0f;  // negative: repeats are favoured
    p.presence_penalty = s == 1 ? 1.0f : 0.0f;
    p.repetition_penalty = s == 2 ? 1.8f : 1.0f;
    if (s == 2) p.logit_bias = {{7, 100.0f}};
    return p;
  };
  // Each sequence's prompt, then its first `resume` ids of `from` as if
  // generated before, in one prefill; then decode to `steps` ids.
  using Ids = std::vector<std::vector<int>>;
  auto drive_pen = [&](StepEngine& engine, bool penalties, const Ids& from = {}, int resume = 0) {
    test::SlotBook book(16);
    Ids out(S);
    std::vector<StepItem> items;
    for (int s = 0; s < S; ++s) {
      std::vector<int> tokens = {1 + 7 * s, 2 + s, 3, 2 + s, 1 + 7 * s};
      if (resume > 0)
        out[size_t(s)].assign(from[size_t(s)].begin(), from[size_t(s)].begin() + resume);
      tokens.insert(tokens.end(), out[size_t(s)].begin(), out[size_t(s)].end());
      items.push_back(book.next(uint64_t(s), tokens));
      items.back().sampling = sampling(s, penalties);
      items.back().generated = resume;
      if (items.back().sampling.penalizes()) items.back().history = tokens;
    }
    while (out[0].size() < size_t(steps)) {
      const auto ids = engine.step(items);
      for (int s = 0; s < S; ++s) {
        out[size_t(s)].push_back(ids[size_t(s)]);
        StepItem next = book.next(uint64_t(s), {ids[size_t(s)]});
        next.sampling = items[size_t(s)].sampling;
        next.generated = int(out[size_t(s)].size());
        items[size_t(s)] = next;
      }
    }
    for (int s = 0; s < S; ++s) engine.release(uint64_t(s));
    return out;
  };
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 16, 128, DType::F32});
  const Ids want = drive_pen(single, true);
  const Ids plain = drive_pen(single, false);
  EXPECT_NE(want[0], plain[0]);                    // the penalty moved greedy off its path
  EXPECT_EQ(want[2], std::vector<int>(steps, 7));  // +100 outweighs any repetition penalty
  EXPECT_EQ(drive_pen(single, true, want, 4), want);
  for_each_layout(ck, {{1, 2}, {2, 1}, {2, 2}}, [&](ParallelEngine& pe) {
    EXPECT_EQ(drive_pen(pe, true), want);
    EXPECT_EQ(drive_pen(pe, true, want, 3), want);
    EXPECT_EQ(drive_pen(pe, false), plain);
  });
}

// Prompt log-probabilities (every row of a prefill classified) are what the
// rows give token by token, bit for bit, in one chunk or several, beside
// other sequences, and in every layout.
TEST(ParallelEngine, PromptLogprobsAreTheTokenByTokenOnesInEveryLayout) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 12, DType::F32);
  const int V = ck.config.vocab_size, k = 3;
  const std::vector<std::vector<int>> prompts = {
      {1, 17, 5, 99 % V, 42, 7, 7, 8, 21, 3}, {1, 4}, {1, 9, 9, 2, 30, 11, 6}};
  using Lps = std::vector<std::vector<TokenLogprobs>>;
  // Token by token: each position's row, kept, scored against the next token.
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 16, 128, DType::F32});
  Lps want(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    test::SlotBook book(16);
    single.keep_logits(true);
    for (size_t p = 0; p + 1 < prompts[s].size(); ++p) {
      single.step({book.next(s, {prompts[s][p]})});
      want[s].push_back(token_logprobs(single.last_logits(), prompts[s][p + 1], k));
    }
    single.keep_logits(false);
    single.release(s);
  }
  // Prefills in chunks of `chunk`, the sequences side by side, with a plain
  // one (no prompt log-probabilities) among them.
  auto prefill = [&](StepEngine& engine, size_t chunk) {
    test::SlotBook book(16);
    Lps got(prompts.size());
    std::vector<size_t> fed(prompts.size(), 0);
    for (bool left = true; left;) {
      left = false;
      std::vector<StepItem> items;
      std::vector<size_t> who;
      for (size_t s = 0; s < prompts.size(); ++s) {
        if (fed[s] == prompts[s].size()) continue;
        const size_t n = std::min(chunk, prompts[s].size() - fed[s]);
        std::vector<int> tokens(prompts[s].begin() + long(fed[s]),
                                prompts[s].begin() + long(fed[s] + n));
        fed[s] += n;
        items.push_back(book.next(s, tokens, fed[s] == prompts[s].size()));
        items.back().sampling.prompt_logprobs = k;
        items.back().history = prompts[s];
        who.push_back(s);
        left = left || fed[s] < prompts[s].size();
      }
      items.push_back(book.next(7, {5, 6}, true));  // plain, fed twice
      engine.step(items);
      const auto& lps = engine.last_prompt_logprobs();
      EXPECT_EQ(lps.size(), items.size());
      EXPECT_TRUE(lps.back().empty());
      for (size_t i = 0; i < who.size(); ++i)
        got[who[i]].insert(got[who[i]].end(), lps[i].begin(), lps[i].end());
    }
    for (size_t s = 0; s < prompts.size(); ++s) engine.release(s);
    engine.release(7);
    return got;
  };
  auto expect_same = [&](const Lps& got) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      ASSERT_EQ(got[s].size(), want[s].size()) << "sequence " << s;
      for (size_t p = 0; p < want[s].size(); ++p) {
        EXPECT_EQ(got[s][p].logprob, want[s][p].logprob) << s << " " << p;
        ASSERT_EQ(got[s][p].top.size(), size_t(k));
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(got[s][p].top[size_t(j)].token, want[s][p].top[size_t(j)].token);
          EXPECT_EQ(got[s][p].top[size_t(j)].logprob, want[s][p].top[size_t(j)].logprob);
        }
      }
    }
  };
  for (size_t chunk : {size_t(16), size_t(3)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    expect_same(prefill(single, chunk));
    for_each_layout(ck, {{1, 2}, {2, 1}, {2, 2}},
                    [&](ParallelEngine& pe) { expect_same(prefill(pe, chunk)); });
  }
}

}  // namespace
}  // namespace troupe
