// The admission queue: priority order, bounds, wait limits (reject / keep),
// removal and the Retry-After suggestion.
#include <gtest/gtest.h>

#include <stdexcept>

#include "scheduler/admission_queue.h"

namespace troupe {
namespace {

AdmissionQueueOptions opts(size_t max_size, size_t levels, double max_wait_s = 0,
                           TimeoutAction action = TimeoutAction::Reject) {
  AdmissionQueueOptions o;
  o.max_size = max_size;
  o.priority_levels = levels;
  o.max_wait_s = max_wait_s;
  o.on_timeout = action;
  return o;
}

std::vector<uint64_t> drain(AdmissionQueue& q, double now_s) {
  std::vector<uint64_t> out;
  while (auto id = q.pop(now_s)) out.push_back(*id);
  return out;
}

TEST(AdmissionQueue, HigherPriorityServedFirst) {
  AdmissionQueue q(opts(10, 3));
  EXPECT_TRUE(q.push(1, 0, 0.0).admitted());
  EXPECT_TRUE(q.push(2, 2, 0.1).admitted());
  EXPECT_TRUE(q.push(3, 1, 0.2).admitted());
  EXPECT_TRUE(q.push(4, 2, 0.3).admitted());
  EXPECT_EQ(drain(q, 1.0), (std::vector<uint64_t>{2, 4, 3, 1}));
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(q.pop(1.0).has_value());
}

TEST(AdmissionQueue, FifoWithinLevel) {
  AdmissionQueue q(opts(100, 1));
  for (uint64_t id = 10; id < 20; ++id) ASSERT_TRUE(q.push(id, 0, double(id)).admitted());
  std::vector<uint64_t> want;
  for (uint64_t id = 10; id < 20; ++id) want.push_back(id);
  EXPECT_EQ(drain(q, 30.0), want);
}

TEST(AdmissionQueue, SizeByPriority) {
  AdmissionQueue q(opts(10, 2));
  q.push(1, 0, 0);
  q.push(2, 1, 0);
  q.push(3, 1, 0);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.size_by_priority(0), 1u);
  EXPECT_EQ(q.size_by_priority(1), 2u);
  EXPECT_EQ(q.size_by_priority(2), 0u);   // not a level
  EXPECT_EQ(q.size_by_priority(-1), 0u);  // not a level
}

TEST(AdmissionQueue, RefusesBeyondGlobalBound) {
  AdmissionQueue q(opts(3, 2));
  EXPECT_TRUE(q.push(1, 0, 0).admitted());
  EXPECT_TRUE(q.push(2, 1, 0).admitted());
  EXPECT_TRUE(q.push(3, 0, 0).admitted());
  // A higher priority does not jump the bound: the queue is bounded memory.
  AdmitResult r = q.push(4, 1, 0);
  EXPECT_EQ(r.status, AdmitStatus::QueueFull);
  EXPECT_FALSE(r.admitted());
  EXPECT_GT(r.retry_after_s, 0);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_FALSE(q.contains(4));
  ASSERT_TRUE(q.pop(0.5).has_value());
  EXPECT_TRUE(q.push(4, 1, 0.5).admitted());
}

TEST(AdmissionQueue, RefusesBeyondLevelBound) {
  AdmissionQueueOptions o = opts(10, 2);
  o.levels = {{0, TimeoutAction::Reject, 1}, {0, TimeoutAction::Reject, 0}};
  AdmissionQueue q(o);
  EXPECT_TRUE(q.push(1, 0, 0).admitted());
  AdmitResult r = q.push(2, 0, 0);
  EXPECT_EQ(r.status, AdmitStatus::LevelFull);
  EXPECT_GT(r.retry_after_s, 0);
  EXPECT_TRUE(q.push(3, 1, 0).admitted());  // the other level still has room
}

TEST(AdmissionQueue, RejectsOutOfRangePriorityInsteadOfClamping) {
  AdmissionQueue q(opts(10, 2));
  EXPECT_EQ(q.push(1, -1, 0).status, AdmitStatus::InvalidPriority);
  EXPECT_EQ(q.push(2, 2, 0).status, AdmitStatus::InvalidPriority);
  EXPECT_EQ(q.push(3, 1000, 0).status, AdmitStatus::InvalidPriority);
  EXPECT_TRUE(q.empty());
  EXPECT_TRUE(q.push(4, 1, 0).admitted());
  EXPECT_EQ(admit_status_name(AdmitStatus::InvalidPriority), "invalid priority");
}

TEST(AdmissionQueue, RefusesDuplicateId) {
  AdmissionQueue q(opts(10, 1));
  EXPECT_TRUE(q.push(7, 0, 0).admitted());
  EXPECT_EQ(q.push(7, 0, 1).status, AdmitStatus::DuplicateId);
  EXPECT_EQ(q.size(), 1u);
}

TEST(AdmissionQueue, RejectActionExpiresAndReturnsIds) {
  AdmissionQueue q(opts(10, 1, /*max_wait_s=*/1.0, TimeoutAction::Reject));
  q.push(1, 0, 0.0);
  q.push(2, 0, 0.5);
  q.push(3, 0, 1.0);
  EXPECT_TRUE(q.expire(0.9).empty());
  EXPECT_EQ(q.expire(1.2), (std::vector<uint64_t>{1}));
  EXPECT_EQ(q.expire(1.6), (std::vector<uint64_t>{2}));
  EXPECT_TRUE(q.expire(1.6).empty());  // handed out once only
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.pop(1.7), std::optional<uint64_t>(3));
}

TEST(AdmissionQueue, PopNeverServesARejectedRequestAndKeepsItsIdForExpire) {
  AdmissionQueue q(opts(10, 1, 1.0, TimeoutAction::Reject));
  q.push(1, 0, 0.0);
  q.push(2, 0, 1.0);
  EXPECT_EQ(q.pop(1.5), std::optional<uint64_t>(2));
  EXPECT_EQ(q.expire(1.5), (std::vector<uint64_t>{1}));
}

TEST(AdmissionQueue, KeepActionServesLateRequestsAfterTimelyOnes) {
  AdmissionQueue q(opts(10, 2, 1.0, TimeoutAction::Keep));
  q.push(1, 0, 0.0);  // will be late
  q.push(2, 0, 1.5);
  q.push(3, 1, 0.0);                   // late too, but a higher level
  EXPECT_TRUE(q.expire(2.0).empty());  // nothing is rejected
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.size_by_priority(0), 2u);
  // A late high-priority request still beats the lower level.
  EXPECT_EQ(drain(q, 2.0), (std::vector<uint64_t>{3, 2, 1}));
}

TEST(AdmissionQueue, WaitLimitsAndActionsArePerLevel) {
  AdmissionQueueOptions o = opts(10, 3);
  o.levels = {{1.0, TimeoutAction::Reject, 0},   // background: dropped after 1 s
              {1.0, TimeoutAction::Keep, 0},     // normal: kept
              {0.0, TimeoutAction::Reject, 0}};  // urgent: no limit
  AdmissionQueue q(o);
  q.push(10, 0, 0);
  q.push(11, 1, 0);
  q.push(12, 2, 0);
  EXPECT_EQ(q.expire(100.0), (std::vector<uint64_t>{10}));
  EXPECT_EQ(drain(q, 100.0), (std::vector<uint64_t>{12, 11}));
}

TEST(AdmissionQueue, ExpiredRequestsFreeTheirSlots) {
  AdmissionQueue q(opts(2, 1, 1.0, TimeoutAction::Reject));
  q.push(1, 0, 0.0);
  q.push(2, 0, 0.0);
  EXPECT_EQ(q.push(3, 0, 0.5).status, AdmitStatus::QueueFull);
  EXPECT_TRUE(q.push(3, 0, 1.5).admitted());
  EXPECT_EQ(q.expire(1.5), (std::vector<uint64_t>{1, 2}));
}

TEST(AdmissionQueue, RemoveTakesOutFreshDelayedAndUncollectedExpired) {
  AdmissionQueueOptions o = opts(10, 2);
  o.levels = {{1.0, TimeoutAction::Reject, 0}, {1.0, TimeoutAction::Keep, 0}};
  AdmissionQueue q(o);
  q.push(1, 0, 0.0);
  q.push(2, 0, 5.0);
  q.push(3, 1, 0.0);
  q.push(4, 1, 5.0);
  q.pop(5.0);                // 1 expires (held for expire()), 3 is delayed; pops 4
  EXPECT_TRUE(q.remove(3));  // delayed
  EXPECT_TRUE(q.remove(2));  // fresh
  EXPECT_TRUE(q.remove(1));  // expired, not yet collected: never reported
  EXPECT_FALSE(q.remove(1));
  EXPECT_FALSE(q.remove(99));
  EXPECT_TRUE(q.empty());
  EXPECT_TRUE(q.expire(5.0).empty());
  EXPECT_FALSE(q.pop(5.0).has_value());
}

TEST(AdmissionQueue, RemoveKeepsOrderOfTheRest) {
  AdmissionQueue q(opts(10, 1));
  for (uint64_t id = 1; id <= 5; ++id) q.push(id, 0, 0);
  EXPECT_TRUE(q.remove(3));
  EXPECT_FALSE(q.contains(3));
  EXPECT_EQ(drain(q, 1), (std::vector<uint64_t>{1, 2, 4, 5}));
}

TEST(AdmissionQueue, RetryAfterFollowsDequeueRate) {
  AdmissionQueueOptions o = opts(20, 1);
  o.min_retry_after_s = 1;
  o.max_retry_after_s = 60;
  AdmissionQueue q(o);
  // No dequeue yet: the queue looks stalled, so the longest suggestion.
  EXPECT_DOUBLE_EQ(q.retry_after_s(0), 60);

  // 10 dequeues per second for 10 s.
  uint64_t id = 0;
  for (int i = 0; i < 100; ++i) {
    const double t = 0.1 * i;
    ASSERT_TRUE(q.push(++id, 0, t).admitted());
    ASSERT_TRUE(q.pop(t).has_value());
  }
  EXPECT_NEAR(q.dequeue_rate(10.0), 10.0, 0.5);
  while (q.size() < 20) ASSERT_TRUE(q.push(++id, 0, 10.0).admitted());
  AdmitResult r = q.push(++id, 0, 10.0);
  ASSERT_EQ(r.status, AdmitStatus::QueueFull);
  // 20 waiting at 10/s: about 2 s to drain.
  EXPECT_NEAR(r.retry_after_s, 2.0, 0.2);

  // A quickly draining queue never suggests less than the minimum.
  AdmissionQueue fast(opts(1, 1));
  for (int i = 0; i < 1000; ++i) {
    fast.push(uint64_t(i), 0, 0.001 * i);
    fast.pop(0.001 * i);
  }
  fast.push(5000, 0, 1.0);
  AdmitResult rf = fast.push(5001, 0, 1.0);
  ASSERT_EQ(rf.status, AdmitStatus::QueueFull);
  EXPECT_DOUBLE_EQ(rf.retry_after_s, 1.0);

  // Long after the last dequeue the rate is zero again: back to the max.
  EXPECT_DOUBLE_EQ(q.retry_after_s(1000.0), 60);
}

TEST(AdmissionQueue, InvalidOptionsNameTheField) {
  auto message = [](AdmissionQueueOptions o) {
    try {
      AdmissionQueue q(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(opts(0, 1)).find("max_queue"), std::string::npos);
  EXPECT_NE(message(opts(1, 0)).find("priority_levels"), std::string::npos);
  AdmissionQueueOptions wrong_levels = opts(4, 2);
  wrong_levels.levels.resize(3);
  EXPECT_NE(message(wrong_levels).find("levels"), std::string::npos);
  AdmissionQueueOptions bad_retry = opts(4, 1);
  bad_retry.min_retry_after_s = 10;
  bad_retry.max_retry_after_s = 1;
  EXPECT_NE(message(bad_retry).find("retry"), std::string::npos);
}

}  // namespace
}  // namespace troupe
