// SseParser: events out of bytes split anywhere.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "net/sse_parser.h"
#include "support/sse_samples.h"
#include "util/rng.h"

namespace troupe {
namespace {

using nlohmann::json;

std::vector<std::string> events_of(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser p;
  std::vector<std::string> out;
  size_t at = 0;
  for (const size_t c : cuts) {
    p.feed(std::string_view(stream).substr(at, c - at),
           [&](const std::string& d) { out.push_back(d); });
    at = c;
  }
  p.feed(std::string_view(stream).substr(at), [&](const std::string& d) { out.push_back(d); });
  return out;
}

TEST(SseParser, SplitAtAnyByte) {
  for (const char* eol : {"\n", "\r\n", "\r"}) {
    std::string stream = test::sample_stream(3, true);
    std::string converted;
    for (const char c : stream) converted += c == '\n' ? std::string(eol) : std::string(1, c);
    const auto whole = events_of(converted, {});
    ASSERT_EQ(whole.size(), 6u) << "3 tokens, finish, usage, [DONE]";
    EXPECT_EQ(whole.back(), "[DONE]");
    EXPECT_EQ(json::parse(whole[0])["choices"][0]["text"], "t0");
    for (size_t cut = 0; cut <= converted.size(); ++cut)
      ASSERT_EQ(events_of(converted, {cut}), whole) << "cut at " << cut;
    std::vector<size_t> every;
    for (size_t i = 1; i < converted.size(); ++i) every.push_back(i);
    EXPECT_EQ(events_of(converted, every), whole);
    Xoshiro256 rng(11);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<size_t> cuts;
      for (size_t at = 0;;) {
        at += 1 + rng.next() % 40;
        if (at >= converted.size()) break;
        cuts.push_back(at);
      }
      ASSERT_EQ(events_of(converted, cuts), whole) << "trial " << trial;
    }
  }
}

TEST(SseParser, FieldsCommentsAndMultilineData) {
  const std::string s =
      ":comment\n"
      "event: completion\n"
      "id: 7\n"
      "data:no-space\n"
      "\n"
      "data: first\n"
      "data:  second keeps one space\n"
      "retry: 100\n"
      "\n"
      "data\n"
      "\n"
      "\n\n"
      "data: never dispatched without a blank line";
  const auto ev = events_of(s, {});
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0], "no-space");
  EXPECT_EQ(ev[1], "first\n second keeps one space");
  EXPECT_EQ(ev[2], "");
  EXPECT_EQ(sse_events(s), ev);
}

TEST(SseParser, WholeBody) {
  EXPECT_EQ(sse_events(""), std::vector<std::string>{});
  EXPECT_EQ(sse_events("data: a\n\ndata: [DONE]\n\n"), (std::vector<std::string>{"a", "[DONE]"}));
  EXPECT_EQ(sse_events("data: unterminated\n"), std::vector<std::string>{});
}

}  // namespace
}  // namespace troupe
