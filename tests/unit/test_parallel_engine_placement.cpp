// A replica's parts placed in several "processes" without sockets: the
// cross-process communicators are in-process groups here (the Gloo ones are
// in tests/integration/test_parallel_engine_across_processes.cpp), so this
// checks the parts' protocol alone: the same ids as one device, and a
// placement that cannot work refused with a reason.
#include <gtest/gtest.h>

#include "gpu/parallel_engine.h"
#include "gpu/synth_model.h"
#include "support/mixed_steps.h"
#include "support/split_replica.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::contains;

ParallelEngineOptions layout(int P, int T, std::vector<int> host) {
  ParallelEngineOptions o;
  o.pipeline = P;
  o.tensor = T;
  o.blocks = 256;
  o.block_tokens = 4;
  o.placement.host = std::move(host);
  return o;
}

TEST(ParallelEnginePlacement, PartsOverInProcessChannelsGiveTheSingleDeviceAnswer) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 3, DType::F32);
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 4, 256});
  const test::MixedRun want = test::run_mixed(single, true, true);
  for (const auto& o : {layout(2, 2, {0, 1, 1, 0}), layout(3, 1, {0, 1, 0})}) {
    test::SplitReplica replica(ck, DType::F32, o, test::in_process_comms());
    const test::MixedRun got = test::run_mixed(replica, true, true);
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_LT(test::max_logit_diff(got, want), 1e-4f);
  }
}

TEST(ParallelEnginePlacement, PartsOverInProcessChannelsKeepStepsOfThreeGroupsInFlight) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 11, DType::F32);
  Engine single(std::make_shared<Model>(ck, DType::F32), EngineOptions{1, 4, 256});
  test::SplitReplica replica(ck, DType::F32, layout(3, 1, {0, 1, 0}), test::in_process_comms());
  EXPECT_EQ(test::decode_in_groups(replica, 6, 3, 6), test::decode_in_groups(single, 6, 1, 6));
}

// The reason a part refuses to be built, or "" (and a failure).
std::string refusal(ParallelEngineOptions o) {
  const auto ck = synth_checkpoint(synth_preset("tiny"), 3, DType::F32);
  try {
    ParallelEngine part(ck, DType::F32, std::move(o));
    ADD_FAILURE() << "the placement was accepted";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelEnginePlacement, AnIncompletePlacementIsRefusedWithAReason) {
  EXPECT_TRUE(contains(refusal(layout(2, 1, {0, 1, 1})), "3 hosts for 2 devices"));
  auto elsewhere = layout(2, 1, {0, 1});
  elsewhere.placement.this_host = 2;
  EXPECT_TRUE(contains(refusal(elsewhere), "host 2 holds none"));
  EXPECT_TRUE(contains(refusal(layout(1, 2, {0, 1})), "stage 0's tensor group spans processes"));
  EXPECT_TRUE(contains(refusal(layout(2, 1, {0, 1})), "boundary after stage 0"));
  // A factory that hands out the wrong rank.
  auto wrong = layout(1, 2, {0, 1});
  wrong.placement.tensor_group = [](int, int) {
    return std::unique_ptr<Communicator>(make_in_process_group(2)[1].release());
  };
  EXPECT_TRUE(contains(refusal(wrong), "tensor_group(stage 0, rank 0) did not return rank 0"));
}

}  // namespace
}  // namespace troupe
