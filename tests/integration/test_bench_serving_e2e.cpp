// `troupe bench` serving mode end to end: the load generator against a small
// fake server on 127.0.0.1.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "apps/bench_serving.h"
#include "net/http_framing.h"
#include "support/scripted_server.h"
#include "support/sse_samples.h"

namespace troupe::app::serving_bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using nlohmann::json;

struct FakeConfig {
  int tokens = 5;
  bool usage = true;
  bool chunked = true;      // else close-delimited: Connection: close, no length
  int reject_every = 0;     // every k-th completion (1-based) gets 429
  int vocab = 64;           // in /v1/models; 0 = not advertised
  bool models_404 = false;  // no /v1/models at all
  double stall_s = 0;       // before the first byte of a completion
  int max_model_len = 0;    // in /v1/models; 0 = not advertised
  std::string api_key;      // not empty: requests without "Bearer <api_key>" get 401
};

// Answers /v1/completions with a fixed SSE stream written in small uneven
// pieces, so that events, lines and "\n\n" pairs are cut at odd places.
class FakeServer {
 public:
  explicit FakeServer(FakeConfig cfg)
      : cfg_(cfg), server_([this](const Request& r, Connection& c) { return answer(r, c); }) {}

  std::string url() const { return server_.url(); }
  std::vector<json> bodies() {
    std::lock_guard lock(m_);
    return bodies_;
  }
  int max_active() const { return max_active_; }
  int connections() const { return server_.connections(); }

 private:
  using Request = test::ScriptedServer::Request;
  using Connection = test::ScriptedServer::Connection;

  bool answer(const Request& req, Connection& c) {
    if (!cfg_.api_key.empty() && req.header("Authorization") != "Bearer " + cfg_.api_key) {
      c.respond(401, R"({"error":{"message":"Incorrect API key provided."}})", {}, req.keep_alive);
      return true;
    }
    if (req.target == "/v1/models") {
      json models = {{"object", "list"}, {"data", {{{"id", "fake-model"}, {"object", "model"}}}}};
      if (cfg_.vocab > 0) models["data"][0]["vocab_size"] = cfg_.vocab;
      if (cfg_.max_model_len > 0) models["data"][0]["max_model_len"] = cfg_.max_model_len;
      c.respond(cfg_.models_404 ? 404 : 200, models.dump(), {}, req.keep_alive);
      return true;
    }
    if (req.target != "/v1/completions") {
      c.respond(404, "{}", {}, req.keep_alive);
      return true;
    }
    int k;
    bool streamed;
    {
      std::lock_guard lock(m_);
      bodies_.push_back(json::parse(req.body));
      k = int(bodies_.size());
      streamed = bodies_.back().value("stream", false);
    }
    if (cfg_.reject_every > 0 && k % cfg_.reject_every == 0) {
      c.respond(429, R"({"error":{"message":"queue full"}})", {{"Retry-After", "1"}},
                req.keep_alive);
      return true;
    }
    const int now = ++active_;
    for (int seen = max_active_; now > seen && !max_active_.compare_exchange_weak(seen, now);) {
    }
    const bool keep = streamed ? stream(c) : whole(c, req.keep_alive);
    --active_;
    return keep;
  }

  // A non-streamed completion: one JSON body.
  bool whole(Connection& c, bool keep_alive) {
    if (!c.pause(cfg_.stall_s)) return false;
    json body = {{"object", "text_completion"},
                 {"choices", {{{"index", 0}, {"text", "x"}, {"finish_reason", "length"}}}}};
    if (cfg_.usage)
      body["usage"] = {{"prompt_tokens", 40},
                       {"completion_tokens", cfg_.tokens},
                       {"total_tokens", 40 + cfg_.tokens},
                       {"prompt_tokens_details", {{"cached_tokens", 32}}}};
    return c.respond(200, body.dump(), {}, keep_alive) && keep_alive;
  }

  // Returns whether the connection stays open.
  bool stream(Connection& c) {
    if (!c.pause(cfg_.stall_s)) return false;
    const std::string sse = test::sample_stream(cfg_.tokens, cfg_.usage);
    bool ok = c.write(
        std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n") +
        (cfg_.chunked ? "Transfer-Encoding: chunked\r\n\r\n" : "Connection: close\r\n\r\n"));
    static constexpr size_t kPieces[] = {1, 7, 13, 2, 29, 5, 61};
    size_t at = 0;
    for (int i = 0; at < sse.size() && ok; ++i) {
      const size_t n = std::min(kPieces[i % 7], sse.size() - at);
      ok = c.write(http_framing::stream_data(std::string_view(sse).substr(at, n), cfg_.chunked));
      at += n;
    }
    if (ok) ok = c.write(http_framing::stream_end(cfg_.chunked));
    // Close-delimited: the connection ends the body.
    return ok && cfg_.chunked;
  }

  FakeConfig cfg_;
  std::mutex m_;
  std::vector<json> bodies_;
  std::atomic<int> active_{0}, max_active_{0};
  test::ScriptedServer server_;  // last: its threads call answer()
};

ServingBenchOptions closed_loop(const std::string& url, int c, int n) {
  ServingBenchOptions o;
  o.url = url;
  o.concurrency = c;
  o.requests = n;
  o.prompt_len = 40;
  o.output_len = 5;
  o.timeout_s = 20;
  return o;
}

TEST(BenchServingEndToEnd, ClosedLoopAllComplete) {
  FakeServer server({});
  const auto r = run_serving_bench(closed_loop(server.url(), 2, 6));
  EXPECT_EQ(r.completed, 6);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.output_tokens, 30);
  EXPECT_EQ(r.model, "fake-model");
  EXPECT_EQ(r.vocab, 64);
  EXPECT_EQ(r.vocab_source, "server");
  EXPECT_LE(server.max_active(), 2);
  EXPECT_EQ(server.connections(), 3) << "the probe, then one kept-alive connection per worker";
  for (const auto& q : r.requests) {
    EXPECT_TRUE(q.ok) << q.error;
    EXPECT_EQ(q.status, 200);
    EXPECT_EQ(q.output_tokens, 5);
    EXPECT_GE(q.ttft_s, 0);
    EXPECT_GE(q.tpot_s, 0);
    EXPECT_GE(q.latency_s, q.ttft_s);
  }

  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 6u);
  std::set<std::vector<int>> prompts;
  for (const auto& b : bodies) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["max_tokens"], 5);
    EXPECT_EQ(b["temperature"], 0);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    const auto ids = b["prompt"].get<std::vector<int>>();
    ASSERT_EQ(ids.size(), 40u);
    for (const int id : ids) {
      EXPECT_GE(id, 3);
      EXPECT_LT(id, 64);
    }
    prompts.insert(ids);
  }
  EXPECT_EQ(prompts.size(), 6u) << "each request has its own prompt";

  const auto j = r.to_json();
  for (const char* k :
       {"mode", "url", "concurrency", "requests", "completed", "errors", "duration_s",
        "requests_per_s", "output_tokens_per_s", "ttft_s", "tpot_s", "latency_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["mode"], "serving");
  EXPECT_EQ(j["url"], server.url());
  EXPECT_EQ(j["concurrency"], 2);
  EXPECT_FALSE(j.contains("rate"));
  EXPECT_EQ(j["requests"], 6);
  EXPECT_EQ(j["completed"], 6);
  EXPECT_TRUE(j["errors"].is_object() && j["errors"].empty());
  EXPECT_GT(j["duration_s"].get<double>(), 0);
  EXPECT_GT(j["output_tokens_per_s"].get<double>(), 0);
  for (const char* d : {"ttft_s", "tpot_s", "latency_s"}) {
    for (const char* k : {"p50", "p90", "p99", "mean"})
      EXPECT_TRUE(j[d][k].is_number()) << d << "." << k;
    EXPECT_EQ(j[d]["count"], 6) << d;
  }
  const std::string table = r.table();
  for (const char* k : {"closed loop, concurrency 2", "completed 6", "TTFT ms", "TPOT ms"})
    EXPECT_NE(table.find(k), std::string::npos) << k << "\n" << table;
}

// --no-stream: plain JSON answers, counted by their usage; a whole response
// says when it ended, not when its first token came, so no TTFT or TPOT.
TEST(BenchServingEndToEnd, NotStreamedRequestsAreMeasuredByLatencyOnly) {
  FakeServer server({});
  ServingBenchOptions o = closed_loop(server.url(), 2, 6);
  o.stream = false;
  const auto r = run_serving_bench(o);
  EXPECT_EQ(r.completed, 6);
  EXPECT_EQ(r.output_tokens, 30);
  for (const auto& q : r.requests) {
    EXPECT_TRUE(q.ok) << q.error << " " << q.detail;
    EXPECT_EQ(q.output_tokens, 5);
    EXPECT_LT(q.ttft_s, 0);
    EXPECT_LT(q.tpot_s, 0);
    EXPECT_GT(q.latency_s, 0);
  }
  for (const auto& b : server.bodies()) {
    EXPECT_EQ(b["stream"], false);
    EXPECT_FALSE(b.contains("stream_options"));
  }
  const auto j = r.to_json();
  EXPECT_EQ(j["stream"], false);
  EXPECT_EQ(j["latency_s"]["count"], 6);
  EXPECT_NE(r.table().find("not streamed"), std::string::npos) << r.table();
}

// --prefix-len: every prompt starts with the same ids, then its own; the
// server's usage says how many it found cached.
TEST(BenchServingEndToEnd, ASharedPrefixAndTheCachedTokensTheServerReports) {
  FakeServer server({});
  ServingBenchOptions o = closed_loop(server.url(), 2, 6);
  o.stream = false;
  o.prefix_len = 24;
  const auto r = run_serving_bench(o);
  EXPECT_EQ(r.completed, 6);
  EXPECT_EQ(r.prompt_tokens, 6 * 64);
  EXPECT_EQ(r.cached_tokens, 6 * 32);
  std::set<std::vector<int>> prefixes, prompts;
  for (const auto& b : server.bodies()) {
    const auto ids = b["prompt"].get<std::vector<int>>();
    ASSERT_EQ(ids.size(), 64u);
    prefixes.insert(std::vector<int>(ids.begin(), ids.begin() + 24));
    prompts.insert(ids);
  }
  EXPECT_EQ(prefixes.size(), 1u);
  EXPECT_EQ(prompts.size(), 6u);
  const auto j = r.to_json();
  EXPECT_EQ(j["prefix_len"], 24);
  EXPECT_EQ(j["cached_prompt_tokens"], 6 * 32);
  const std::string table = r.table();
  for (const char* k :
       {"prompt 64 tokens, the first 24 shared by all", "prefix cache: 192 of 384 (50%)"})
    EXPECT_NE(table.find(k), std::string::npos) << k << "\n" << table;
  o.prefix_len = -1;
  EXPECT_THROW(run_serving_bench(o), std::invalid_argument);
}

TEST(BenchServingEndToEnd, RejectionsCountedByStatus) {
  FakeConfig cfg;
  cfg.reject_every = 2;
  FakeServer server(cfg);
  const auto r = run_serving_bench(closed_loop(server.url(), 2, 6));
  EXPECT_EQ(r.completed, 3);
  ASSERT_EQ(r.errors.size(), 1u) << r.to_json().dump();
  EXPECT_EQ(r.errors.count("429") ? r.errors.at("429") : 0, 3) << r.to_json().dump();
  const auto j = r.to_json();
  EXPECT_EQ(j["errors"]["429"], 3);
  EXPECT_EQ(j["ttft_s"]["count"], 3) << "failed requests are no latency samples";
  EXPECT_NE(r.table().find("429 x3"), std::string::npos) << r.table();
  EXPECT_EQ(r.error_examples.at("429"), "queue full") << "the server's message is kept";
  EXPECT_EQ(j["error_examples"]["429"], "queue full");

  FakeConfig all;
  all.reject_every = 1;
  FakeServer refusing(all);
  const auto none = run_serving_bench(closed_loop(refusing.url(), 2, 4));
  EXPECT_EQ(none.completed, 0);
  EXPECT_EQ(none.errors.at("429"), 4);
  EXPECT_TRUE(none.to_json()["ttft_s"]["p50"].is_null());
}

TEST(BenchServingEndToEnd, OpenLoopCloseDelimitedWithoutUsage) {
  FakeConfig cfg;
  cfg.chunked = false;
  cfg.usage = false;
  cfg.vocab = 0;
  cfg.tokens = 4;
  FakeServer server(cfg);
  ServingBenchOptions o = closed_loop(server.url(), 0, 8);
  o.rate = 400;
  o.max_inflight = 3;
  o.vocab = 20;
  o.seed = 9;
  const auto r = run_serving_bench(o);
  EXPECT_EQ(r.completed, 8);
  EXPECT_TRUE(r.errors.empty()) << r.to_json().dump();
  EXPECT_EQ(r.output_tokens, 32) << "counted from the chunks";
  EXPECT_EQ(r.vocab_source, "option");
  EXPECT_LE(server.max_active(), 3);
  for (const auto& b : server.bodies())
    for (const int id : b["prompt"].get<std::vector<int>>()) EXPECT_LT(id, 20);
  const auto j = r.to_json();
  EXPECT_EQ(j["rate"], 400.0);
  EXPECT_EQ(j["max_inflight"], 3);
  EXPECT_FALSE(j.contains("concurrency"));
  EXPECT_EQ(j["completed"], 8);
  EXPECT_NE(r.table().find("open loop"), std::string::npos);
}

TEST(BenchServingEndToEnd, NoModelsEndpointFallsBackToOptions) {
  FakeConfig cfg;
  cfg.models_404 = true;
  FakeServer server(cfg);
  auto o = closed_loop(server.url(), 1, 2);
  o.vocab = 10;
  o.model = "chosen";
  const auto r = run_serving_bench(o);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.vocab, 10);
  EXPECT_EQ(r.vocab_source, "option");
  for (const auto& b : server.bodies()) EXPECT_EQ(b["model"], "chosen");
}

// A server that needs an API key: without it every request is a 401 (and
// /v1/models says nothing), with it the run completes against the server's model.
TEST(BenchServingEndToEnd, ApiKeyIsSentAsABearerToken) {
  FakeConfig cfg;
  cfg.api_key = "k-123";
  FakeServer server(cfg);
  auto o = closed_loop(server.url(), 2, 4);
  const auto refused = run_serving_bench(o);
  EXPECT_EQ(refused.completed, 0);
  EXPECT_EQ(refused.model, "");
  o.api_key = "k-123";
  const auto r = run_serving_bench(o);
  EXPECT_EQ(r.completed, 4);
  EXPECT_EQ(r.model, "fake-model");
}

TEST(BenchServingEndToEnd, PromptOverTheAdvertisedContextIsRefusedUpFront) {
  FakeConfig cfg;
  cfg.max_model_len = 44;
  FakeServer server(cfg);
  auto o = closed_loop(server.url(), 1, 2);  // 40 + 5 > 44
  try {
    run_serving_bench(o);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len 44"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(server.bodies().empty());
  o.output_len = 4;
  EXPECT_EQ(run_serving_bench(o).completed, 2);
}

TEST(BenchServingEndToEnd, StalledServerTimesOut) {
  FakeConfig cfg;
  cfg.stall_s = 10;
  FakeServer server(cfg);
  auto o = closed_loop(server.url(), 2, 2);
  o.timeout_s = 0.3;
  const auto t0 = Clock::now();
  const auto r = run_serving_bench(o);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(8)) << "the deadline cut the wait short";
  EXPECT_EQ(r.completed, 0);
  EXPECT_EQ(r.errors.at("timeout"), 2);
  EXPECT_FALSE(r.error_examples.at("timeout").empty());
}

TEST(BenchServingEndToEnd, UnreachableServerIsAnError) {
  unsigned short port = 0;
  {
    asio::io_context ioc;
    tcp::acceptor a(ioc, {asio::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }
  auto o = closed_loop("http://127.0.0.1:" + std::to_string(port), 1, 1);
  try {
    run_serving_bench(o);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::app::serving_bench
