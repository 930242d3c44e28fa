// A replica spanning processes, each simulated by an engine of this test
// process with its own Gloo communicators over TCP on 127.0.0.1: the same
// greedy ids, the same seeded samples and logits within 1e-4 as one device,
// in every split (tensor ranks across processes, stages across processes,
// both); steps of two groups in flight; and a peer that is destroyed or
// stays silent fails the step, naming it, within the Gloo timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpu/parallel_engine.h"
#include "gpu/synth_model.h"
#include "support/gloo_comms.h"
#include "support/mixed_steps.h"
#include "support/split_replica.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::contains;
using test::SplitReplica;

struct Split {
  const char* name;
  int pipeline, tensor;
  std::vector<int> host;  // per device, stage-major
};

const std::vector<Split> kSplits = {
    {"TensorRanksAcrossTwo", 1, 2, {0, 1}},
    {"StagesAcrossTwo", 2, 1, {0, 1}},
    {"StagePerProcess", 2, 2, {0, 0, 1, 1}},
    {"TensorRanksAcrossTwoInBothStages", 2, 2, {0, 1, 0, 1}},
    {"ThreeStagesOverThree", 3, 1, {0, 1, 2}},
    // The sampler (host of (1, 0)) is not host 0 and holds part of stage 0.
    {"CrossedRanks", 2, 2, {0, 1, 1, 0}},
    // Two ranks of one group in each process: the sampler's second rank
    // hands over its logits in memory, the other two by message.
    {"TwoTensorRanksPerProcess", 1, 4, {0, 0, 1, 1}},
};

void PrintTo(const Split& split, std::ostream* os) {
  *os << split.name;
}

ParallelEngineOptions options(const Split& split) {
  ParallelEngineOptions o;
  o.pipeline = split.pipeline;
  o.tensor = split.tensor;
  o.blocks = 256;
  o.block_tokens = 4;
  o.placement.host = split.host;
  return o;
}

Checkpoint checkpoint(const std::string& model) {
  if (model == "stories260K")
    return load_checkpoint(test::model_path("stories260K") / "stories260K.bin");
  return synth_checkpoint(synth_preset(model), 3, DType::F32);
}

class AcrossProcesses : public ::testing::TestWithParam<std::tuple<Split, std::string>> {};

TEST_P(AcrossProcesses, SameIdsSamplesAndLogitsAsOneDevice) {
  const auto& [split, model] = GetParam();
  const Checkpoint ck = checkpoint(model);
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 4, 256});
  SplitReplica replica(ck, DType::F32, options(split), test::gloo_comms(10s));
  // With keep_logits every sampled row travels whole; without, greedy items
  // travel as one candidate per rank and sampled ones as rows.
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_logits" : "candidates");
    const test::MixedRun want = test::run_mixed(single, keep, true);
    const test::MixedRun got = test::run_mixed(replica, keep, true);
    EXPECT_EQ(got.ids, want.ids);
    if (keep) {
      EXPECT_LT(test::max_logit_diff(got, want), 1e-4f);
    }
  }
  // Log-probabilities need every rank's whole row, greedy items' too.
  const test::MixedRun want = test::run_mixed(single, false, true, 2);
  const test::MixedRun got = test::run_mixed(replica, false, true, 2);
  EXPECT_EQ(got.ids, want.ids);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t s = 0; s < want.logprobs.size(); ++s) {
    ASSERT_EQ(got.logprobs[s].size(), want.logprobs[s].size());
    for (size_t k = 0; k < want.logprobs[s].size(); ++k) {
      const auto &a = got.logprobs[s][k], &b = want.logprobs[s][k];
      ASSERT_EQ(a.has_value(), b.has_value()) << "sequence " << s << ", token " << k;
      ASSERT_EQ(a.has_value(), s % 3 != 2);
      if (!a) continue;
      EXPECT_NEAR(a->logprob, b->logprob, 1e-4f);
      ASSERT_EQ(a->top.size(), 2u);
      for (size_t j = 0; j < 2; ++j) {
        EXPECT_EQ(a->top[j].token, b->top[j].token);
        EXPECT_NEAR(a->top[j].logprob, b->top[j].logprob, 1e-4f);
      }
    }
  }
  // The prompts' too, from every row of their prefill chunks.
  ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size());
  for (size_t s = 0; s < want.prompt_logprobs.size(); ++s) {
    const auto &a = got.prompt_logprobs[s], &b = want.prompt_logprobs[s];
    ASSERT_EQ(a.size(), s % 3 == 2 ? 0u : 1 + 4 * s) << "sequence " << s;  // all but the first
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < b.size(); ++k) {
      EXPECT_NEAR(a[k].logprob, b[k].logprob, 1e-4f) << "sequence " << s << ", position " << k;
      ASSERT_EQ(a[k].top.size(), 2u);
      EXPECT_EQ(a[k].top[0].token, b[k].top[0].token);
    }
  }
  const EngineStats st = replica.stats();
  ASSERT_EQ(int(st.stages.size()), split.pipeline);
  EXPECT_GT(st.comm_bytes(), 0u);
  EXPECT_GT(st.stages.back().busy_s, 0);
}

INSTANTIATE_TEST_SUITE_P(Splits, AcrossProcesses,
                         ::testing::Combine(::testing::ValuesIn(kSplits),
                                            ::testing::Values("stories260K", "tiny")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::get<1>(info.param);
                         });

// Pipelining across steps with parts in different processes: as many
// groups as stages alternate, each relaunched when its previous step
// finishes while the others are in flight, cut differently step to step.
TEST(AcrossProcessesInFlight, StepsOfSeveralGroupsInFlightGiveTheSingleDeviceIds) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 11, DType::F32);
  const int S = 6, steps = 6;
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 4, 256});
  const auto want = test::decode_in_groups(single, S, 1, steps);
  for (const Split& split : {kSplits[1], kSplits[3], kSplits[4]}) {
    SCOPED_TRACE(split.name);
    SplitReplica replica(ck, DType::F32, options(split), test::gloo_comms(10s));
    EXPECT_EQ(test::decode_in_groups(replica, S, split.pipeline, steps), want);
  }
}

std::vector<StepItem> prompts(test::SlotBook& book, int n) {
  std::vector<StepItem> items;
  for (int s = 0; s < n; ++s) items.push_back(book.next(uint64_t(s), {1, 5 + s, 9, 3}));
  return items;
}

// The CommError a step threw, or "" (and a failure) for anything else.
std::string comm_error_of(ParallelEngine& part, uint64_t ticket) {
  try {
    part.finish(ticket);
    ADD_FAILURE() << "the step survived a lost peer";
  } catch (const CommError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected CommError, got: " << e.what();
  }
  return "";
}

// The survivor's later steps are refused, naming the peer.
void expect_refused(ParallelEngine& part, test::SlotBook& book, const std::string& peer) {
  try {
    part.launch(prompts(book, 2));
    ADD_FAILURE() << "a step was launched on a part that lost its peer";
  } catch (const std::exception& e) {
    EXPECT_TRUE(contains(e.what(), peer)) << e.what();
  }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A peer destroyed while the survivor waits on it (for its activations, its
// readiness to receive, or its collectives): the survivor's step fails
// with a CommError naming the lost process, and so does its next launch.
TEST(AcrossProcessesFailures, APeerDestroyedMidStepFailsTheStepNamingIt) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 7, DType::F32);
  for (const Split& split : {kSplits[0], kSplits[1], kSplits[3]}) {
    for (int victim : {0, 1}) {
      SCOPED_TRACE(std::string(split.name) + ", victim " + test::host_name(victim));
      SplitReplica replica(ck, DType::F32, options(split), test::gloo_comms(10s));
      test::SlotBook book(16);
      replica.step(prompts(book, 3));  // healthy
      ParallelEngine& survivor = replica.part(1 - victim);
      const auto t0 = Clock::now();
      const uint64_t ticket = survivor.launch(prompts(book, 3));
      std::this_thread::sleep_for(50ms);  // the survivor is waiting on the victim
      replica.drop(victim);
      const std::string why = comm_error_of(survivor, ticket);
      EXPECT_TRUE(contains(why, test::host_name(victim))) << why;
      EXPECT_LT(seconds_since(t0), 5.0);
      expect_refused(survivor, book, test::host_name(victim));
    }
  }
}

// Both parts are mid-step (a slow first stage) when one is destroyed.
TEST(AcrossProcessesFailures, APeerDestroyedWhileBothComputeFailsTheOtherNamingIt) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 7, DType::F32);
  ParallelEngineOptions o = options(kSplits[3]);  // tensor ranks across, two stages
  o.stage_delay_s = {0.1, 0};
  o.microbatches = 3;
  SplitReplica replica(ck, DType::F32, o, test::gloo_comms(10s));
  test::SlotBook book(16);
  replica.step(prompts(book, 3));
  const auto items = prompts(book, 3);
  const int m = replica.part(0).microbatches_for(items.size());
  const uint64_t kept = replica.part(0).launch_split(items, m);
  replica.part(1).launch_split(items, m);
  std::this_thread::sleep_for(150ms);  // inside the second micro-batch
  const auto t0 = Clock::now();
  replica.drop(1);
  const std::string why = comm_error_of(replica.part(0), kept);
  EXPECT_TRUE(contains(why, test::host_name(1))) << why;
  EXPECT_LT(seconds_since(t0), 5.0);
}

// A peer that is alive but never takes its share: the step fails at the
// Gloo timeout, naming the process it waited for.
TEST(AcrossProcessesFailures, ASilentPeerFailsTheStepAtTheTimeoutNamingIt) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 7, DType::F32);
  SplitReplica replica(ck, DType::F32, options(kSplits[1]), test::gloo_comms(1500ms));
  test::SlotBook book(16);
  replica.step(prompts(book, 2));
  const auto t0 = Clock::now();
  const uint64_t ticket = replica.part(1).launch(prompts(book, 2));
  const std::string why = comm_error_of(replica.part(1), ticket);
  EXPECT_TRUE(contains(why, "timed out")) << why;
  EXPECT_TRUE(contains(why, test::host_name(0))) << why;
  EXPECT_GE(seconds_since(t0), 1.4);
  EXPECT_LT(seconds_since(t0), 6.0);
}

}  // namespace
}  // namespace troupe
