// The access log's line: who, what, the status, the time, and a completion's figures.
#include <gtest/gtest.h>

#include "net/access_log.h"

namespace troupe {
namespace {

TEST(AccessLog, ALineSaysWhoWhatStatusAndTime) {
  EXPECT_EQ(access_line({"127.0.0.1:5000", "GET /health", 200, 0.00012, nullptr, ""}),
            "127.0.0.1:5000 \"GET /health\" 200 0.1 ms");
  EXPECT_EQ(access_line({"", "", 503, 0, nullptr, ""}), "- \"-\" 503 0.0 ms")
      << "refused before a request was read";
}

TEST(AccessLog, ACompletionAddsItsTokensAndFirstToken) {
  ExchangeFigures f;
  f.status = 200;
  f.prompt_tokens = 12;
  f.completion_tokens = 32;
  f.ttft_s = 0.0123;
  EXPECT_EQ(access_line({"[::1]:7", "POST /v1/completions", 200, 0.2105, &f, "cmpl-7"}),
            "[::1]:7 \"POST /v1/completions\" 200 210.5 ms, prompt 12, completion 32 tokens, "
            "first token 12.3 ms, id cmpl-7");
  f.ttft_s.reset();
  f.completion_tokens = 0;
  EXPECT_EQ(access_line({"a:1", "POST /v1/chat/completions", 499, 1.5, &f, ""}),
            "a:1 \"POST /v1/chat/completions\" 499 1500.0 ms, prompt 12, completion 0 tokens");
}

}  // namespace
}  // namespace troupe
