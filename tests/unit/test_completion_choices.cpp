// CompletionChoices: several choices' exchanges put together into the one
// response a client with `n` asked for, without a socket.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "net/completion_choices.h"
#include "net/sse_parser.h"
#include "support/test_support.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

using nlohmann::json;
using Clock = CompletionChoices::Clock;

const Tokenizer& fortune() {
  static const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  return tok;
}

std::vector<int> ids_of(const std::string& text) {
  return fortune().encode(text, /*add_bos=*/false);
}

openai::CompletionParams params(int n, int max_tokens, bool stream) {
  openai::CompletionParams p;
  p.model = "fortune";
  p.n = n;
  p.max_tokens = max_tokens;
  p.stream = stream;
  return p;
}

const Clock::time_point t0{};
const openai::ResponseMeta kMeta{"cmpl-test", 1700000000, "fortune"};

CompletionChoices choices(const openai::CompletionParams& p) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < p.n; ++i) ids.push_back(100 + uint64_t(i));
  return CompletionChoices(ids, p, kMeta, {ChoicePrompt{4, {}}}, &fortune(), t0);
}

// Choice i's tokens, interleaved with the others' as a batch would send them.
std::vector<ChoicesStep> feed(CompletionChoices& c, const std::vector<std::vector<int>>& texts) {
  std::vector<ChoicesStep> steps;
  for (size_t k = 0;; ++k) {
    bool any = false;
    for (size_t i = 0; i < texts.size(); ++i) {
      if (k >= texts[i].size()) continue;
      any = true;
      steps.push_back(c.on_token(100 + i, texts[i][k], nullptr, t0));
    }
    if (!any) return steps;
  }
}

std::string all_events(const std::vector<ChoicesStep>& steps) {
  std::string out;
  for (const auto& s : steps) out += s.events;
  return out;
}

TEST(CompletionChoices, OneChoiceIsTheExchangeItself) {
  const std::vector<int> ids = ids_of("A fool and his money");
  for (bool stream : {false, true}) {
    openai::CompletionParams p = params(1, int(ids.size()), stream);
    p.include_usage = stream;
    CompletionChoices c = choices(p);
    CompletionExchange ex(100, p, kMeta, 4, &fortune(), t0);
    std::string got, want;
    for (int id : ids) {
      got += c.on_token(100, id, nullptr, t0).events;
      want += ex.on_token(id, nullptr, t0).events;
    }
    const ChoicesStep end = c.on_done(100, FinishReason::Length, 4, 0, t0);
    const ExchangeStep end_ex = ex.on_done(FinishReason::Length, 4, 0, t0);
    got += end.events;
    want += end_ex.events;
    EXPECT_EQ(got, want);
    EXPECT_EQ(end.response.has_value(), end_ex.response.has_value());
    if (end.response) {
      EXPECT_EQ(end.response->body, end_ex.response->body);
    }
    EXPECT_EQ(end.end_stream, end_ex.end_stream);
    ASSERT_TRUE(end.finished);
    EXPECT_EQ(end.finished->status, end_ex.finished->status);
    EXPECT_TRUE(c.finished());
    EXPECT_TRUE(c.running().empty());
  }
}

TEST(CompletionChoices, AWholeResponseListsEveryChoiceOnceAllHaveEnded) {
  const std::vector<std::vector<int>> texts = {ids_of("A fool"), ids_of("Love is blind"),
                                               ids_of("Never")};
  CompletionChoices c = choices(params(3, 8, false));
  for (const ChoicesStep& s : feed(c, texts)) EXPECT_FALSE(s.response || !s.events.empty());
  EXPECT_FALSE(c.on_done(102, FinishReason::Stop, 4, 0, t0).response);  // 2 of 3 still run
  EXPECT_FALSE(c.on_done(100, FinishReason::Length, 4, 0, t0).response);
  EXPECT_EQ(c.running(), std::vector<uint64_t>{101});
  const ChoicesStep last = c.on_done(101, FinishReason::Stop, 5, 0, t0);
  ASSERT_TRUE(last.response);
  ASSERT_TRUE(last.finished);  // the request's, once
  const json j = json::parse(last.response->body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], int(i));
    EXPECT_EQ(j["choices"][i]["text"], fortune().decode(texts[i]));
  }
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][2]["finish_reason"], "stop");
  EXPECT_EQ(j["id"], "cmpl-test");
  // The prompt once (the service's count), the completions summed (an EOS
  // that ended a choice counts, as for one choice).
  const int completion = int(texts[0].size() + texts[1].size() + 1 + texts[2].size() + 1);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion);
  EXPECT_EQ(j["usage"]["total_tokens"], 5 + completion);
  EXPECT_EQ(last.finished->status, 200);
  EXPECT_EQ(last.finished->prompt_tokens, 5);
  EXPECT_EQ(last.finished->completion_tokens, completion);
  EXPECT_TRUE(c.finished());
}

TEST(CompletionChoices, AStreamInterleavesTheChoicesAndEndsOnce) {
  const std::vector<std::vector<int>> texts = {ids_of("A fool and"), ids_of("Love")};
  openai::CompletionParams p = params(2, 8, true);
  p.include_usage = true;
  CompletionChoices c = choices(p);
  std::vector<ChoicesStep> steps = feed(c, texts);
  steps.push_back(c.on_done(101, FinishReason::Stop, 4, 0, t0));
  EXPECT_FALSE(steps.back().end_stream);
  steps.push_back(c.on_done(100, FinishReason::Length, 4, 0, t0));
  EXPECT_TRUE(steps.back().end_stream);
  int heads = 0, ends = 0;
  for (const auto& s : steps) heads += s.start_stream, ends += s.end_stream;
  EXPECT_EQ(heads, 1);
  EXPECT_EQ(ends, 1);
  std::string text[2];
  std::string reasons[2];
  int usages = 0, dones = 0;
  for (const std::string& e : sse_events(all_events(steps))) {
    if (e == "[DONE]") {
      ++dones;
      continue;
    }
    const json j = json::parse(e);
    if (j["choices"].empty()) {
      ++usages;
      EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
      EXPECT_EQ(j["usage"]["completion_tokens"], int(texts[0].size() + texts[1].size() + 1));
      continue;
    }
    const int i = j["choices"][0]["index"];
    text[i] += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) reasons[i] = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(usages, 1);
  EXPECT_EQ(dones, 1);
  EXPECT_EQ(text[0], fortune().decode(texts[0]));
  EXPECT_EQ(text[1], fortune().decode(texts[1]));
  EXPECT_EQ(reasons[0], "length");
  EXPECT_EQ(reasons[1], "stop");
}

TEST(CompletionChoices, AChoiceThatFailsFailsThemAllAndStopsTheOthers) {
  // Before anything was sent: the error's own status.
  {
    CompletionChoices c = choices(params(3, 8, false));
    c.on_done(101, FinishReason::Length, 4, 0, t0);  // ended, not to be stopped
    const ChoicesStep s = c.on_error(100, {ServiceErrorKind::QueueFull, "queue full", 2});
    ASSERT_TRUE(s.response);
    EXPECT_EQ(s.response->status, 429);
    EXPECT_EQ(s.cancel, std::vector<uint64_t>{102});
    ASSERT_TRUE(s.finished);
    EXPECT_EQ(s.finished->status, 429);
    EXPECT_FALSE(s.finished->latency_s);
    EXPECT_TRUE(c.finished());
    EXPECT_TRUE(c.on_token(102, 5, nullptr, t0).events.empty());
  }
  // Once streaming: an error event, [DONE], the end.
  {
    CompletionChoices c = choices(params(2, 8, true));
    feed(c, {ids_of("A fool"), {}});
    const ChoicesStep s = c.on_error(101, {ServiceErrorKind::Timeout, "too slow", 0});
    EXPECT_FALSE(s.response);
    EXPECT_TRUE(s.end_stream);
    const auto ev = sse_events(s.events);
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(json::parse(ev[0])["error"]["status"], 504);
    EXPECT_EQ(ev[1], "[DONE]");
    EXPECT_EQ(s.cancel, std::vector<uint64_t>{100});
  }
  // The server's own failure: the caller stops every running choice itself.
  {
    CompletionChoices c = choices(params(2, 8, false));
    EXPECT_EQ(c.running().size(), 2u);
    openai::ApiError down;
    down.status = 503;
    down.message = "shutting down";
    const ChoicesStep s = c.fail(down);
    EXPECT_TRUE(s.cancel.empty());
    ASSERT_TRUE(s.response);
    EXPECT_EQ(s.response->status, 503);
  }
  // The client going away: the request counts as 499, with what was made.
  {
    CompletionChoices c = choices(params(3, 8, false));
    feed(c, {ids_of("A fool"), {}, {}});
    c.on_done(100, FinishReason::Length, 4, 0, t0);
    const ExchangeFigures f = c.abandon();
    EXPECT_EQ(f.status, 499);
    EXPECT_EQ(f.completion_tokens, int(ids_of("A fool").size()));
    EXPECT_TRUE(c.finished());
  }
}

TEST(CompletionChoices, AStopStringStopsOnlyItsChoice) {
  openai::CompletionParams p = params(2, 16, false);
  p.stop = {"money"};
  CompletionChoices c = choices(p);
  std::vector<uint64_t> cancelled;
  for (const ChoicesStep& s : feed(c, {ids_of("A fool and his money are"), ids_of("Love is")}))
    cancelled.insert(cancelled.end(), s.cancel.begin(), s.cancel.end());
  EXPECT_EQ(cancelled, std::vector<uint64_t>{100});
  EXPECT_EQ(c.running(), std::vector<uint64_t>{101});
  const ChoicesStep s = c.on_done(101, FinishReason::Length, 4, 0, t0);
  ASSERT_TRUE(s.response);
  const json j = json::parse(s.response->body);
  EXPECT_EQ(j["choices"][0]["text"], "A fool and his ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
}

TEST(CompletionChoices, IdsMustMatchN) {
  EXPECT_THROW(
      CompletionChoices({1, 2}, params(3, 8, false), kMeta, {ChoicePrompt{4, {}}}, &fortune(), t0),
      std::invalid_argument);
  EXPECT_THROW(
      CompletionChoices({1, 2}, params(1, 8, false), kMeta, {ChoicePrompt{4, {}}}, &fortune(), t0),
      std::invalid_argument);
}

// A batch: prompt p's choices are p * n .. p * n + n - 1, each continuing its
// own prompt; every prompt counts once in the usage.
TEST(CompletionChoices, ABatchAnswersEachPromptInItsTurn) {
  const std::vector<int> a = ids_of("A fool"), b = ids_of("Love is blind");
  CompletionChoices c({100, 101, 102, 103}, params(2, 8, false), kMeta,
                      {ChoicePrompt{3, a}, ChoicePrompt{5, b}}, &fortune(), t0);
  const std::vector<int> more = ids_of("and");
  feed(c, {more, more, more, more});
  for (uint64_t id : {100, 101, 102})
    EXPECT_FALSE(c.on_done(id, FinishReason::Length, 0, 0, t0).response);
  const ChoicesStep last = c.on_done(103, FinishReason::Length, 0, 0, t0);
  ASSERT_TRUE(last.response);
  const json j = json::parse(last.response->body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], " and") << "after a prompt, the space stays";
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3 + 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4 * int(more.size()));
}

}  // namespace
}  // namespace troupe
