// CompletionStream: a streamed completion read for tokens, usage, errors.
#include <gtest/gtest.h>

#include "net/completion_stream.h"
#include "support/sse_samples.h"

namespace troupe {
namespace {

using Clock = CompletionStream::Clock;

TEST(CompletionStream, UsageCountsAndTimes) {
  const auto t0 = Clock::now();
  CompletionStream cs;
  const std::string s = test::sample_stream(4, true);
  // Token 0 arrives at t0+1ms, the rest at t0+9ms; usage says 4.
  const size_t split = s.find("t1") - 20;
  cs.feed(std::string_view(s).substr(0, split), t0 + std::chrono::milliseconds(1));
  EXPECT_FALSE(cs.done());
  cs.feed(std::string_view(s).substr(split), t0 + std::chrono::milliseconds(9));
  EXPECT_TRUE(cs.done());
  EXPECT_TRUE(cs.error().empty());
  EXPECT_TRUE(cs.has_usage());
  EXPECT_EQ(cs.output_tokens(), 4);
  EXPECT_EQ(cs.counted_tokens(), 4) << "the finish chunk with empty text is no token";
  ASSERT_TRUE(cs.first_token() && cs.last_token());
  EXPECT_EQ(*cs.first_token(), t0 + std::chrono::milliseconds(1));
  EXPECT_EQ(*cs.last_token(), t0 + std::chrono::milliseconds(9));
}

TEST(CompletionStream, UsageWinsOverChunkCount) {
  CompletionStream cs;
  // Two tokens per chunk (a server that coalesces), usage says 6.
  std::string s = test::token_chunk("ab") + test::token_chunk("cd") + test::token_chunk("ef");
  s += "data: {\"choices\":[],\"usage\":{\"completion_tokens\":6}}\n\ndata: [DONE]\n\n";
  cs.feed(s, Clock::now());
  EXPECT_EQ(cs.counted_tokens(), 3);
  EXPECT_EQ(cs.output_tokens(), 6);
}

TEST(CompletionStream, TokenIdsAndNoUsage) {
  CompletionStream cs;
  cs.feed(
      "data: {\"choices\":[{\"text\":\"\",\"token_ids\":[5,6,7]}]}\n\n"
      "data: {\"choices\":[{\"text\":\"x\"}]}\n\n"
      "data: [DONE]\n\n",
      Clock::now());
  EXPECT_TRUE(cs.done());
  EXPECT_FALSE(cs.has_usage());
  EXPECT_EQ(cs.output_tokens(), 4);
}

TEST(CompletionStream, ErrorsInTheStream) {
  CompletionStream a;
  a.feed(test::token_chunk("x") +
             "data: {\"error\":{\"message\":\"replica lost\"}}\n\ndata: [DONE]\n\n",
         Clock::now());
  EXPECT_EQ(a.error(), "stream_error");
  CompletionStream b;
  b.feed("data: {not json\n\n", Clock::now());
  EXPECT_EQ(b.error(), "bad_stream");
  EXPECT_FALSE(b.done());
}

}  // namespace
}  // namespace troupe
