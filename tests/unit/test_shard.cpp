// The shard actor as a device's runner. Destroying the runner is how an
// engine lets go of a device before it frees the device's state, so it must
// return only once the actor has ended: not when the queue closes, which a
// dying shard does first, before it abandons its jobs inside the engine.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>

#include "actors/shard.h"

namespace troupe {
namespace {

TEST(Shard, ItsRunnerReturnsOnceTheActorHasEndedNotWhenItsQueueCloses) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto queue = std::make_shared<DeviceQueue>();
  auto spawned = std::make_shared<std::vector<PlacedShard>>();
  std::unique_ptr<DeviceRunner> runner = shard_launcher(self.ptr(), 0, spawned)(1, 0, queue);
  ASSERT_EQ(spawned->size(), 1u);
  EXPECT_TRUE(shard_of(*spawned, 1, 0));
  EXPECT_FALSE(shard_of(*spawned, 0, 1));
  // The job closes its queue as a dying shard does, then goes on working
  // (as its abandon hooks would, in the engine) until the test releases it.
  std::latch closed(1), release(1), job_done(1);
  std::atomic<bool> runner_gone{false}, gone_while_working{false};
  queue->post({[&] {
                 queue->close("dying");
                 closed.count_down();
                 release.wait();
                 gone_while_working = runner_gone.load();
                 job_done.count_down();
               },
               [](const std::string&) {}});
  closed.wait();
  std::thread stopper([&] {
    runner.reset();
    runner_gone = true;
  });
  // A runner that returns at the close is gone well within this; one that
  // waits for the actor cannot be, whatever the wait.
  for (int i = 0; i < 200 && !runner_gone; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  release.count_down();
  job_done.wait();
  stopper.join();
  EXPECT_FALSE(gone_while_working) << "the runner returned while its shard's job still ran";
  EXPECT_TRUE(queue->closed());
}

}  // namespace
}  // namespace troupe
