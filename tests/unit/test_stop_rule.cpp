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

// vLLM's stop_token_ids end a sequence as EOS does, even with ignore_eos;
// neither ends one of the first min_tokens tokens.
TEST(StopRule, StopTokenIdsAndMinTokens) {
  const StopRule rule{{2}, 100};
  SamplingParams s;
  s.stop_token_ids = {9, 11};
  for (bool ignore_eos : {false, true}) {
    auto o = rule.judge(11, 3, 50, 10, ignore_eos, s);
    EXPECT_FALSE(o.deliver);
    EXPECT_EQ(o.finish, FinishReason::Stop);
  }
  EXPECT_FALSE(rule.judge(10, 3, 50, 10, false, s).finish);
  s.min_tokens = 4;
  // Tokens 1..4 (3 delivered before the 4th) cannot stop; the 5th can.
  for (int token : {2, 9}) {
    auto o = rule.judge(token, 3, 50, 10, false, s);
    EXPECT_TRUE(o.deliver) << token;
    EXPECT_FALSE(o.finish) << token;
    o = rule.judge(token, 4, 50, 10, false, s);
    EXPECT_FALSE(o.deliver) << token;
    EXPECT_EQ(o.finish, FinishReason::Stop) << token;
  }
  // max_tokens and the context still end it.
  EXPECT_EQ(rule.judge(2, 1, 2, 10, false, s).finish, FinishReason::Length);
}

}  // namespace
}  // namespace troupe
