#include <gtest/gtest.h>

#include "service/stop_rule.h"

namespace troupe {
namespace {

TEST(StopRule, EosMaxTokensAndContext) {
  const StopRule rule{{2, 3}, 10};
  // EOS: not delivered, ends with Stop, unless ignored.
  auto o = rule.judge(3, 0, 5, 4, false);
  EXPECT_FALSE(o.deliver);
  EXPECT_EQ(o.finish, FinishReason::Stop);
  o = rule.judge(3, 0, 5, 4, true);
  EXPECT_TRUE(o.deliver);
  EXPECT_FALSE(o.finish);
  // The token that reaches max_tokens is delivered and ends it.
  o = rule.judge(7, 4, 5, 8, false);
  EXPECT_TRUE(o.deliver);
  EXPECT_EQ(o.finish, FinishReason::Length);
  // No room to feed the token back: delivered, then Length.
  o = rule.judge(7, 1, 50, 10, false);
  EXPECT_TRUE(o.deliver);
  EXPECT_EQ(o.finish, FinishReason::Length);
  o = rule.judge(7, 1, 50, 9, false);
  EXPECT_FALSE(o.finish);
}

}  // namespace
}  // namespace troupe
