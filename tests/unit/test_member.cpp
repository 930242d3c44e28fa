// A part of a replica spanning nodes (actors/member.h): the leader's steps
// reach it through the coordinator, numbered; one that came twice is run
// once, and one lost on the way fails the part at once (the leader would
// otherwise wait for it in a collective until the timeout).
#include <gtest/gtest.h>

#include <atomic>
#include <caf/all.hpp>

#include "actors/member.h"
#include "actors/wire.h"

namespace troupe {
namespace {

// Counts the steps it is given; each is done at once.
class CountingEngine : public StepEngine {
 public:
  explicit CountingEngine(std::shared_ptr<std::atomic<int>> steps) : steps_(std::move(steps)) {
    config_.vocab_size = 32;
    config_.max_seq_len = 64;
  }
  const ModelConfig& config() const override { return config_; }
  int kv_blocks() const override { return 8; }
  int block_tokens() const override { return 16; }
  uint64_t launch(std::vector<StepItem>, std::function<void()> on_done) override {
    ++*steps_;
    if (on_done) on_done();
    return ++tickets_;
  }
  std::vector<int> finish(uint64_t) override { return {}; }
  void release(uint64_t) override {}
  EngineStats stats() const override { return {}; }
  std::vector<StageSample> last_samples() const override { return {}; }

 private:
  ModelConfig config_;
  std::shared_ptr<std::atomic<int>> steps_;
  uint64_t tickets_ = 0;
};

std::vector<StepItem> one_item() {
  StepItem it;
  it.seq = 7;
  it.tokens = {3, 4};
  it.blocks = {0};
  return {it};
}

TEST(Member, RunsEachNumberedStepOnceAndDiesOfALostOne) {
  caf::actor_system_config cfg;
  register_wire_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto steps = std::make_shared<std::atomic<int>>(0);
  EngineFactory factory = [steps](const DeviceLauncher&) {
    return std::make_unique<CountingEngine>(steps);
  };
  auto m = self->spawn<caf::monitored>(member, factory, 0, "part 1", StepLimits{});
  self->send(m, build_atom::value);
  self->send(m, step_atom::value, one_item(), 1, uint64_t(1));
  self->send(m, step_atom::value, one_item(), 1, uint64_t(1));  // again: already ran
  self->send(m, step_atom::value, one_item(), 1, uint64_t(2));
  self->send(m, step_atom::value, one_item(), 1, uint64_t(4));  // 3 was lost
  std::string reason;
  self->receive([&](caf::down_msg& dm) { reason = sys.render(dm.reason); });
  EXPECT_EQ(steps->load(), 2);
  EXPECT_NE(reason.find("a step from the leader was lost on the way (expected step 3, got 4)"),
            std::string::npos)
      << reason;
}

}  // namespace
}  // namespace troupe
