// Continuous batching decisions, with deterministic inputs.
#include <gtest/gtest.h>

#include "scheduler/batch_policy.h"

namespace troupe {
namespace {

BatchLimits limits(int seqs, int tokens, int chunk) {
  return {seqs, tokens, chunk};
}

TEST(BatchPolicy, DecodersFirstThenPrefillChunksThenAdmission) {
  ContinuousBatchPolicy p(limits(8, 100, 40), 16);
  // Running: one in prefill (90 left), two decoding; waiting: two prompts.
  std::vector<SeqView> running{{1, 90, 10, 1}, {2, 1, 20, 2}, {3, 1, 33, 3}};
  std::vector<SeqView> waiting{{4, 50, 0, 0}, {5, 10, 0, 0}};
  const auto plan = p.plan(running, waiting, 100);
  ASSERT_GE(plan.entries.size(), 4u);
  EXPECT_EQ(plan.entries[0].id, 2u);
  EXPECT_EQ(plan.entries[1].id, 3u);
  EXPECT_EQ(plan.entries[2].id, 1u);
  EXPECT_EQ(plan.entries[2].tokens, 40);  // one chunk
  // 100 - 2 - 40 = 58 left: request 4 gets a 40-token chunk, then 18 for 5.
  EXPECT_EQ(plan.entries[3].id, 4u);
  EXPECT_EQ(plan.entries[3].tokens, 40);
  ASSERT_EQ(plan.entries.size(), 5u);
  EXPECT_EQ(plan.entries[4].tokens, 10);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(plan.tokens, 2 + 40 + 40 + 10);
  EXPECT_TRUE(plan.preempted.empty());
}

TEST(BatchPolicy, SequenceAndTokenLimitsHold) {
  ContinuousBatchPolicy p(limits(2, 5, 512), 16);
  std::vector<SeqView> waiting{{1, 3, 0, 0}, {2, 3, 0, 0}, {3, 3, 0, 0}};
  const auto plan = p.plan({}, waiting, 100);
  ASSERT_EQ(plan.entries.size(), 2u);
  EXPECT_EQ(plan.entries[0].tokens, 3);
  EXPECT_EQ(plan.entries[1].tokens, 2);  // the rest of the token budget
  EXPECT_EQ(plan.tokens, 5);
}

TEST(BatchPolicy, AdmissionKeepsABlockPerRunningSequenceAndPreservesOrder) {
  ContinuousBatchPolicy p(limits(8, 1000, 512), 16);
  std::vector<SeqView> running{{1, 1, 16, 1}, {2, 1, 16, 1}};  // each needs a new block
  std::vector<SeqView> waiting{{3, 40, 0, 0}, {4, 5, 0, 0}};
  // 5 free: decoders take 2, 3 left; request 3 needs 3 blocks but 2 must stay
  // free for the running ones' growth... they already got theirs, so
  // watermark 2 leaves 1: request 3 (3 blocks) waits, and 4 may not jump it.
  const auto plan = p.plan(running, waiting, 5);
  EXPECT_EQ(plan.entries.size(), 2u);
  EXPECT_TRUE(plan.admitted.empty());
}

TEST(BatchPolicy, PreemptsTheNewestWhenNothingFits) {
  ContinuousBatchPolicy p(limits(8, 1000, 512), 16);
  // Both decoders need a new block; none free.
  std::vector<SeqView> running{{1, 1, 32, 2}, {2, 1, 48, 3}};
  const auto plan = p.plan(running, {}, 0);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
  ASSERT_EQ(plan.entries.size(), 1u);
  EXPECT_EQ(plan.entries[0].id, 1u);
}

// A pipeline's group of sequences: the step takes at most its share, and
// sequences busy in other steps in flight keep their reserve block.
TEST(BatchPolicy, GroupCapAndBusySequencesReserve) {
  ContinuousBatchPolicy p(limits(8, 1000, 512), 16);
  std::vector<SeqView> running{{1, 1, 8, 1}, {2, 1, 8, 1}, {3, 1, 8, 1}};
  std::vector<SeqView> waiting{{4, 5, 0, 0}, {5, 5, 0, 0}};
  auto plan = p.plan(running, waiting, 100, 2);
  ASSERT_EQ(plan.entries.size(), 2u);
  EXPECT_EQ(plan.entries[0].id, 1u);
  EXPECT_EQ(plan.entries[1].id, 2u);
  EXPECT_TRUE(plan.admitted.empty());
  // The cap never exceeds the limit.
  EXPECT_EQ(p.plan(running, waiting, 100, 50).entries.size(), 5u);
  // Nothing running here, 4 busy elsewhere, 4 blocks free: a newcomer
  // needing 1 block would leave 3 for 4 busy sequences, so it waits ...
  plan = p.plan({}, {{6, 5, 0, 0}}, 4, 0, 4);
  EXPECT_TRUE(plan.entries.empty());
  // ... and is admitted once the reserve is there.
  plan = p.plan({}, {{6, 5, 0, 0}}, 5, 0, 4);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{6}));
}

TEST(BatchPolicy, EmptyAndBadLimits) {
  ContinuousBatchPolicy p(limits(4, 64, 16), 16);
  EXPECT_TRUE(p.plan({}, {}, 10).entries.empty());
  EXPECT_THROW(ContinuousBatchPolicy(limits(0, 64, 16), 16), std::invalid_argument);
  EXPECT_THROW(ContinuousBatchPolicy(limits(4, 64, 16), 0), std::invalid_argument);
  // A lone prompt larger than the free blocks still gets a first chunk when
  // nothing else runs (otherwise it could never start).
  const auto plan = p.plan({}, {{9, 100, 0, 0}}, 1);
  ASSERT_EQ(plan.entries.size(), 1u);
  EXPECT_EQ(plan.entries[0].tokens, 16);
}

}  // namespace
}  // namespace troupe
