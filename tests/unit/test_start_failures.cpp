#include <gtest/gtest.h>

#include "scheduler/start_failures.h"

namespace troupe {
namespace {

TEST(StartFailures, EachFailureInARowWaitsTwiceAsLongUpToTheCap) {
  StartFailures f({0.2, 1.0, 30.0});
  EXPECT_TRUE(f.may_try(0.0));
  f.failed(1, 10.0);
  EXPECT_FALSE(f.may_try(10.19));
  EXPECT_TRUE(f.may_try(10.2));
  f.failed(1, 10.2);
  EXPECT_FALSE(f.may_try(10.59));
  EXPECT_TRUE(f.may_try(10.6));
  f.failed(1, 10.6);
  EXPECT_TRUE(f.may_try(11.4));
  f.failed(1, 11.4);  // 1.6 s, capped at 1
  EXPECT_FALSE(f.may_try(12.39));
  EXPECT_TRUE(f.may_try(12.4));
  EXPECT_EQ(f.in_a_row(), 4);
  // A start that succeeds: the next failure waits the first delay again.
  f.started();
  f.failed(2, 20.0);
  EXPECT_TRUE(f.may_try(20.2));
  EXPECT_EQ(f.in_a_row(), 1);
}

TEST(StartFailures, NodesThatFailedArePassedOverForAWhile) {
  StartFailures f({0.1, 1.0, 30.0});
  EXPECT_TRUE(f.avoid(0.0).empty());
  f.failed(3, 1.0);
  f.failed(5, 20.0);
  EXPECT_EQ(f.avoid(20.0), (std::set<int>{3, 5}));
  f.started();  // kept: the node failed, whatever came after elsewhere
  EXPECT_EQ(f.avoid(30.9), (std::set<int>{3, 5}));
  EXPECT_EQ(f.avoid(31.0), (std::set<int>{5}));
  f.failed(3, 40.0);  // failed again: passed over again, for another 30 s
  EXPECT_EQ(f.avoid(45.0), (std::set<int>{3, 5}));
  EXPECT_EQ(f.avoid(55.0), (std::set<int>{3}));
  EXPECT_TRUE(f.avoid(70.0).empty());
}

// A node that joins has failed no start: the replica need not wait out the
// backoff its failures elsewhere built up to be tried there.
TEST(StartFailures, ANodeJoiningEndsTheWait) {
  StartFailures f;
  for (int i = 0; i < 6; ++i) f.failed(1, 10);
  EXPECT_FALSE(f.may_try(11));
  f.node_joined();
  EXPECT_TRUE(f.may_try(11));
  EXPECT_EQ(f.avoid(11), std::set<int>{1});  // the small node is still passed over
  f.failed(2, 11);
  EXPECT_FALSE(f.may_try(11.1));  // and a failure there waits as long as the run says
  EXPECT_GT(f.next_try(), 15.9);
}

}  // namespace
}  // namespace troupe
