// The device job queue: order, close semantics (every unstarted job is
// abandoned exactly once, with the first reason), and a plain-thread runner
// whose job throws dies with a message naming the device.
#include <gtest/gtest.h>

#include <atomic>
#include <latch>

#include "gpu/device_queue.h"

namespace troupe {
namespace {

DeviceJob counting(std::vector<int>& ran, std::vector<std::string>& abandoned, int id) {
  return {[&ran, id] { ran.push_back(id); },
          [&abandoned](const std::string& why) { abandoned.push_back(why); }};
}

TEST(DeviceQueue, RunsInOrderAndAbandonsWhatIsLeftWhenClosed) {
  DeviceQueue q;
  std::vector<int> ran;
  std::vector<std::string> abandoned;
  int notified = 0;
  q.set_notify([&] { ++notified; });
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(q.post(counting(ran, abandoned, i)));
  EXPECT_EQ(notified, 4);
  q.try_pop()->run();
  q.try_pop()->run();
  q.close("shard 3 died");
  q.close("second reason is ignored");
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  EXPECT_EQ(abandoned, (std::vector<std::string>{"shard 3 died", "shard 3 died"}));
  EXPECT_FALSE(q.try_pop());
  EXPECT_FALSE(q.wait_pop());
  // Posting to a dead device abandons at once, without notifying.
  EXPECT_FALSE(q.post(counting(ran, abandoned, 9)));
  EXPECT_EQ(abandoned.size(), 3u);
  EXPECT_EQ(notified, 4);
  EXPECT_EQ(q.close_reason(), "shard 3 died");
}

TEST(DeviceQueue, AThreadRunnerWhoseJobThrowsDiesNamingTheDevice) {
  auto q = std::make_shared<DeviceQueue>();
  auto runner = launch_device_thread(2, 1, q);
  std::latch done(1);
  std::atomic<int> abandoned{0};
  q->post({[] { throw std::runtime_error("out of memory"); }, [](const std::string&) {}});
  q->post({[&] { done.count_down(); },
           [&](const std::string&) {
             ++abandoned;
             done.count_down();
           }});
  done.wait();
  q->wait_closed();
  EXPECT_EQ(abandoned.load(), 1);
  EXPECT_EQ(q->close_reason(), "device (stage 2, rank 1) died: out of memory");
  runner.reset();  // joins the thread of a dead device without hanging
}

}  // namespace
}  // namespace troupe
