// `troupe serve` as a user runs it: a real process on 127.0.0.1, the shared
// HTTP client, the bundled model.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "deploy/engine_builder.h"
#include "net/sse_parser.h"
#include "support/process_support.h"
#include "support/serving_support.h"
#include "support/test_support.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

using json = nlohmann::json;
using test::generate_text;
using test::Server;
using test::sse_text;

const std::vector<std::string> kPrompts{
    "The meaning of life", "A fool", "Never trust", "Love is", "The computer", "In the beginning"};

TEST(Serve, GreedyOutputsEqualGenerateAndConcurrentRequestsComplete) {
  Server s({"parallel.replicas=2", "devices=[{kind: cpu, threads: 1}]"});
  std::vector<std::string> want;
  for (const auto& p : kPrompts) want.push_back(generate_text(p, 40));
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto r = s.complete(
        {{"model", "fortune"}, {"prompt", kPrompts[i]}, {"max_tokens", 40}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    const auto j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["text"], want[i]);
    EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
              j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  }
  // 32 at once, streaming and not.
  std::vector<std::string> got(32);
  std::vector<std::thread> clients;
  for (int i = 0; i < 32; ++i)
    clients.emplace_back([&, i] {
      const bool stream = i % 2;
      auto r = s.complete({{"prompt", kPrompts[size_t(i) % kPrompts.size()]},
                           {"max_tokens", 40},
                           {"temperature", 0},
                           {"stream", stream}});
      if (r.status != 200) return;
      got[size_t(i)] =
          stream ? sse_text(r.body) : json::parse(r.body)["choices"][0]["text"].get<std::string>();
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i) % kPrompts.size()]) << i;
}

// A 16-bit KV cache in a tensor layout serves what one device with that
// cache generates (and a request's tokens do not depend on its batch), and
// a byte budget holds twice the blocks of an f32 cache.
TEST(Serve, ASixteenBitKvCacheInALayoutGivesTheOneDeviceText) {
  // fortune: 5 layers x 2 x 64 values, f16: 1280 bytes a token, 20480 a block.
  Server s({"kv_cache.dtype=f16", "kv_cache.bytes=2621440", "parallel.tensor=2",
            "devices=[{kind: cpu, threads: 1}]"});
  EXPECT_TRUE(s.wait_metric("troupe_kv_blocks{replica=\"0\",state=\"free\"}", "128", 10))
      << s.metrics();
  std::vector<std::string> want;
  for (size_t i = 0; i < 3; ++i)
    want.push_back(generate_text(kPrompts[i], 48, {"--temperature", "0", "--kv-dtype", "f16"}));
  std::vector<std::string> got(6);
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i)
    clients.emplace_back([&, i] {
      auto r =
          s.complete({{"prompt", kPrompts[size_t(i) % 3]}, {"max_tokens", 48}, {"temperature", 0}});
      if (r.status == 200) got[size_t(i)] = json::parse(r.body)["choices"][0]["text"];
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i) % 3]) << i;
}

// Log-probabilities: as the OpenAI shapes have them, greedy's the likeliest,
// the same streamed or not, and the same floats in a tensor layout.
// A completion stream's log-probabilities, its chunks' put together.
json streamed_logprobs(const std::string& body) {
  json all{{"tokens", json::array()},
           {"token_logprobs", json::array()},
           {"top_logprobs", json::array()},
           {"text_offset", json::array()}};
  for (const std::string& e : sse_events(body)) {
    if (e == "[DONE]") continue;
    const json lp = json::parse(e)["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (auto& [k, v] : all.items())
      for (const auto& x : lp[k]) v.push_back(x);
  }
  return all;
}

TEST(Serve, LogprobsComeWithEveryTokenAndAreTheSameInALayout) {
  const json ask{
      {"prompt", "The meaning of life"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 3}};
  auto logprobs_of = [&](Server& s, bool stream) {
    json req = ask;
    req["stream"] = stream;
    auto r = s.complete(req);
    EXPECT_EQ(r.status, 200) << r.body;
    if (!stream) return json::parse(r.body)["choices"][0]["logprobs"];
    return streamed_logprobs(r.body);
  };
  json want;
  {
    Server s({"devices=[{kind: cpu, threads: 1}]"});
    auto r = s.complete(ask);
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    want = j["choices"][0]["logprobs"];
    ASSERT_EQ(want["tokens"].size(), j["usage"]["completion_tokens"].get<size_t>());
    std::string text;
    for (size_t k = 0; k < want["tokens"].size(); ++k) {
      EXPECT_EQ(want["text_offset"][k].get<size_t>(), text.size());
      text += want["tokens"][k].get<std::string>();
      // Greedy: the sampled token is the likeliest of the three.
      const json& top = want["top_logprobs"][k];
      EXPECT_EQ(top.size(), 3u);
      double best = -1e9;
      for (const auto& [tok, lp] : top.items()) best = std::max(best, lp.get<double>());
      EXPECT_EQ(want["token_logprobs"][k].get<double>(), best) << k;
      EXPECT_LE(best, 0.0);
    }
    EXPECT_EQ(text, j["choices"][0]["text"]);
    EXPECT_EQ(logprobs_of(s, true), want);
    // Not asked: null; a chat's shape.
    auto plain = s.complete({{"prompt", "A fool"}, {"max_tokens", 3}});
    EXPECT_TRUE(json::parse(plain.body)["choices"][0]["logprobs"].is_null());
    auto chat = test::http_request(
        s.port(), "POST", "/v1/chat/completions",
        // Sampled, so the first token may be EOS: ignore_eos keeps the four.
        json{{"messages", {{{"role", "user"}, {"content", "Tell me a fortune"}}}},
             {"max_tokens", 4},
             {"ignore_eos", true},
             {"logprobs", true},
             {"top_logprobs", 2}}
            .dump());
    ASSERT_EQ(chat.status, 200) << chat.body;
    const json content = json::parse(chat.body)["choices"][0]["logprobs"]["content"];
    ASSERT_FALSE(content.empty());
    for (const json& t : content) {
      EXPECT_EQ(t["top_logprobs"].size(), 2u);
      EXPECT_TRUE(t["bytes"].is_array());
    }
  }
  Server tp({"parallel.tensor=2", "devices=[{kind: cpu, threads: 1}]"});
  EXPECT_EQ(logprobs_of(tp, false), want);
}

// Echo with log-probabilities (what lm-eval's loglikelihood tasks send):
// a prompt token's log-probability is what the server reported for that
// token when it generated it, the same floats, in a layout too; the first
// prompt token has none; max_tokens 0 gives the prompt alone.
TEST(Serve, EchoedPromptLogprobsAreThoseOfTheSameTokensGenerated) {
  if (test::serving_on_cuda()) {
    Server s({});
    const auto r =
        s.complete({{"prompt", "A fool"}, {"echo", true}, {"max_tokens", 1}, {"logprobs", 1}});
    EXPECT_EQ(r.status, 400) << r.body;
    GTEST_SKIP() << "the CUDA engines do not compute prompt log-probabilities yet (refused with "
                    "a 400, as checked)";
  }
  const std::vector<int> prompt{1, 300, 40, 500, 77};
  auto post = [](Server& s, const json& req) {
    const auto r = s.complete(req);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  };
  auto echo_of = [&](Server& s, const std::vector<int>& ids, bool stream) {
    json req{
        {"prompt", ids}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 2}, {"stream", stream}};
    if (!stream) return post(s, req)["choices"][0]["logprobs"];
    const auto r = s.complete(req);
    EXPECT_EQ(r.status, 200) << r.body;
    return streamed_logprobs(r.body);
  };
  json want;
  std::vector<int> all_ids;
  {
    Server one({"devices=[{kind: cpu, threads: 1}]"});
    const json gen = post(one, {{"prompt", prompt},
                                {"max_tokens", 12},
                                {"temperature", 0},
                                {"logprobs", 2},
                                {"ignore_eos", true},
                                {"return_token_ids", true}})["choices"][0];
    const std::vector<int> generated = gen["token_ids"];
    ASSERT_EQ(generated.size(), 12u);
    std::vector<int>& all = all_ids;
    all = prompt;
    all.insert(all.end(), generated.begin(), generated.end());
    const json whole =
        post(one, {{"prompt", all}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 2}});
    EXPECT_EQ(whole["usage"]["completion_tokens"], 0);
    EXPECT_EQ(whole["usage"]["prompt_tokens"], all.size());
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
    want = whole["choices"][0]["logprobs"];
    ASSERT_EQ(want["tokens"].size(), all.size());
    EXPECT_TRUE(want["token_logprobs"][0].is_null());
    EXPECT_TRUE(want["top_logprobs"][0].is_null());
    for (size_t j = 0; j < generated.size(); ++j) {
      const size_t k = prompt.size() + j;
      EXPECT_EQ(want["tokens"][k], gen["logprobs"]["tokens"][j]) << j;
      EXPECT_EQ(want["token_logprobs"][k], gen["logprobs"]["token_logprobs"][j]) << j;
      EXPECT_EQ(want["top_logprobs"][k], gen["logprobs"]["top_logprobs"][j]) << j;
    }
    for (size_t k = 1; k < prompt.size(); ++k)
      EXPECT_LE(want["token_logprobs"][k].get<double>(), 0);
    EXPECT_EQ(echo_of(one, all, true), want);
    // With a completion after it: the echo, then the generated tokens.
    const json more = post(one, {{"prompt", "A fool"},
                                 {"echo", true},
                                 {"max_tokens", 3},
                                 {"temperature", 0},
                                 {"logprobs", 0}})["choices"][0];
    EXPECT_EQ(more["text"].get<std::string>().rfind("A fool", 0), 0u);
    EXPECT_EQ(more["logprobs"]["tokens"][0], "<s>");
    // A chat does not echo.
    EXPECT_EQ(test::http_request(
                  one.port(), "POST", "/v1/chat/completions",
                  json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"echo", true}}.dump())
                  .status,
              400);
  }
  // A tensor-parallel layout gives the same floats.
  Server tp({"parallel.tensor=2", "devices=[{kind: cpu, threads: 1}]"});
  EXPECT_EQ(echo_of(tp, all_ids, false), want);
}

// n choices: choice i is what one request with seed + i generates, streamed
// or not; greedy choices are all the same; the usage counts the prompt once.
TEST(Serve, NChoicesAreTheRequestsWithConsecutiveSeeds) {
  Server s({"parallel.replicas=2", "devices=[{kind: cpu, threads: 1}]"});
  const json one{{"prompt", "A fool"}, {"max_tokens", 24}, {"temperature", 0.9}, {"seed", 40}};
  std::vector<std::string> want;
  int completion = 0, prompt = 0;
  for (int i = 0; i < 3; ++i) {
    json b = one;
    b["seed"] = 40 + i;
    auto r = s.complete(b);
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    want.push_back(j["choices"][0]["text"]);
    completion += j["usage"]["completion_tokens"].get<int>();
    prompt = j["usage"]["prompt_tokens"];
  }
  EXPECT_FALSE(want[0] == want[1] && want[1] == want[2]) << "the seeds should differ";
  json b = one;
  b["n"] = 3;
  auto whole = s.complete(b);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json j = json::parse(whole.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], want[size_t(i)]) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion);
  b["stream"] = true;
  auto streamed = s.complete(b);
  ASSERT_EQ(streamed.status, 200);
  std::vector<std::string> got(3);
  int dones = 0;
  for (const std::string& e : sse_events(streamed.body)) {
    if (e == "[DONE]") {
      ++dones;
      continue;
    }
    const json c = json::parse(e)["choices"][0];
    got[c["index"].get<size_t>()] += c["text"].get<std::string>();
  }
  EXPECT_EQ(dones, 1);
  EXPECT_EQ(got, want);
  // Greedy choices of a chat are all the one answer.
  auto chat =
      test::http_request(s.port(), "POST", "/v1/chat/completions",
                         json{{"messages", {{{"role", "user"}, {"content", "Tell me a fortune"}}}},
                              {"max_tokens", 8},
                              {"temperature", 0},
                              {"n", 2}}
                             .dump());
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json c = json::parse(chat.body)["choices"];
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["message"]["content"], c[1]["message"]["content"]);
}

// A batch of prompts: each answered as if it came alone, its n choices
// after the previous prompt's; each prompt counts once in the usage.
TEST(Serve, ABatchOfPromptsIsEachPromptAlone) {
  Server s({"parallel.replicas=2", "devices=[{kind: cpu, threads: 1}]"});
  const std::vector<std::string> prompts{kPrompts[0], kPrompts[1], kPrompts[3]};
  std::vector<std::string> want;
  int prompt_tokens = 0, completion_tokens = 0;
  for (const std::string& p : prompts)
    for (int j = 0; j < 2; ++j) {
      auto r =
          s.complete({{"prompt", p}, {"max_tokens", 16}, {"temperature", 0.8}, {"seed", 9 + j}});
      ASSERT_EQ(r.status, 200) << r.body;
      const json one = json::parse(r.body);
      want.push_back(one["choices"][0]["text"]);
      completion_tokens += one["usage"]["completion_tokens"].get<int>();
      if (j == 0) prompt_tokens += one["usage"]["prompt_tokens"].get<int>();
    }
  const json batch{
      {"prompt", prompts}, {"max_tokens", 16}, {"temperature", 0.8}, {"seed", 9}, {"n", 2}};
  auto r = s.complete(batch);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(j["choices"][i]["index"], int(i));
    EXPECT_EQ(j["choices"][i]["text"], want[i]) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion_tokens);
  json streamed_req = batch;
  streamed_req["stream"] = true;
  auto streamed = s.complete(streamed_req);
  ASSERT_EQ(streamed.status, 200);
  std::vector<std::string> got(want.size());
  for (const std::string& e : sse_events(streamed.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    got[c["index"].get<size_t>()] += c["text"].get<std::string>();
  }
  EXPECT_EQ(got, want);
  // Token-id prompts too; one too long is a 400 naming it.
  auto ids =
      s.complete({{"prompt", {{1, 450, 30}, {1, 77}}}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(ids.status, 200) << ids.body;
  EXPECT_EQ(json::parse(ids.body)["choices"].size(), 2u);
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "word ";
  auto over = s.complete({{"prompt", {"A fool", long_text}}, {"max_tokens", 4}});
  EXPECT_EQ(over.status, 400);
  EXPECT_NE(over.body.find("`prompt`[1]"), std::string::npos) << over.body;
}

TEST(Serve, StreamingEndsWithDoneAndHasTheFinishReason) {
  Server s({});
  auto r = s.complete(
      {{"prompt", "The meaning of life"}, {"max_tokens", 5}, {"temperature", 0}, {"stream", true}});
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.header("Content-Type").find("text/event-stream"), std::string::npos);
  std::string finish;
  EXPECT_EQ(sse_text(r.body, &finish), generate_text("The meaning of life", 5));
  EXPECT_EQ(finish, "length");
}

TEST(Serve, BadInputsGetTheirStatusAndTheServerKeepsServing) {
  Server s({"server.max_body_bytes=4096", "server.max_tokens_limit=100"});
  auto raw = [&](const std::string& body) {
    return test::http_request(s.port(), "POST", "/v1/completions", body);
  };
  auto expect = [&](const HttpResponse& r, int status, const std::string& needle) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_NE(r.body.find(needle), std::string::npos) << r.body;
    EXPECT_NO_THROW(json::parse(r.body)) << r.body;
  };
  expect(raw(std::string(5000, ' ')), 413, "error");
  expect(raw("{\"prompt\": \"x\", "), 400, "error");
  expect(raw(R"({"prompt": "x", "max_tokens": "many"})"), 400, "max_tokens");
  expect(raw(R"({"prompt": 42})"), 400, "prompt");
  expect(raw(R"({"prompt": "x", "n": 65})"), 400, "n");
  expect(raw(R"({"prompt": "x", "max_tokens": 1000})"), 400, "100");
  expect(raw(R"({"prompt": "x", "temperature": -1})"), 400, "temperature");
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += "word ";
  expect(raw(json({{"prompt", long_prompt}, {"max_tokens", 10}}).dump()), 400, "context");
  expect(raw(R"({"prompt": [1, 5, 99999]})"), 400, "99999");
  expect(test::http_request(s.port(), "GET", "/v1/nothing"), 404, "error");
  expect(test::http_request(s.port(), "DELETE", "/v1/completions"), 405, "error");
  // Still serving, and health/ready/models/metrics answer.
  auto ok = s.complete({{"prompt", "A fool"}, {"max_tokens", 3}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(test::http_request(s.port(), "GET", "/health").status, 200);
  EXPECT_EQ(test::http_request(s.port(), "GET", "/ready").status, 200);
  auto models = test::http_request(s.port(), "GET", "/v1/models");
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "fortune");
  auto metrics = test::http_request(s.port(), "GET", "/metrics");
  EXPECT_NE(metrics.body.find("troupe_requests_total{status=\"400\"}"), std::string::npos);
  EXPECT_NE(metrics.body.find("troupe_time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_NE(metrics.body.find("troupe_kv_blocks"), std::string::npos);
}

// A prompt of a megabyte takes the tokenizer more than a second; it runs
// off the io thread, so a short request sent after it is answered first,
// and a long prompt that fits gives the text it would give on one device.
TEST(Serve, ALongPromptIsTokenizedWithoutHoldingUpOtherRequests) {
  Server s({});
  const std::string huge = json({{"prompt", std::string(1000000, ' ')}, {"max_tokens", 1}}).dump();
  std::atomic<bool> huge_done{false};
  HttpResponse huge_answer;
  std::thread t([&] {
    huge_answer = test::http_request(s.port(), "POST", "/v1/completions", huge, 120);
    huge_done = true;
  });
  // Sent once the big body is in (the server's /metrics would not say when).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const HttpResponse small =
      s.complete({{"prompt", "The meaning of life"}, {"max_tokens", 4}, {"temperature", 0}});
  const bool small_first = !huge_done;
  t.join();
  EXPECT_EQ(small.status, 200) << small.body;
  EXPECT_TRUE(small_first) << "the short request waited for the long prompt's tokenizer";
  EXPECT_EQ(huge_answer.status, 400) << huge_answer.body;
  EXPECT_NE(huge_answer.body.find("context_length_exceeded"), std::string::npos)
      << huge_answer.body;

  std::string long_prompt;
  while (long_prompt.size() < 1100) long_prompt += "wonderful ";
  long_prompt += "The meaning of life";
  const HttpResponse r =
      s.complete({{"prompt", long_prompt}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], generate_text(long_prompt, 8));
}

TEST(Serve, OverloadGets429WithRetryAfter) {
  Server s({"admission.max_queue=1", "batching.max_batch_sequences=1", "batching.max_waiting=1"});
  std::vector<int> status(12);
  std::vector<std::string> retry(12);
  std::vector<std::thread> clients;
  for (int i = 0; i < 12; ++i)
    clients.emplace_back([&, i] {
      auto r = s.complete({{"prompt", "The meaning of life"}, {"max_tokens", 30}});
      status[size_t(i)] = r.status;
      retry[size_t(i)] = r.header("Retry-After");
    });
  for (auto& c : clients) c.join();
  int n429 = 0, n200 = 0;
  for (int i = 0; i < 12; ++i) {
    if (status[size_t(i)] == 429) {
      ++n429;
      EXPECT_FALSE(retry[size_t(i)].empty());
    }
    if (status[size_t(i)] == 200) ++n200;
  }
  EXPECT_GE(n429, 1);
  EXPECT_GE(n200, 1);
  EXPECT_EQ(n429 + n200, 12);
  EXPECT_EQ(s.complete({{"prompt", "A fool"}, {"max_tokens", 2}}).status, 200);
}

TEST(Serve, ReplicaKilledMidGenerationLosesNothingAndStreamsNoDuplicates) {
  Server s(
      {"parallel.replicas=2", "devices=[{kind: cpu, threads: 1}]", "routing.policy=round_robin"});
  std::vector<std::string> want;
  for (const auto& p : kPrompts) want.push_back(generate_text(p, 120));
  std::vector<std::string> got(kPrompts.size());
  std::vector<int> status(kPrompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    clients.emplace_back([&, i] {
      auto r = s.complete(
          {{"prompt", kPrompts[i]}, {"max_tokens", 120}, {"temperature", 0}, {"stream", true}});
      status[i] = r.status;
      got[i] = sse_text(r.body);
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  s.process().signal(SIGUSR1);  // crash replica 0 mid-generation
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  s.process().signal(SIGUSR2);  // and then replica 1
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(status[i], 200);
    EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  }
  auto metrics = test::http_request(s.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("troupe_replica_restarts_total"), std::string::npos) << metrics;
  EXPECT_NE(s.process().wait_for_line("restarting", 5), "");
}

// ---- SIGTERM / SIGINT: nothing accepted ends in silence ----

const HttpHeaders kAdmin{{"Authorization", "Bearer T"}};

// Slows every step of a replica `factor`-fold for a minute, so that
// requests stay in flight while the test signals the server.
void slow_down(Server& s, double factor, int replica = 0) {
  const HttpResponse r = test::http_request(
      s.port(), "POST", "/admin/faults",
      json({{"kind", "slow"}, {"replica", replica}, {"factor", factor}, {"duration_s", 60}}).dump(),
      10, kAdmin);
  ASSERT_EQ(r.status, 201) << r.body;
}

// Waits until `n` sequences run (the requests were accepted and are in
// their steps).
bool wait_running(Server& s, int n) {
  return s.wait_metric("troupe_running_sequences", std::to_string(n), 60);
}

// Waits until at least `n` sequences run.
bool wait_running_at_least(Server& s, int n) {
  for (int i = 0; i < 1200; ++i) {
    const std::string v = test::prometheus_sample(s.metrics(), "troupe_running_sequences");
    if (!v.empty() && std::stod(v) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Penalties and bias (and vLLM's bad_words and min_tokens, and structured
// output's grammars): they change what greedy picks, a layout gives the same
// text, and requests resumed on another replica after a crash (their
// penalties and grammar states rebuilt from the tokens so far) give the text
// they would have.
TEST(Serve, PenaltiesAndBiasAreTheSameInALayoutAndAfterACrash) {
  auto ask = [](size_t i) {
    json r{{"prompt", kPrompts[i]}, {"max_tokens", 80}, {"seed", 5 + i}, {"stream", true}};
    r["temperature"] = i % 2 ? 0.8 : 0.0;
    r["frequency_penalty"] = 0.3 * double(i % 3);
    r["presence_penalty"] = i % 3 == 1 ? 0.7 : -0.2;
    r["repetition_penalty"] = i % 2 ? 1.3 : 1.0;
    if (i == 4) r["logit_bias"] = {{"100", -100}, {"13", 3}};
    // vLLM's options that count the output: rebuilt from it after a crash.
    if (i == 2) r["bad_words"] = {"is", "the"};
    if (i == 3) r["min_tokens"] = 70;
    // Structured output: the grammar's state rebuilt from the tokens so far.
    if (i == 0) r["response_format"] = {{"type", "json_object"}};
    if (i == 5) r["guided_grammar"] = "root ::= (\"[\" [a-z ]+ \"] \")+";
    return r;
  };
  auto text_of = [](Server& s, const json& req) {
    const auto r = s.complete(req);
    EXPECT_EQ(r.status, 200) << r.body;
    return sse_text(r.body);
  };
  std::vector<std::string> want;
  {
    Server one({"devices=[{kind: cpu, threads: 1}]"});
    for (size_t i = 0; i < kPrompts.size(); ++i) want.push_back(text_of(one, ask(i)));
    // Greedy leaves its path under a strong frequency penalty.
    json plain{{"prompt", kPrompts[0]}, {"max_tokens", 80}, {"temperature", 0}, {"stream", true}};
    json penalized = plain;
    penalized["frequency_penalty"] = 2;
    EXPECT_NE(text_of(one, plain), text_of(one, penalized));
    // +100 makes one id the only choice, whatever the model says.
    const auto forced = one.complete({{"prompt", kPrompts[1]},
                                      {"max_tokens", 6},
                                      {"temperature", 0},
                                      {"return_token_ids", true},
                                      {"logit_bias", {{"100", 100}}}});
    ASSERT_EQ(forced.status, 200) << forced.body;
    EXPECT_EQ(json::parse(forced.body)["choices"][0]["token_ids"], json(std::vector<int>(6, 100)));
  }
  {
    Server tp({"parallel.tensor=2", "devices=[{kind: cpu, threads: 1}]"});
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(text_of(tp, ask(i)), want[i]) << i;
  }
  Server s({"parallel.replicas=2", "devices=[{kind: cpu, threads: 1}]",
            "routing.policy=round_robin", "admin.faults=true", "admin.token=T"});
  // Both up and slowed, so that replica 0 surely has requests mid-generation
  // when it crashes, however loaded the machine is.
  ASSERT_TRUE(s.wait_replicas_ready(2));
  slow_down(s, 20, 0);
  slow_down(s, 20, 1);
  std::vector<std::string> got(kPrompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    clients.emplace_back([&, i] { got[i] = text_of(s, ask(i)); });
  // More than replica 1's half: replica 0 runs some.
  EXPECT_TRUE(wait_running_at_least(s, int(kPrompts.size()) / 2 + 1));
  s.process().signal(SIGUSR1);  // crash replica 0
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  // The crash caught requests mid-generation ("N requests to resume", N > 0).
  const std::string down = s.process().wait_for_line("requests to resume", 5);
  EXPECT_NE(down, "");
  EXPECT_EQ(down.find(" 0 requests to resume"), std::string::npos) << down;
}

// vLLM's min_tokens, stop_token_ids, min_p, allowed_token_ids, bad_words,
// include_stop_str_in_output and truncate_prompt_tokens, as a client of
// vLLM uses them: min_tokens carries
// greedy text past the end-of-sequence it would stop at (stop strings too
// are looked for only after it), the same in a tensor layout; a stop id ends
// the text before it; min_p 1 leaves only the likeliest token, so sampling
// gives the greedy text; the stop string can end the text; a truncated
// prompt answers as its last tokens sent alone.
TEST(Serve, VllmSamplingAndTextOptions) {
  auto ask = [](Server& s, json req) {
    req["prompt"] = "A fool";
    req["return_token_ids"] = true;
    const auto r = s.complete(req);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["choices"][0];
  };
  Server one({"devices=[{kind: cpu, threads: 1}]"});
  const json plain = ask(one, {{"max_tokens", 100}, {"temperature", 0}});
  ASSERT_EQ(plain["finish_reason"], "stop");  // this prompt ends on EOS, well before 100
  const auto ids = plain["token_ids"].get<std::vector<int>>();
  ASSERT_GT(ids.size(), 4u);
  const int at_least = int(ids.size()) + 10;
  const json longer = ask(one, {{"max_tokens", 100}, {"temperature", 0}, {"min_tokens", at_least}});
  const auto more = longer["token_ids"].get<std::vector<int>>();
  ASSERT_GE(int(more.size()), at_least);
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), more.begin()));  // the same path up to EOS
  {
    Server tp({"parallel.tensor=2", "devices=[{kind: cpu, threads: 1}]"});
    EXPECT_EQ(ask(tp, {{"max_tokens", 100}, {"temperature", 0}, {"min_tokens", at_least}}), longer);
  }
  // A stop string inside the first min_tokens tokens' text does not end it.
  const std::string text = plain["text"];
  const std::string early = text.substr(0, 4);
  const json unstopped = ask(
      one, {{"max_tokens", 100}, {"temperature", 0}, {"min_tokens", at_least}, {"stop", {early}}});
  EXPECT_EQ(unstopped["text"], longer["text"]);
  EXPECT_EQ(ask(one, {{"max_tokens", 100}, {"temperature", 0}, {"stop", {early}}})["text"], "");
  // The third token as a stop id: two tokens, finish "stop".
  size_t third = 2;
  while (std::find(ids.begin(), ids.begin() + long(third), ids[third]) != ids.begin() + long(third))
    ++third;
  const json stopped =
      ask(one, {{"max_tokens", 100}, {"temperature", 0}, {"stop_token_ids", {ids[third], 1}}});
  EXPECT_EQ(stopped["finish_reason"], "stop");
  EXPECT_EQ(stopped["token_ids"], json(std::vector<int>(ids.begin(), ids.begin() + long(third))));
  // min_p 1: whatever the temperature and seed, the greedy text.
  for (int seed : {1, 2})
    EXPECT_EQ(
        ask(one,
            {{"max_tokens", 30}, {"temperature", 1.5}, {"seed", seed}, {"min_p", 1}})["token_ids"],
        json(std::vector<int>(ids.begin(), ids.begin() + long(std::min<size_t>(30, ids.size())))));
  EXPECT_EQ(one.complete({{"prompt", "A fool"}, {"max_tokens", 5}, {"min_tokens", 6}}).status, 400);
  // allowed_token_ids: every id drawn is one of them.
  const std::vector<int> allowed(ids.begin(), ids.begin() + 4);
  const json only = ask(
      one, {{"max_tokens", 20}, {"temperature", 0.9}, {"seed", 4}, {"allowed_token_ids", allowed}});
  for (const json& id : only["token_ids"])
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), id.get<int>()), allowed.end()) << id;
  // bad_words: the word's token is never drawn, where greedy drew it.
  const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  const std::vector<int> man = tok.encode("man", false);
  ASSERT_EQ(man.size(), 1u);
  ASSERT_NE(std::find(ids.begin(), ids.end(), man[0]), ids.end());  // greedy says "man"
  const json clean = ask(one, {{"max_tokens", 100}, {"temperature", 0}, {"bad_words", {"man"}}});
  const auto clean_ids = clean["token_ids"].get<std::vector<int>>();
  EXPECT_EQ(std::find(clean_ids.begin(), clean_ids.end(), man[0]), clean_ids.end());
  EXPECT_NE(clean_ids, ids);
  // include_stop_str_in_output: the text ends with the stop string.
  EXPECT_EQ(ask(one, {{"max_tokens", 100},
                      {"temperature", 0},
                      {"stop", {early}},
                      {"include_stop_str_in_output", true}})["text"],
            early);
  // truncate_prompt_tokens: the prompt's last 2 tokens, as if sent alone.
  const auto kept = one.complete({{"prompt", "The meaning of life"},
                                  {"max_tokens", 8},
                                  {"temperature", 0},
                                  {"truncate_prompt_tokens", 2},
                                  {"echo", true}});
  ASSERT_EQ(kept.status, 200) << kept.body;
  const json k = json::parse(kept.body);
  EXPECT_EQ(k["usage"]["prompt_tokens"], 2);
  const auto last_two = tok.encode("The meaning of life", true);
  const auto alone = one.complete({{"prompt", std::vector<int>(last_two.end() - 2, last_two.end())},
                                   {"max_tokens", 8},
                                   {"temperature", 0},
                                   {"echo", true}});
  ASSERT_EQ(alone.status, 200) << alone.body;
  EXPECT_EQ(k["choices"][0]["text"], json::parse(alone.body)["choices"][0]["text"]);
}

// An orderly life (start, a request, SIGTERM) is not a fault: nothing in it
// is logged as a warning (a replica waiting for this process's own node at
// start-up, or the node losing its coordinator at shutdown, used to be).
TEST(Serve, AnOrderlyStartAndShutdownLogNoWarning) {
  Server s({"logging.level=info"});
  const HttpResponse r = s.complete({{"prompt", "A fool"}, {"max_tokens", 4}}, 60);
  EXPECT_EQ(r.status, 200) << r.body;
  s.process().signal(SIGTERM);
  EXPECT_EQ(s.process().wait_exit(30), 0);
  const std::string log = s.process().stderr_so_far();
  EXPECT_NE(log.find("signal 15: shutting down"), std::string::npos) << log;
  EXPECT_EQ(log.find("[warning]"), std::string::npos) << log;
  EXPECT_EQ(log.find("[error]"), std::string::npos) << log;
}

TEST(Serve, SigtermEndsEveryOpenRequestWithAClearErrorThenExits) {
  for (int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    Server s({"admin.faults=true", "admin.token=T", "server.shutdown_grace_s=0"});
    slow_down(s, 50);
    HttpResponse plain, streamed;
    std::string streamed_body;  // as it comes
    std::atomic<bool> tokens_flow{false};
    std::thread a([&] {
      plain = s.complete({{"prompt", "A fool"}, {"max_tokens", 240}, {"ignore_eos", true}}, 60);
    });
    std::thread b([&] {
      HttpClient client(test::loopback_client(s.port(), 60));
      const json body = {
          {"prompt", "Love is"}, {"max_tokens", 240}, {"ignore_eos", true}, {"stream", true}};
      HttpRequest post;
      post.method = "POST";
      post.target = "/v1/completions";
      post.body = body.dump();
      post.keep_alive = false;
      streamed = client.request(post, [&](const HttpResponse&, std::string_view piece) {
        streamed_body += piece;
        if (streamed_body.find("\"text\"") != std::string::npos) tokens_flow = true;
        return true;
      });
    });
    ASSERT_TRUE(wait_running(s, 2)) << s.metrics();
    // The stream has started (its first tokens came) before the signal.
    for (int i = 0; i < 1200 && !tokens_flow; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(tokens_flow);
    s.process().signal(sig);
    a.join();
    b.join();
    streamed.body = streamed_body;
    // Not streaming: a 503 with a JSON body that says why.
    EXPECT_EQ(plain.status, 503) << plain.body;
    EXPECT_TRUE(plain.complete());
    EXPECT_NE(plain.body.find("shutting down"), std::string::npos) << plain.body;
    EXPECT_NO_THROW(json::parse(plain.body)) << plain.body;
    EXPECT_FALSE(plain.header("Retry-After").empty());
    // Streaming: its tokens so far, then an error event, then [DONE], and
    // the chunked body ends properly.
    EXPECT_EQ(streamed.status, 200) << streamed.body;
    EXPECT_TRUE(streamed.complete()) << streamed.body;
    const size_t error = streamed.body.find("data: {\"error\"");
    EXPECT_NE(error, std::string::npos) << streamed.body;
    EXPECT_NE(streamed.body.find("shutting down", error), std::string::npos) << streamed.body;
    EXPECT_NE(streamed.body.find("\"status\":503", error), std::string::npos) << streamed.body;
    const std::string done = "data: [DONE]\n\n";
    ASSERT_GE(streamed.body.size(), done.size());
    EXPECT_EQ(streamed.body.substr(streamed.body.size() - done.size()), done) << streamed.body;
    // And the process is gone, cleanly.
    EXPECT_EQ(s.process().wait_exit(30), 0) << s.process().stderr_so_far();
  }
}

// With a grace period, the requests in flight finish (those that come
// meanwhile get 503 at once, /ready too), and the process exits as soon
// as they have.
TEST(Serve, SigtermLetsRequestsInFlightFinishWithinTheGracePeriod) {
  Server s({"admin.faults=true", "admin.token=T", "server.shutdown_grace_s=120"});
  const std::string want = generate_text("The meaning of life", 30);
  slow_down(s, 50);  // the request takes seconds: SIGTERM and the next one come meanwhile
  HttpResponse first;
  std::thread a([&] {
    first = s.complete({{"prompt", "The meaning of life"}, {"max_tokens", 30}, {"temperature", 0}},
                       120);
  });
  ASSERT_TRUE(wait_running(s, 1)) << s.metrics();
  s.process().signal(SIGTERM);
  ASSERT_NE(s.process().wait_for_line("shutting down", 20), "") << s.process().stderr_so_far();
  const HttpResponse late = s.complete({{"prompt", "A fool"}, {"max_tokens", 5}}, 20);
  EXPECT_EQ(late.status, 503) << late.body;
  EXPECT_NE(late.body.find("shutting down"), std::string::npos) << late.body;
  EXPECT_FALSE(late.header("Retry-After").empty());
  EXPECT_EQ(test::http_request(s.port(), "GET", "/ready").status, 503);
  a.join();
  EXPECT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(json::parse(first.body)["choices"][0]["text"], want);
  EXPECT_EQ(s.process().wait_exit(60), 0) << s.process().stderr_so_far();
}

// ---- /v1/chat/completions: a completion of the rendered messages ----

const json kMessages = json::array({{{"role", "system"}, {"content", "You are wise."}},
                                    {{"role", "user"}, {"content", "Tell me a fortune"}}});

HttpResponse chat(Server& s, json body) {
  body["messages"] = kMessages;
  return test::http_request(s.port(), "POST", "/v1/chat/completions", body.dump(), 120);
}

// The text of a chat stream, checking its shape: the role first, content
// deltas, the finish reason in an empty delta, then usage and [DONE].
std::string chat_stream_text(const std::string& body, std::string* finish, json* usage) {
  std::string text;
  bool role = false, done = false;
  for (const std::string& payload : sse_events(body)) {
    EXPECT_FALSE(done) << "data after [DONE]";
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(payload);
    EXPECT_EQ(j["object"], "chat.completion.chunk") << payload;
    if (j["choices"].empty()) {
      *usage = j["usage"];
      continue;
    }
    const json& delta = j["choices"][0]["delta"];
    EXPECT_EQ(delta.contains("role"), !role) << payload;
    role = true;
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) {
      EXPECT_TRUE(finish->empty()) << "a second finish_reason";
      *finish = j["choices"][0]["finish_reason"];
      EXPECT_EQ(delta, json::object());
    }
  }
  EXPECT_TRUE(done) << "no data: [DONE]";
  return text;
}

void expect_chat_equals_completion(Server& s, const std::string& rendered, const json& sampling) {
  json body = sampling;
  body["max_tokens"] = 24;
  body["prompt"] = rendered;
  auto plain = s.complete(body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json want = json::parse(plain.body);
  body.erase("prompt");

  auto r = chat(s, body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u) << j["id"];
  EXPECT_EQ(j["model"], "fortune");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], want["choices"][0]["text"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], want["choices"][0]["finish_reason"]);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  auto counts = [](json usage) {
    usage.erase("prompt_tokens_details");
    return usage;
  };
  EXPECT_EQ(counts(j["usage"]), counts(want["usage"]));
  // The same prompt again: the completion left its full blocks (of 16) in
  // the prefix cache, all but its last token's.
  const int cached = (want["usage"]["prompt_tokens"].get<int>() - 1) / 16 * 16;
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], cached);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto st = chat(s, body);
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_NE(st.header("Content-Type").find("text/event-stream"), std::string::npos);
  std::string finish;
  json usage;
  EXPECT_EQ(chat_stream_text(st.body, &finish, &usage), want["choices"][0]["text"]);
  EXPECT_EQ(finish, want["choices"][0]["finish_reason"]);
  EXPECT_EQ(counts(usage), counts(want["usage"]));
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], cached);
}

TEST(Serve, ChatIsTheCompletionOfItsRenderedMessages) {
  Server s({});
  const std::string rendered = "System: You are wise.\nUser: Tell me a fortune\nAssistant:";
  expect_chat_equals_completion(s, rendered, {{"temperature", 0}});
  expect_chat_equals_completion(s, rendered, {{"temperature", 0.8}, {"seed", 7}});

  auto bad = test::http_request(
      s.port(), "POST", "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(json::parse(bad.body)["error"]["param"], "messages[0].content[0].type");
  auto unknown = chat(s, {{"model", "gpt-4"}});
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  EXPECT_EQ(json::parse(unknown.body)["error"]["code"], "model_not_found");
  auto model = test::http_request(s.port(), "GET", "/v1/models/fortune");
  EXPECT_EQ(model.status, 200);
  EXPECT_EQ(json::parse(model.body)["id"], "fortune");
  EXPECT_EQ(test::http_request(s.port(), "GET", "/v1/models/gpt-4").status, 404);
}

TEST(Serve, ChatTemplateIsTheConfiguredOne) {
  Server s({"server.chat_template=llama2"});
  expect_chat_equals_completion(
      s, "[INST] <<SYS>>\nYou are wise.\n<</SYS>>\n\nTell me a fortune [/INST]",
      {{"temperature", 0}});
  const test::Refusal r = test::serve_until_exit({"server.chat_template=chatgpt"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("server.chat_template"), std::string::npos) << r.stderr_text;
}

// chat_template: auto (the default) takes the model's own template from its
// tokenizer_config.json when it is one the server renders (here TinyLlama-
// Chat's, as published), and plain for a model without one.
TEST(Serve, AutoChatTemplateIsTheModelsOwn) {
  test::TempDir tmp;
  const std::filesystem::path dir = tmp / "fortune";
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model"})
    std::filesystem::create_symlink(test::model_path("fortune") / f, dir / f);
  const json config = {
      {"chat_template",
       "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
       "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
       "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
       "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif "
       "%}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif "
       "%}\n{% endfor %}"},
      {"eos_token", "</s>"}};
  test::write_file(dir / "tokenizer_config.json", config.dump());
  Server s({"model.path=" + dir.string()});
  expect_chat_equals_completion(
      s, "<|system|>\nYou are wise.</s>\n<|user|>\nTell me a fortune</s>\n<|assistant|>\n",
      {{"temperature", 0}});
}

// A llama.cpp GGUF file serves as it is: its quantized weights, its
// vocabulary and its own chat template (tokenizer.chat_template), rendered
// with the file's EOS spelling.
TEST(Serve, GgufFileServesWithItsOwnVocabularyAndChatTemplate) {
  Server s(
      {"model.path=" + test::data_path("gguf/llama-q4_k_m.gguf").string(), "model.name=fortune"});
  expect_chat_equals_completion(
      s, "<|system|>\nYou are wise.</s>\n<|user|>\nTell me a fortune</s>\n<|assistant|>\n",
      {{"temperature", 0}});
}

// The flags users type first, as vLLM's and llama-server's: --model and
// --served-model-name override model.path and model.name; --host and
// --port, server.listen's parts.
TEST(Serve, ModelFlagsOverrideTheConfig) {
  const std::string stories = (test::model_path("stories260K") / "stories260K.bin").string();
  const auto r = test::run_command({test::troupe_binary(), "serve", "-m", stories,
                                    "--served-model-name", "tiny-stories", "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("path: " + stories), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("name: tiny-stories"), std::string::npos) << r.out;
  const auto hp = test::run_command(
      {test::troupe_binary(), "serve", "--host", "0.0.0.0", "--port", "9000", "--print-config"});
  ASSERT_EQ(hp.exit_code, 0) << hp.err;
  EXPECT_NE(hp.out.find("listen: 0.0.0.0:9000"), std::string::npos) << hp.out;
  const auto port =
      test::run_command({test::troupe_binary(), "serve", "--port", "0", "--print-config"});
  EXPECT_NE(port.out.find("listen: 127.0.0.1:0"), std::string::npos) << port.out;
  const auto v6 =
      test::run_command({test::troupe_binary(), "serve", "--host", "::1", "--print-config"});
  EXPECT_NE(v6.out.find("listen: \"[::1]:8080\""), std::string::npos) << v6.out;
  const auto both = test::run_command(
      {test::troupe_binary(), "serve", "--port", "1", "--listen", "a:2", "--print-config"});
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--listen"), std::string::npos) << both.err;
}

TEST(Serve, BadConfigStopsStartUpNamingTheKey) {
  test::TempDir tmp;
  test::write_file(tmp / "bad.yaml", "batching:\n  max_batch_tokens: lots\n");
  auto r =
      test::run_command({test::troupe_binary(), "serve", "--config", (tmp / "bad.yaml").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("batching.max_batch_tokens"), std::string::npos) << r.err;
  test::write_file(tmp / "typo.yaml", "routing:\n  polcy: round_robin\n");
  r = test::run_command({test::troupe_binary(), "serve", "--config", (tmp / "typo.yaml").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("routing.polcy"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Every layout serves the same text as one device, greedy and seeded, also
// after one of its shards is killed mid-step (the shard group is rebuilt and
// resumed).
TEST(ServeLayouts, EveryLayoutServesTheSameAnswer) {
  std::vector<std::string> want;
  for (const auto& p : kPrompts) want.push_back(generate_text(p, 60));
  // Sampling turns a logit's last bit into another token now and then (with
  // sums in another order this prompt and seed diverged at tensor = 2).
  const json sampled{{"prompt", "Prompt number 15 says"},
                     {"max_tokens", 240},
                     {"temperature", 0.8},
                     {"top_p", 0.95},
                     {"seed", 15},
                     {"ignore_eos", true}};
  const std::string want_sampled =
      generate_text("Prompt number 15 says", 240,
                    {"--temperature", "0.8", "--top-p", "0.95", "--seed", "15", "--ignore-eos"});
  for (const char* layout : {"parallel={replicas: 1, pipeline: 1, tensor: 2}",
                             "parallel={replicas: 1, pipeline: 2, tensor: 1}",
                             "parallel={replicas: 1, pipeline: 2, tensor: 2}",
                             "parallel={replicas: 1, pipeline: 3, tensor: 1}",
                             "parallel={replicas: 2, pipeline: 1, tensor: 2}"}) {
    // Round robin: the requests after the kill reach replica 0 for sure.
    Server s({layout, "devices=[{kind: cpu, threads: 1}]", "routing.policy=round_robin"});
    // The server answers once one replica is ready; round robin reaches
    // replica 0 for sure only once every replica is.
    const int replicas = std::string(layout).find("replicas: 2") != std::string::npos ? 2 : 1;
    for (int tries = 0; tries < 600; ++tries) {
      const std::string m = test::http_request(s.port(), "GET", "/metrics").body;
      int ready = 0;
      for (int r = 0; r < replicas; ++r)
        if (m.find("troupe_replica_state{replica=\"" + std::to_string(r) + "\"} 2") !=
            std::string::npos)
          ++ready;
      if (ready == replicas) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::vector<std::string> got(kPrompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < kPrompts.size(); ++i)
      clients.emplace_back([&, i] {
        auto r = s.complete(
            {{"prompt", kPrompts[i]}, {"max_tokens", 60}, {"temperature", 0}, {"stream", true}});
        if (r.status == 200) got[i] = sse_text(r.body);
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s.process().signal(SIGUSR1);  // a shard dies mid-step
    for (auto& c : clients) c.join();
    for (size_t i = 0; i < kPrompts.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << layout << " prompt " << i;
    {
      auto r = s.complete(sampled);
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(), want_sampled)
          << layout << " seeded";
    }
    // The shard dies at its next step: if the clients were done before it,
    // these requests take it there. Either way it is served right, and
    // replica 0 was restarted exactly once.
    for (int k = 0; k < 2; ++k) {
      auto again = s.complete({{"prompt", kPrompts[0]}, {"max_tokens", 60}, {"temperature", 0}});
      ASSERT_EQ(again.status, 200) << again.body;
      EXPECT_EQ(json::parse(again.body)["choices"][0]["text"].get<std::string>(), want[0]);
    }
    // The supervisor counts the restart when it hears of the death, which
    // can be after a request resumed elsewhere has been answered.
    const std::string restarted = "troupe_replica_restarts_total{replica=\"0\"} ";
    std::string metrics;
    for (int tries = 0; tries < 100; ++tries) {
      metrics = test::http_request(s.port(), "GET", "/metrics").body;
      if (metrics.find(restarted) != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_NE(metrics.find(restarted + "1\n"), std::string::npos) << layout << "\n" << metrics;
    // Per-stage figures in /metrics.
    EXPECT_NE(metrics.find("troupe_stage_comm_share{"), std::string::npos) << layout;
    EXPECT_NE(metrics.find("troupe_stage_bubble_fraction{"), std::string::npos) << layout;
    if (std::string(layout).find("pipeline: 2") != std::string::npos) {
      EXPECT_NE(metrics.find("stage=\"1\""), std::string::npos) << layout;
    }
  }
  // A layout that does not fit is refused at start-up with the reason.
  auto r = test::run_command({test::troupe_binary(), "serve", "--set",
                              "model.path=" + test::model_path("fortune").string(), "--set",
                              "parallel.tensor=4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("6 attention heads"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// `kind: auto` serves on CUDA where a GPU answers and on the CPU elsewhere,
// with the same greedy text; `kind: cuda` without a GPU refuses to start,
// saying why.
TEST(ServeDevices, AutoServesAndCudaWithoutAGpuIsRefused) {
  std::string why;
  const bool gpu = EngineBuilder::cuda_available(&why);
  test::Server s({"devices=[{kind: auto, threads: 1}]"});
  const auto r =
      s.complete({{"prompt", "The meaning of life"}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  if (!gpu) {
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"],
              test::generate_text("The meaning of life", 24));
  }
  if (gpu) GTEST_SKIP() << "a CUDA device answers here (" << why << ")";
  const test::Refusal refused = test::serve_until_exit({"devices=[{kind: cuda}]"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.stderr_text.find("kind cuda, but"), std::string::npos) << refused.stderr_text;
}

}  // namespace
}  // namespace troupe
