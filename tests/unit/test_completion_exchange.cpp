// CompletionExchange: the service's events in, the bytes for the client and
// the figures for /metrics out, without a socket.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "metrics/metrics.h"
#include "net/completion_exchange.h"
#include "net/sse_parser.h"
#include "support/test_support.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

using nlohmann::json;
using Clock = CompletionExchange::Clock;
using std::chrono::milliseconds;

const Tokenizer& fortune() {
  static const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  return tok;
}

// Generated ids: the text's pieces without BOS, as a model would produce them.
std::vector<int> ids_of(const std::string& text) {
  return fortune().encode(text, /*add_bos=*/false);
}

openai::CompletionParams params(int max_tokens, bool stream) {
  openai::CompletionParams p;
  p.model = "fortune";
  p.max_tokens = max_tokens;
  p.stream = stream;
  return p;
}

openai::ResponseMeta meta() {
  return {"cmpl-test", 1700000000, "fortune"};
}

const Clock::time_point t0{};

CompletionExchange exchange(openai::CompletionParams p, const Tokenizer* tok = &fortune()) {
  return CompletionExchange(7, std::move(p), meta(), /*prompt_tokens=*/4, tok, t0);
}

// Feeds `ids` one per millisecond from t0 + 10 ms; returns the steps.
std::vector<ExchangeStep> feed(CompletionExchange& ex, const std::vector<int>& ids) {
  std::vector<ExchangeStep> steps;
  for (size_t i = 0; i < ids.size(); ++i)
    steps.push_back(ex.on_token(ids[i], nullptr, t0 + milliseconds(10 + int(i))));
  return steps;
}

// The JSON payloads of the events in `steps`, in order.
std::vector<std::string> events(const std::vector<ExchangeStep>& steps) {
  std::string all;
  for (const auto& s : steps) all += s.events;
  return sse_events(all);
}

bool nothing(const ExchangeStep& s) {
  return !s.cancel_service && !s.response && !s.start_stream && s.events.empty() && !s.end_stream &&
         !s.finished;
}

TEST(CompletionExchange, NonStreamingAnswersOnceWithTextUsageAndFigures) {
  const std::string text = " The meaning of life is a fool";
  const std::vector<int> ids = ids_of(text);
  ASSERT_GE(ids.size(), 4u);
  CompletionExchange ex = exchange(params(int(ids.size()), false));
  for (const ExchangeStep& s : feed(ex, ids)) EXPECT_TRUE(nothing(s));
  const ExchangeStep done = ex.on_done(FinishReason::Length, 5, 0, t0 + milliseconds(100));
  ASSERT_TRUE(done.response);
  EXPECT_FALSE(done.start_stream || done.end_stream || done.cancel_service);
  EXPECT_TRUE(done.ends_response());
  EXPECT_EQ(done.response->status, 200);
  EXPECT_EQ(done.response->content_type, "application/json");
  const json j = json::parse(done.response->body);
  EXPECT_EQ(j["id"], "cmpl-test");
  EXPECT_EQ(j["choices"][0]["text"], fortune().decode(ids));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5) << "the service's count wins";
  EXPECT_EQ(j["usage"]["completion_tokens"], int(ids.size()));

  ASSERT_TRUE(done.finished);
  const ExchangeFigures& f = *done.finished;
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(f.prompt_tokens, 5);
  EXPECT_EQ(f.completion_tokens, int(ids.size()));
  EXPECT_DOUBLE_EQ(*f.ttft_s, 0.010);
  EXPECT_DOUBLE_EQ(*f.tpot_s, 0.001);
  EXPECT_DOUBLE_EQ(*f.latency_s, 0.100);
  EXPECT_TRUE(ex.finished());
  EXPECT_TRUE(nothing(ex.on_token(ids[0], nullptr, t0)));
  EXPECT_TRUE(nothing(ex.on_done(FinishReason::Stop, 1, 0, t0)));
  EXPECT_TRUE(nothing(ex.on_error({ServiceErrorKind::Internal, "late", 0})));
}

TEST(CompletionExchange, StreamingSendsTheHeaderOnceThenEventsThenDone) {
  const std::vector<int> ids = ids_of(" Love is a fool");
  openai::CompletionParams p = params(int(ids.size()), true);
  p.include_usage = true;
  CompletionExchange ex = exchange(p);
  std::vector<ExchangeStep> steps = feed(ex, ids);
  ASSERT_FALSE(steps[0].events.empty());
  EXPECT_TRUE(steps[0].start_stream);
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_FALSE(steps[i].start_stream) << i;
  for (const auto& s : steps) EXPECT_FALSE(s.response || s.end_stream || s.finished);
  steps.push_back(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)));
  const ExchangeStep& last = steps.back();
  EXPECT_TRUE(last.end_stream);
  EXPECT_FALSE(last.start_stream || last.response);
  ASSERT_TRUE(last.finished);
  EXPECT_EQ(last.finished->prompt_tokens, 4) << "0 from the service keeps the submitted count";

  const auto evs = events(steps);
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 2 < evs.size(); ++i) {
    const json c = json::parse(evs[i]);
    EXPECT_TRUE(c["usage"].is_null()) << "include_usage: usage null on every chunk";
    text += c["choices"][0]["text"].get<std::string>();
    const bool final_chunk = i + 3 == evs.size();
    EXPECT_EQ(c["choices"][0]["finish_reason"].is_null(), !final_chunk) << evs[i];
  }
  EXPECT_EQ(text, fortune().decode(ids));
  const json usage = json::parse(evs[evs.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], int(ids.size()));
}

openai::ResponseMeta chat_meta() {
  return {"chatcmpl-test", 1700000000, "fortune", openai::Api::Chat};
}

// vLLM's continuous_usage_stats: each chunk's usage counts the tokens so far
// (a chat's role chunk none), the end-of-sequence token on the last; the
// totals still follow in a chunk of their own.
TEST(CompletionExchange, ContinuousUsageCountsEveryChunkSoFar) {
  const std::vector<int> ids = ids_of(" Love is a fool");
  for (const openai::ResponseMeta& m : {meta(), chat_meta()}) {
    openai::CompletionParams p = params(int(ids.size()) + 5, true);
    p.api = m.api;
    p.include_usage = true;
    p.continuous_usage = true;
    CompletionExchange ex(7, p, m, /*prompt_tokens=*/4, &fortune(), t0);
    std::vector<ExchangeStep> steps = feed(ex, ids);
    steps.push_back(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)));
    const auto evs = events(steps);
    ASSERT_GE(evs.size(), 3u);
    int last = -1;
    for (size_t i = 0; i + 2 < evs.size(); ++i) {
      const json c = json::parse(evs[i]);
      ASSERT_TRUE(c["usage"].is_object()) << evs[i];
      const int done = c["usage"]["completion_tokens"];
      EXPECT_EQ(c["usage"]["prompt_tokens"], 4);
      EXPECT_EQ(c["usage"]["total_tokens"], 4 + done);
      EXPECT_GE(done, last) << "never counts down";
      if (i == 0 && m.api == openai::Api::Chat) {
        EXPECT_EQ(done, 0) << "the role chunk";
      }
      last = done;
    }
    EXPECT_EQ(last, int(ids.size()) + 1) << "the last chunk counts the end-of-sequence token";
    EXPECT_EQ(json::parse(evs[evs.size() - 2])["usage"]["completion_tokens"], int(ids.size()) + 1);
  }
}

// The model's end-of-sequence token is generated but never delivered: usage
// counts it (as vLLM and llama-server do), the text and ids do not hold it.
TEST(CompletionExchange, UsageCountsTheEndOfSequenceTokenThatEndedIt) {
  const std::vector<int> ids = ids_of(" Love is a fool");
  for (const bool stream : {false, true}) {
    openai::CompletionParams p = params(int(ids.size()) + 5, stream);
    p.include_usage = true;
    p.return_token_ids = true;
    CompletionExchange ex = exchange(p);
    std::string all;
    for (const ExchangeStep& s : feed(ex, ids)) all += s.events;
    const ExchangeStep done = ex.on_done(FinishReason::Stop, 4, 0, t0 + milliseconds(50));
    ASSERT_TRUE(done.finished);
    EXPECT_EQ(done.finished->completion_tokens, int(ids.size()) + 1) << "stream " << stream;
    EXPECT_DOUBLE_EQ(*done.finished->tpot_s, 0.001) << "per delivered token";
    json usage;
    std::vector<int> got;
    if (stream) {
      all += done.events;
      const std::vector<std::string> evs = sse_events(all);
      usage = json::parse(evs[evs.size() - 2])["usage"];
      for (size_t i = 0; i + 2 < evs.size(); ++i)
        for (int id : json::parse(evs[i])["choices"][0].value("token_ids", std::vector<int>{}))
          got.push_back(id);
    } else {
      const json j = json::parse(done.response->body);
      usage = j["usage"];
      got = j["choices"][0]["token_ids"].get<std::vector<int>>();
      EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    }
    EXPECT_EQ(usage["completion_tokens"], int(ids.size()) + 1) << "stream " << stream;
    EXPECT_EQ(usage["total_tokens"], 4 + int(ids.size()) + 1);
    EXPECT_EQ(got, ids) << "the end-of-sequence id is not sent";
  }
  // Ended by length: every generated token was delivered.
  CompletionExchange ex = exchange(params(int(ids.size()), false));
  feed(ex, ids);
  const ExchangeStep done = ex.on_done(FinishReason::Length, 4, 0, t0 + milliseconds(50));
  EXPECT_EQ(json::parse(done.response->body)["usage"]["completion_tokens"], int(ids.size()));
}

TEST(CompletionExchange, ChatNonStreamingAnswersWithTheAssistantsMessage) {
  const std::vector<int> ids = ids_of(" Love is a fool");
  openai::CompletionParams p = params(int(ids.size()), false);
  p.api = openai::Api::Chat;
  CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
  for (const ExchangeStep& s : feed(ex, ids)) EXPECT_TRUE(nothing(s));
  const ExchangeStep done = ex.on_done(FinishReason::Length, 0, 0, t0 + milliseconds(50));
  ASSERT_TRUE(done.response);
  const json j = json::parse(done.response->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-test");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], fortune().decode(ids));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], int(ids.size()));
}

// The role first, then content deltas, then the finish reason in an empty
// delta, the usage chunk and [DONE].
TEST(CompletionExchange, ChatStreamingSendsRoleThenContentThenFinish) {
  const std::vector<int> ids = ids_of(" Love is a fool");
  openai::CompletionParams p = params(int(ids.size()), true);
  p.api = openai::Api::Chat;
  p.include_usage = true;
  p.stop = {"fool"};
  CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
  std::vector<ExchangeStep> steps = feed(ex, ids);
  ASSERT_TRUE(steps.back().finished) << "the stop string ended it";
  EXPECT_TRUE(steps.back().cancel_service);
  EXPECT_TRUE(steps[0].start_stream);

  const auto evs = events(steps);
  ASSERT_GE(evs.size(), 5u);
  const json role = json::parse(evs[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 3 < evs.size(); ++i) {
    const json c = json::parse(evs[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_FALSE(c["choices"][0]["delta"].contains("role")) << evs[i];
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null()) << evs[i];
    EXPECT_TRUE(c["usage"].is_null());
    text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, " Love is a ");
  const json finish = json::parse(evs[evs.size() - 3]);
  EXPECT_EQ(finish["choices"][0]["delta"], json::object());
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");
  const json usage = json::parse(evs[evs.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(evs.back(), "[DONE]");
}

TEST(CompletionExchange, ChatStreamWithNoTextStillSendsTheRoleFirst) {
  openai::CompletionParams p = params(4, true);
  p.api = openai::Api::Chat;
  CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
  const ExchangeStep done = ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(5));
  EXPECT_TRUE(done.start_stream && done.end_stream);
  const auto evs = sse_events(done.events);
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(json::parse(evs[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(evs[1])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(evs[2], "[DONE]");
}

// A chat that offered tools: what comes before the call is content (streamed
// as it comes), the call is the message's tool_calls, whole, and the finish
// reason says so.
TEST(CompletionExchange, AToolCallInTheAnswerBecomesTheMessagesToolCalls) {
  const std::vector<int> ids = ids_of(
      "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>");
  const std::string text = fortune().decode(ids);
  const size_t marker = text.find("<tool_call>");
  ASSERT_NE(marker, std::string::npos) << text;
  const std::string content = text.substr(0, marker);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    openai::CompletionParams p = params(int(ids.size()) + 5, stream);
    p.api = openai::Api::Chat;
    p.tool_calls = ToolCallFormat::Hermes;
    CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
    std::vector<ExchangeStep> steps = feed(ex, ids);
    steps.push_back(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)));
    ASSERT_TRUE(steps.back().finished);
    json call;
    if (!stream) {
      ASSERT_TRUE(steps.back().response);
      const json choice = json::parse(steps.back().response->body)["choices"][0];
      EXPECT_EQ(choice["finish_reason"], "tool_calls");
      EXPECT_EQ(choice["message"]["content"], content);
      ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
      call = choice["message"]["tool_calls"][0];
      EXPECT_FALSE(call.contains("index"));
    } else {
      const auto evs = events(steps);
      ASSERT_GE(evs.size(), 4u);
      std::string streamed;
      for (size_t i = 1; i + 3 < evs.size(); ++i) {
        const json delta = json::parse(evs[i])["choices"][0]["delta"];
        streamed += delta.value("content", "");
      }
      EXPECT_EQ(streamed, content);
      const json calls = json::parse(evs[evs.size() - 3])["choices"][0];
      EXPECT_TRUE(calls["finish_reason"].is_null());
      ASSERT_EQ(calls["delta"]["tool_calls"].size(), 1u);
      call = calls["delta"]["tool_calls"][0];
      EXPECT_EQ(call["index"], 0);
      const json finish = json::parse(evs[evs.size() - 2])["choices"][0];
      EXPECT_EQ(finish["finish_reason"], "tool_calls");
      EXPECT_EQ(finish["delta"], json::object());
      EXPECT_EQ(evs.back(), "[DONE]");
    }
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_EQ(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    EXPECT_EQ(call["id"], "chatcmpl-tool-test-0-0");
  }
  // Without tools offered the same answer is only text.
  openai::CompletionParams p = params(int(ids.size()) + 5, false);
  p.api = openai::Api::Chat;
  CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
  feed(ex, ids);
  const json plain =
      json::parse(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)).response->body);
  EXPECT_EQ(plain["choices"][0]["message"]["content"], text);
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(plain["choices"][0]["message"].contains("tool_calls"));
}

// Mistral's markers are control tokens, which text leaves out: a chat that
// reads Mistral's calls has them written, and its calls carry 9-character
// ids (Mistral's templates refuse others in a history).
TEST(CompletionExchange, MistralsCallsAreReadFromItsControlTokens) {
  test::TempDir dir;
  auto j =
      json::parse(test::read_file(test::data_path("tokenizers") / "qwen-small.tokenizer.json"));
  for (const auto& [id, text] : {std::pair{1508, "[TOOL_CALLS]"}, std::pair{1509, "[ARGS]"}})
    j["added_tokens"].push_back({{"id", id}, {"content", text}, {"special", true}});
  test::write_file(dir / "tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  const std::vector<int> ids =
      tok.encode("Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", false);
  ASSERT_EQ(std::count(ids.begin(), ids.end(), 1508), 1);
  ASSERT_EQ(tok.decode(ids), "Let me check.get_weather{\"city\": \"Paris\"}");
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    openai::CompletionParams p = params(int(ids.size()) + 5, stream);
    p.api = openai::Api::Chat;
    p.tool_calls = ToolCallFormat::Mistral;
    CompletionExchange ex(7, p, chat_meta(), 4, &tok, t0);
    std::vector<ExchangeStep> steps = feed(ex, ids);
    steps.push_back(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)));
    json message, calls;
    if (!stream) {
      ASSERT_TRUE(steps.back().response);
      const json choice = json::parse(steps.back().response->body)["choices"][0];
      EXPECT_EQ(choice["finish_reason"], "tool_calls");
      message = choice["message"];
      calls = message["tool_calls"];
    } else {
      std::string content;
      for (const std::string& e : events(steps)) {
        if (e == "[DONE]") continue;
        const json delta = json::parse(e)["choices"][0]["delta"];
        content += delta.value("content", "");
        if (delta.contains("tool_calls")) calls = delta["tool_calls"];
      }
      message["content"] = content;
    }
    EXPECT_EQ(message["content"], "Let me check.");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Paris\"}");
    const std::string id = calls[0]["id"];
    EXPECT_EQ(id.size(), 9u) << id;
    EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](unsigned char c) { return std::isalnum(c); }));
  }
  // A chat without tools: the markers stay out of the text.
  openai::CompletionParams p = params(int(ids.size()) + 5, false);
  p.api = openai::Api::Chat;
  CompletionExchange ex(7, p, chat_meta(), 4, &tok, t0);
  feed(ex, ids);
  const json plain =
      json::parse(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)).response->body);
  EXPECT_EQ(plain["choices"][0]["message"]["content"], tok.decode(ids));
}

TEST(CompletionExchange, StopStringAcrossTokensEndsAndCancelsOnce) {
  const std::string full = " The meaning of life is a fool and a fool";
  const std::vector<int> ids = ids_of(full);
  const std::string stop = "ng of li";
  const std::string decoded = fortune().decode(ids);
  const std::string want = decoded.substr(0, decoded.find(stop));
  ASSERT_NE(decoded.find(stop), std::string::npos);
  for (int id : ids)
    ASSERT_EQ(fortune().decode({id}).find(stop), std::string::npos) << "spans tokens";
  for (bool stream : {false, true}) {
    openai::CompletionParams p = params(int(ids.size()), stream);
    p.stop = {"never", stop};
    CompletionExchange ex = exchange(p);
    std::vector<ExchangeStep> steps = feed(ex, ids);
    int cancels = 0, ends = 0;
    for (const auto& s : steps) {
      cancels += s.cancel_service;
      ends += s.ends_response();
    }
    EXPECT_EQ(cancels, 1) << stream;
    EXPECT_EQ(ends, 1) << stream;
    EXPECT_TRUE(ex.finished());
    EXPECT_TRUE(nothing(ex.on_done(FinishReason::Cancelled, 0, 0, t0))) << "our own cancel's echo";
    const ExchangeStep& end =
        *std::find_if(steps.begin(), steps.end(), [](const auto& s) { return s.ends_response(); });
    ASSERT_TRUE(end.finished);
    EXPECT_EQ(end.finished->status, 200);
    if (stream) {
      const auto evs = events(steps);
      std::string text;
      for (size_t i = 0; i + 1 < evs.size(); ++i)
        text += json::parse(evs[i])["choices"][0]["text"].get<std::string>();
      EXPECT_EQ(text, want);
      EXPECT_EQ(json::parse(evs[evs.size() - 2])["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(evs.back(), "[DONE]");
    } else {
      const json j = json::parse(end.response->body);
      EXPECT_EQ(j["choices"][0]["text"], want);
      EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    }
  }
}

TEST(CompletionExchange, HeldBackStopPrefixIsReleasedAtTheEnd) {
  const std::vector<int> ids = ids_of(" A fool");
  openai::CompletionParams p = params(int(ids.size()), false);
  p.stop = {"fool!"};  // "fool" could start it, until the end says otherwise
  CompletionExchange ex = exchange(p);
  feed(ex, ids);
  const ExchangeStep done = ex.on_done(FinishReason::Length, 0, 0, t0);
  EXPECT_EQ(json::parse(done.response->body)["choices"][0]["text"], fortune().decode(ids));
  EXPECT_FALSE(done.cancel_service);
}

TEST(CompletionExchange, WithoutTokenizerEveryTokenIsSentAsItsId) {
  const std::vector<int> ids = {300, 301, 302};
  CompletionExchange streamed = exchange(params(3, true), nullptr);
  auto steps = feed(streamed, ids);
  for (const auto& s : steps) EXPECT_FALSE(s.events.empty()) << "each token is news";
  steps.push_back(streamed.on_done(FinishReason::Length, 0, 0, t0));
  std::vector<int> got;
  for (const auto& ev : events(steps)) {
    if (ev == "[DONE]") continue;
    const json c = json::parse(ev);
    EXPECT_EQ(c["choices"][0]["text"], "");
    for (int id : c["choices"][0]["token_ids"]) got.push_back(id);
  }
  EXPECT_EQ(got, ids);

  CompletionExchange whole = exchange(params(3, false), nullptr);
  feed(whole, ids);
  const json j = json::parse(whole.on_done(FinishReason::Length, 0, 0, t0).response->body);
  EXPECT_EQ(j["choices"][0]["text"], "");
  EXPECT_EQ(j["choices"][0]["token_ids"], json(ids));
}

TEST(CompletionExchange, ReturnTokenIdsWithATokenizer) {
  const std::vector<int> ids = ids_of(" Never trust");
  openai::CompletionParams p = params(int(ids.size()), false);
  p.return_token_ids = true;
  CompletionExchange ex = exchange(p);
  feed(ex, ids);
  const json j = json::parse(ex.on_done(FinishReason::Length, 0, 0, t0).response->body);
  EXPECT_EQ(j["choices"][0]["token_ids"], json(ids));
  EXPECT_EQ(j["choices"][0]["text"], fortune().decode(ids));
}

TEST(CompletionExchange, ErrorBeforeTheStreamStartedHasItsOwnStatus) {
  for (bool stream : {false, true}) {
    CompletionExchange ex = exchange(params(5, stream));
    const ExchangeStep s = ex.on_error({ServiceErrorKind::QueueFull, "queue full", 2.5});
    ASSERT_TRUE(s.response) << stream;
    EXPECT_FALSE(s.start_stream);
    EXPECT_TRUE(s.events.empty());
    EXPECT_EQ(s.response->status, 429);
    EXPECT_EQ(json::parse(s.response->body)["error"]["message"], "queue full");
    ASSERT_EQ(s.response->headers.size(), 1u);
    EXPECT_EQ(s.response->headers[0], (std::pair<std::string, std::string>{"Retry-After", "3"}));
    ASSERT_TRUE(s.finished);
    EXPECT_EQ(s.finished->status, 429);
    EXPECT_FALSE(s.finished->ttft_s || s.finished->tpot_s || s.finished->latency_s);
    EXPECT_TRUE(ex.finished());
  }
}

TEST(CompletionExchange, ErrorAfterTheStreamStartedIsAnEvent) {
  const std::vector<int> ids = ids_of(" Boom boom");
  CompletionExchange ex = exchange(params(20, true));
  auto steps = feed(ex, ids);
  steps.push_back(ex.on_error({ServiceErrorKind::Internal, "replica exploded", 0}));
  const ExchangeStep& last = steps.back();
  EXPECT_FALSE(last.response);
  EXPECT_FALSE(last.start_stream);
  EXPECT_TRUE(last.end_stream);
  const auto evs = events(steps);
  ASSERT_GE(evs.size(), 2u);
  EXPECT_EQ(evs.back(), "[DONE]");
  const json err = json::parse(evs[evs.size() - 2]);
  EXPECT_EQ(err["error"]["message"], "replica exploded");
  EXPECT_EQ(err["error"]["status"], 500);
  ASSERT_TRUE(last.finished);
  EXPECT_EQ(last.finished->status, 500);
  EXPECT_EQ(last.finished->completion_tokens, int(ids.size()));
}

TEST(CompletionExchange, ServerFailuresAndCancellation) {
  CompletionExchange cancelled = exchange(params(5, false));
  const ExchangeStep c = cancelled.on_done(FinishReason::Cancelled, 0, 0, t0);
  ASSERT_TRUE(c.response);
  EXPECT_EQ(c.response->status, 503);
  EXPECT_EQ(c.finished->status, 503);

  openai::ApiError broken;
  broken.status = 500;
  broken.type = "server_error";
  broken.message = "The request could not be submitted.";
  CompletionExchange failed = exchange(params(5, true));
  const ExchangeStep f = failed.fail(broken);
  ASSERT_TRUE(f.response);
  EXPECT_EQ(f.response->status, 500);
  EXPECT_TRUE(nothing(failed.fail(broken))) << "once ended, it stays ended";
}

TEST(CompletionExchange, ClientGoneCountsAs499) {
  CompletionExchange ex = exchange(params(10, true));
  feed(ex, ids_of(" A fool"));
  const ExchangeFigures f = ex.abandon();
  EXPECT_EQ(f.status, 499);
  EXPECT_EQ(f.prompt_tokens, 4);
  EXPECT_EQ(f.completion_tokens, int(ids_of(" A fool").size()));
  EXPECT_FALSE(f.ttft_s || f.tpot_s || f.latency_s);
  EXPECT_TRUE(ex.finished());
  EXPECT_TRUE(nothing(ex.on_token(400, nullptr, t0)));
}

TEST(CompletionExchange, TokensPastMaxTokensAreIgnored) {
  const std::vector<int> ids = ids_of(" The meaning of life is a fool");
  ASSERT_GT(ids.size(), 3u);
  for (bool stream : {false, true}) {
    CompletionExchange ex = exchange(params(3, stream));
    auto steps = feed(ex, ids);
    for (size_t i = 3; i < steps.size(); ++i) EXPECT_TRUE(nothing(steps[i])) << i;
    const ExchangeStep done = ex.on_done(FinishReason::Length, 0, 0, t0 + milliseconds(90));
    EXPECT_EQ(done.finished->completion_tokens, 3);
    const std::vector<int> first3(ids.begin(), ids.begin() + 3);
    if (!stream) {
      const json j = json::parse(done.response->body);
      EXPECT_EQ(j["choices"][0]["text"], fortune().decode(first3));
      EXPECT_EQ(j["usage"]["completion_tokens"], 3);
    }
  }
}

TEST(CompletionExchange, ServiceRequestCarriesTheParameters) {
  openai::CompletionParams p = params(12, true);
  p.temperature = 0.5f;
  p.top_p = 0.9f;
  p.top_k = 40;
  p.priority = 1;
  p.ignore_eos = true;
  CompletionRequest r = service_request(9, p, {1, 2, 3}, /*default_seed=*/77, 2.5);
  EXPECT_EQ(r.id, 9u);
  EXPECT_EQ(r.prompt, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.seed, 77u);
  EXPECT_EQ(r.priority, 1);
  EXPECT_DOUBLE_EQ(r.timeout_s, 2.5);
  EXPECT_TRUE(r.ignore_eos);
  p.seed = 5;
  EXPECT_EQ(service_request(9, p, {}, 77, 0).sampling.seed, 5u) << "the client's seed wins";
}

TEST(CompletionExchange, RecordCountsTheFigures) {
  Metrics m;
  record({200, 5, 3, 0.01, 0.002, 0.05}, m);
  record({499, 2, 1, std::nullopt, std::nullopt, std::nullopt}, m);
  // Never read: refused, or left before its first token.
  record({429, 40, 0, std::nullopt, std::nullopt, std::nullopt}, m);
  record({499, 30, 0, std::nullopt, std::nullopt, std::nullopt}, m);
  const std::string t = m.render();
  EXPECT_NE(t.find("troupe_requests_total{status=\"200\"} 1"), std::string::npos) << t;
  EXPECT_NE(t.find("troupe_requests_total{status=\"499\"} 2"), std::string::npos);
  EXPECT_NE(t.find("troupe_requests_total{status=\"429\"} 1"), std::string::npos);
  EXPECT_NE(t.find("troupe_prompt_tokens_total 7"), std::string::npos);
  EXPECT_NE(t.find("troupe_generation_tokens_total 4"), std::string::npos);
  EXPECT_NE(t.find("troupe_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(t.find("troupe_time_per_output_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(t.find("troupe_request_latency_seconds_count 1"), std::string::npos);
}

// What a runtime sends with token `id` when asked: a made-up distribution
// whose numbers say which token they came with.
TokenLogprobs made_up(int id) {
  return {-0.01f * float(id), {{id + 1, -0.001f}, {id, -0.01f * float(id)}}};
}

TEST(CompletionExchange, LogprobsGoWithTheChunkThatCarriesTheirTokens) {
  // "é" is two byte pieces: the first chunk waits for the second byte, and
  // its log-probabilities wait with it.
  const std::vector<int> ids = ids_of("Love \xC3\xA9 fool");
  openai::CompletionParams p = params(int(ids.size()), true);
  p.logprobs = 1;
  // After a prompt, so that the first token keeps its space.
  const std::vector<int> tail = ids_of("A");
  CompletionExchange ex(7, p, meta(), 4, &fortune(), t0, tail);
  std::vector<ExchangeStep> steps;
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenLogprobs lp = made_up(ids[i]);
    steps.push_back(ex.on_token(ids[i], &lp, t0 + milliseconds(int(i))));
  }
  steps.push_back(ex.on_done(FinishReason::Length, 4, 0, t0 + milliseconds(50)));
  std::vector<int> seen;
  std::string text;
  int64_t offset = 0;
  for (const std::string& e : events(steps)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    if (c["logprobs"].is_null()) {
      EXPECT_EQ(c["text"], "") << "a chunk with text has its tokens' log-probabilities";
      continue;
    }
    const json& lp = c["logprobs"];
    std::string tokens_text;
    for (size_t k = 0; k < lp["tokens"].size(); ++k) {
      EXPECT_EQ(lp["text_offset"][k], offset);
      const int id = ids[seen.size()];
      seen.push_back(id);
      const std::string bytes = fortune().token_bytes(id);
      offset += int64_t(bytes.size());
      tokens_text += bytes;
      if (bytes.size() == 1 && (bytes[0] & 0x80))
        EXPECT_EQ(lp["tokens"][k].get<std::string>().rfind("bytes:\\x", 0), 0u);
      else
        EXPECT_EQ(lp["tokens"][k], bytes);
      EXPECT_FLOAT_EQ(float(lp["token_logprobs"][k]), -0.01f * float(id));
      EXPECT_EQ(lp["top_logprobs"][k].size(), 2u);  // the one asked for, and the sampled one
    }
    EXPECT_EQ(tokens_text, c["text"]);
    text += c["text"].get<std::string>();
  }
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(text, " Love \xC3\xA9 fool");
}

// Echo: the text starts with the prompt as written, and with logprobs so do
// the log-probabilities (its first token's null, the others' as the service
// computed them); streamed, the prompt goes with the first chunk.
TEST(CompletionExchange, EchoPutsThePromptFirstInTextAndLogprobs) {
  const std::string prompt_text = "A fool";
  std::vector<int> prompt = fortune().encode(prompt_text, /*add_bos=*/true);
  const std::vector<int> ids = ids_of("and his money");  // " and ..." after the prompt
  std::vector<TokenLogprobs> prompt_lps;
  for (size_t i = 1; i < prompt.size(); ++i) prompt_lps.push_back(made_up(prompt[i]));
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    openai::CompletionParams p = params(int(ids.size()), stream);
    p.logprobs = 1;
    p.echo = true;
    CompletionExchange ex(7, p, meta(), int(prompt.size()), &fortune(), t0, prompt);
    ex.set_echo(prompt_text, prompt);
    ex.on_prompt_logprobs(prompt_lps);
    std::vector<ExchangeStep> steps;
    for (size_t i = 0; i < ids.size(); ++i) {
      const TokenLogprobs lp = made_up(ids[i]);
      steps.push_back(ex.on_token(ids[i], &lp, t0 + milliseconds(int(i))));
    }
    steps.push_back(ex.on_done(FinishReason::Length, int(prompt.size()), 0, t0 + milliseconds(50)));
    std::string text;
    json all{{"tokens", json::array()},
             {"token_logprobs", json::array()},
             {"top_logprobs", json::array()},
             {"text_offset", json::array()}};
    auto add = [&](const json& c) {
      text += c["text"].get<std::string>();
      if (c["logprobs"].is_null()) return;
      for (auto& [k, v] : all.items())
        for (const auto& e : c["logprobs"][k]) v.push_back(e);
    };
    if (stream) {
      const auto evs = events(steps);
      ASSERT_FALSE(evs.empty());
      // The first chunk holds the prompt.
      EXPECT_EQ(json::parse(evs[0])["choices"][0]["text"].get<std::string>().rfind(prompt_text, 0),
                0u);
      for (const std::string& e : evs)
        if (e != "[DONE]") add(json::parse(e)["choices"][0]);
    } else {
      add(json::parse(steps.back().response->body)["choices"][0]);
    }
    EXPECT_EQ(text, prompt_text + " and his money");
    const size_t P = prompt.size();
    ASSERT_EQ(all["tokens"].size(), P + ids.size());
    EXPECT_EQ(all["tokens"][0], "<s>");
    EXPECT_TRUE(all["token_logprobs"][0].is_null());
    EXPECT_TRUE(all["top_logprobs"][0].is_null());
    int64_t offset = 0;
    for (size_t k = 0; k < P + ids.size(); ++k) {
      const int id = k < P ? prompt[k] : ids[k - P];
      EXPECT_EQ(all["text_offset"][k], offset) << k;
      offset += int64_t(fortune().token_bytes(id).size());
      if (k == 0) continue;
      EXPECT_FLOAT_EQ(float(all["token_logprobs"][k]), -0.01f * float(id)) << k;
      EXPECT_EQ(all["top_logprobs"][k].size(), 2u) << k;
    }
  }
}

// max_tokens 0 with echo: the prompt alone; the token the service samples
// is dropped, and the usage counts none.
TEST(CompletionExchange, EchoOfThePromptAloneDropsTheSampledToken) {
  const std::vector<int> prompt = fortune().encode("Love is", /*add_bos=*/true);
  for (bool stream : {false, true}) {
    openai::CompletionParams p = params(0, stream);
    p.echo = true;
    p.include_usage = true;
    CompletionExchange ex(7, p, meta(), int(prompt.size()), &fortune(), t0, prompt);
    ex.set_echo("Love is", prompt);
    std::vector<ExchangeStep> steps;
    steps.push_back(ex.on_token(ids_of(" a")[0], nullptr, t0 + milliseconds(1)));
    EXPECT_TRUE(nothing(steps.back()));
    steps.push_back(ex.on_done(FinishReason::Length, int(prompt.size()), 0, t0 + milliseconds(2)));
    json usage, choice;
    if (stream) {
      std::string text;
      for (const std::string& e : events(steps)) {
        if (e == "[DONE]") continue;
        const json j = json::parse(e);
        if (!j["usage"].is_null()) usage = j["usage"];
        if (!j["choices"].empty()) {
          text += j["choices"][0]["text"].get<std::string>();
          if (!j["choices"][0]["finish_reason"].is_null()) choice = j["choices"][0];
        }
      }
      EXPECT_EQ(text, "Love is");
    } else {
      const json j = json::parse(steps.back().response->body);
      usage = j["usage"];
      choice = j["choices"][0];
      EXPECT_EQ(choice["text"], "Love is");
    }
    EXPECT_EQ(choice["finish_reason"], "length");
    EXPECT_EQ(usage["completion_tokens"], 0);
    EXPECT_EQ(usage["prompt_tokens"], int(prompt.size()));
    ASSERT_TRUE(steps.back().finished);
    EXPECT_EQ(steps.back().finished->completion_tokens, 0);
  }
}

// A stop string cuts the text: the tokens past the cut were never shown and
// have no entry; the one the cut splits keeps its own.
TEST(CompletionExchange, LogprobsEndWhereAStopStringCutsTheText) {
  const std::vector<int> tail = ids_of("A");
  const std::vector<int> ids = ids_of("fool and his money are soon parted");
  for (bool stream : {false, true})
    for (const auto& [stop, kept_text] : std::vector<std::pair<std::string, std::string>>{
             {" money", " fool and his"}, {"mon", " fool and his "}, {"d his", " fool an"}}) {
      SCOPED_TRACE(stop + (stream ? ", streamed" : ""));
      openai::CompletionParams p = params(int(ids.size()), stream);
      p.logprobs = 0;
      p.stop = {stop};
      CompletionExchange ex(7, p, meta(), 4, &fortune(), t0, tail);
      std::vector<ExchangeStep> steps;
      for (int id : ids) {
        const TokenLogprobs lp = made_up(id);
        steps.push_back(ex.on_token(id, &lp, t0));
        if (ex.finished()) break;
      }
      ASSERT_TRUE(ex.finished());
      std::string text, tokens;
      std::vector<json> offsets;
      auto take = [&](const json& c) {
        text += c["text"].get<std::string>();
        if (c["logprobs"].is_null()) return;
        for (const auto& t : c["logprobs"]["tokens"]) tokens += t.get<std::string>();
        for (const auto& o : c["logprobs"]["text_offset"]) offsets.push_back(o);
      };
      if (stream) {
        for (const std::string& e : events(steps))
          if (e != "[DONE]") take(json::parse(e)["choices"][0]);
      } else {
        take(json::parse(steps.back().response->body)["choices"][0]);
      }
      EXPECT_EQ(text, kept_text);
      // Every token listed starts inside the text, and they cover it.
      for (const json& o : offsets) EXPECT_LT(o.get<size_t>(), text.size());
      EXPECT_EQ(tokens.substr(0, text.size()), text);
      EXPECT_LT(tokens.size() - text.size(), fortune().token_bytes(ids.back()).size() + 8);
    }
}

TEST(CompletionExchange, LogprobsOfAWholeChatResponseAndOfNoRequest) {
  const std::vector<int> ids = ids_of(" a fool");
  openai::CompletionParams p = params(int(ids.size()), false);
  p.api = openai::Api::Chat;
  p.logprobs = 0;
  openai::ResponseMeta m = meta();
  m.api = openai::Api::Chat;
  CompletionExchange ex(7, p, m, 4, &fortune(), t0);
  for (int id : ids) {
    const TokenLogprobs lp = made_up(id);
    EXPECT_TRUE(nothing(ex.on_token(id, &lp, t0)));
  }
  const ExchangeStep done = ex.on_done(FinishReason::Length, 4, 0, t0);
  ASSERT_TRUE(done.response);
  const json content = json::parse(done.response->body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_EQ(content[k]["token"], fortune().token_bytes(ids[k]));
    EXPECT_TRUE(content[k]["top_logprobs"].empty()) << "top_logprobs 0";
  }
  // Not asked: null, whatever the runtime sends.
  CompletionExchange quiet = exchange(params(int(ids.size()), false));
  for (int id : ids) {
    const TokenLogprobs lp = made_up(id);
    quiet.on_token(id, &lp, t0);
  }
  const ExchangeStep plain = quiet.on_done(FinishReason::Length, 4, 0, t0);
  EXPECT_TRUE(json::parse(plain.response->body)["choices"][0]["logprobs"].is_null());
}

// A server with a reasoning parser: the answer's <think>...</think> is
// message.reasoning_content (streamed as delta.reasoning_content), the rest
// the content, as vLLM's deepseek_r1 and qwen3 parsers give them; a tool call
// after the reasoning is still read.
TEST(CompletionExchange, ReasoningIsToldFromTheReply) {
  struct Case {
    ReasoningParser parser;
    std::string prompt_end, answer;
    std::optional<std::string> reasoning;
    std::string content;
  };
  const std::vector<Case> cases = {
      {ReasoningParser::Qwen3, "", "<think>\nI think so.\n</think>\n\nYes.", "\nI think so.\n",
       "\n\nYes."},
      {ReasoningParser::Qwen3, "", "Yes, no reasoning.", std::nullopt, "Yes, no reasoning."},
      {ReasoningParser::Qwen3, "<think>\n", "Opened by the prompt.</think>Yes.",
       "Opened by the prompt.", "Yes."},
      {ReasoningParser::DeepSeekR1, "", "Hmm, sure.</think>\n\nYes.", "Hmm, sure.", "\n\nYes."},
      {ReasoningParser::DeepSeekR1, "", "<think>Cut short by max", "Cut short by max", ""},
  };
  for (const Case& c : cases) {
    const std::vector<int> ids = ids_of(c.answer);
    const std::string text = fortune().decode(ids);
    ASSERT_EQ(text, c.answer);
    for (const bool stream : {false, true}) {
      SCOPED_TRACE(c.answer + (stream ? " (streamed)" : ""));
      openai::CompletionParams p = params(int(ids.size()) + 5, stream);
      p.api = openai::Api::Chat;
      p.reasoning = c.parser;
      p.prompt_text = "<|user|>Is it?<|assistant|>" + c.prompt_end;
      CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
      std::vector<ExchangeStep> steps = feed(ex, ids);
      steps.push_back(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)));
      if (!stream) {
        const json m = json::parse(steps.back().response->body)["choices"][0]["message"];
        if (c.reasoning) {
          EXPECT_EQ(m["reasoning_content"], *c.reasoning);
        } else {
          EXPECT_TRUE(m["reasoning_content"].is_null()) << m;
        }
        if (c.content.empty()) {
          EXPECT_TRUE(m["content"].is_null()) << m;
        } else {
          EXPECT_EQ(m["content"], c.content);
        }
        continue;
      }
      std::string reasoning, content;
      for (const std::string& e : events(steps)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("content")) content += d["content"].get<std::string>();
      }
      EXPECT_EQ(reasoning, c.reasoning.value_or(""));
      EXPECT_EQ(content, c.content);
    }
  }
  // Reasoning, then a tool call in the reply.
  const std::vector<int> ids = ids_of(
      "<think>Use the tool.</think><tool_call>\n{\"name\": \"f\", \"arguments\": "
      "{}}\n</tool_call>");
  openai::CompletionParams p = params(int(ids.size()) + 5, false);
  p.api = openai::Api::Chat;
  p.reasoning = ReasoningParser::Qwen3;
  p.tool_calls = ToolCallFormat::Hermes;
  CompletionExchange ex(7, p, chat_meta(), 4, &fortune(), t0);
  feed(ex, ids);
  const json c = json::parse(
      ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)).response->body)["choices"][0];
  EXPECT_EQ(c["message"]["reasoning_content"], "Use the tool.");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "f");
}

// A /v1/responses exchange: the same text, split and read the same way, as
// a response's items (reasoning, message, function calls), whole or as
// typed events whose last one carries the whole response.
TEST(CompletionExchange, AResponsesAnswerIsItsItems) {
  const std::string answer =
      "<think>Use the tool.</think>On it.<tool_call>\n{\"name\": \"f\", \"arguments\": "
      "{\"x\": 1}}\n</tool_call>";
  const std::vector<int> ids = ids_of(answer);
  ASSERT_EQ(fortune().decode(ids), answer);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    openai::CompletionParams p = params(int(ids.size()) + 5, stream);
    p.api = openai::Api::Responses;
    p.reasoning = ReasoningParser::Qwen3;
    p.tool_calls = ToolCallFormat::Hermes;
    p.response_fields = {{"instructions", "Be brief."}};
    openai::ResponseMeta m{"resp_00ab", 1700000000, "fortune", openai::Api::Responses};
    CompletionExchange ex(7, p, m, 4, &fortune(), t0);
    std::vector<ExchangeStep> steps = feed(ex, ids);
    steps.push_back(ex.on_done(FinishReason::Stop, 0, 0, t0 + milliseconds(50)));
    ASSERT_TRUE(steps.back().finished);
    json r;
    if (!stream) {
      r = json::parse(steps.back().response->body);
    } else {
      std::string reasoning, text;
      int sequence = 0;
      for (const std::string& e : events(steps)) {
        const json j = json::parse(e);
        EXPECT_EQ(j["sequence_number"], sequence++);
        if (j["type"] == "response.reasoning_text.delta")
          reasoning += j["delta"].get<std::string>();
        if (j["type"] == "response.output_text.delta") text += j["delta"].get<std::string>();
        r = j.value("response", json());
      }
      EXPECT_EQ(reasoning, "Use the tool.");
      EXPECT_EQ(text, "On it.");
      EXPECT_TRUE(steps.back().end_stream);
    }
    EXPECT_EQ(r["status"], "completed");
    EXPECT_EQ(r["id"], "resp_00ab");
    EXPECT_EQ(r["instructions"], "Be brief.");
    ASSERT_EQ(r["output"].size(), 3u) << r;
    EXPECT_EQ(r["output"][0]["content"][0]["text"], "Use the tool.");
    EXPECT_EQ(r["output"][1]["content"][0]["text"], "On it.");
    EXPECT_EQ(r["output"][2]["type"], "function_call");
    EXPECT_EQ(r["output"][2]["name"], "f");
    EXPECT_EQ(r["output"][2]["arguments"], "{\"x\": 1}");
    EXPECT_EQ(r["output"][2]["call_id"], "call_00ab_0");
    EXPECT_EQ(r["usage"]["input_tokens"], 4);
    EXPECT_EQ(r["usage"]["output_tokens"], int(ids.size()) + 1);  // and the end of sequence
    const int reasoning_tokens = r["usage"]["output_tokens_details"]["reasoning_tokens"];
    EXPECT_GT(reasoning_tokens, 0);
    EXPECT_LT(reasoning_tokens, int(ids.size()));
  }
  // An error after the stream started is an "error" event, without [DONE].
  openai::CompletionParams p = params(20, true);
  p.api = openai::Api::Responses;
  CompletionExchange ex(7, p, {"resp_00ab", 1, "fortune", openai::Api::Responses}, 4, &fortune(),
                        t0);
  feed(ex, ids_of("Hello"));
  const ExchangeStep failed = ex.on_error({ServiceErrorKind::Unavailable, "Replica lost.", 1});
  const auto evs = sse_events(failed.events);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(json::parse(evs.back())["type"], "error");
  EXPECT_TRUE(failed.end_stream);
}

}  // namespace
}  // namespace troupe
