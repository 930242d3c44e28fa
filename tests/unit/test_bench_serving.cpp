// `troupe bench` serving mode: statistics, arrivals, URLs, and
// the load generator end to end against a small fake server on 127.0.0.1.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "apps/bench_serving.h"
#include "support/sse_samples.h"

namespace troupe::app::serving_bench {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using nlohmann::json;

// ---- percentile and summaries ----

TEST(BenchServingPercentile, NearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 10; ++i) v.push_back(i);
  EXPECT_EQ(percentile_nearest_rank(v, 50), 5);
  EXPECT_EQ(percentile_nearest_rank(v, 90), 9);
  EXPECT_EQ(percentile_nearest_rank(v, 91), 10);
  EXPECT_EQ(percentile_nearest_rank(v, 99), 10);
  EXPECT_EQ(percentile_nearest_rank(v, 100), 10);
  EXPECT_EQ(percentile_nearest_rank(v, 0.1), 1);
  EXPECT_EQ(percentile_nearest_rank({7.5}, 50), 7.5);
  EXPECT_EQ(percentile_nearest_rank({7.5}, 99), 7.5);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  // Exactly p% of 100 samples: the rank must not drift up by rounding.
  EXPECT_EQ(percentile_nearest_rank(hundred, 99), 99);
  EXPECT_EQ(percentile_nearest_rank(hundred, 90), 90);
  EXPECT_EQ(percentile_nearest_rank(hundred, 50), 50);
  EXPECT_EQ(percentile_nearest_rank({1, 2, 3, 4}, 50), 2);
  EXPECT_EQ(percentile_nearest_rank({1, 2, 3, 4}, 51), 3);
}

TEST(BenchServingPercentile, RejectsEmptyAndOutOfRange) {
  EXPECT_THROW(percentile_nearest_rank({}, 50), std::invalid_argument);
  EXPECT_THROW(percentile_nearest_rank({1, 2}, 0), std::invalid_argument);
  EXPECT_THROW(percentile_nearest_rank({1, 2}, 100.5), std::invalid_argument);
  EXPECT_THROW(percentile_nearest_rank({1, 2}, std::nan("")), std::invalid_argument);
}

TEST(BenchServingSummary, SortsAndAverages) {
  const auto d = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(d.count, 5u);
  EXPECT_EQ(d.p50, 3);
  EXPECT_EQ(d.p90, 5);
  EXPECT_EQ(d.p99, 5);
  EXPECT_DOUBLE_EQ(d.mean, 3);
  const auto j = d.to_json();
  EXPECT_EQ(j["p50"], 3.0);
  EXPECT_EQ(j["count"], 5);
  const auto none = summarize({}).to_json();
  EXPECT_EQ(none["count"], 0);
  for (const char* k : {"p50", "p90", "p99", "mean"}) EXPECT_TRUE(none[k].is_null()) << k;
}

// ---- arrivals ----

TEST(BenchServingPoisson, SeededAndDeterministic) {
  PoissonArrivals a(10, 42), b(10, 42), c(10, 43);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.next_gap_s(), y = b.next_gap_s(), z = c.next_gap_s();
    EXPECT_EQ(x, y);
    EXPECT_GT(x, 0);
    EXPECT_TRUE(std::isfinite(x));
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
  // The generator is fixed by its definition, not by the standard library:
  // the first outputs for seed 0 (splitmix64-seeded xoshiro256**), taken from
  // a separate transcription of the reference C code.
  Xoshiro256 rng(0);
  EXPECT_EQ(rng.next(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(rng.next(), 0xbf6e1f784956452aULL);
  EXPECT_THROW(PoissonArrivals(0, 1), std::invalid_argument);
}

TEST(BenchServingPoisson, MeanGapIsOneOverRate) {
  for (const double rate : {0.5, 8.0, 250.0}) {
    PoissonArrivals p(rate, 7);
    const int n = 200000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      const double g = p.next_gap_s();
      sum += g;
      sum2 += g * g;
    }
    const double mean = sum / n;
    const double sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_NEAR(mean * rate, 1.0, 0.01) << rate;
    // Exponential: the standard deviation equals the mean.
    EXPECT_NEAR(sd / mean, 1.0, 0.02) << rate;
  }
  Xoshiro256 rng(3);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = rng.next_double();
    ASSERT_GE(u, 0);
    ASSERT_LT(u, 1);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

// ---- URL and options ----

TEST(BenchServingUrl, Parses) {
  auto u = parse_http_url("http://127.0.0.1:8080");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, "8080");
  EXPECT_EQ(u.base_path, "");
  EXPECT_EQ(u.authority(), "127.0.0.1:8080");
  u = parse_http_url("HTTP://localhost/");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, "80");
  EXPECT_EQ(u.authority(), "localhost");
  u = parse_http_url("http://gpu-box:9000/prefix/v1/");
  EXPECT_EQ(u.base_path, "/prefix/v1");
  EXPECT_EQ(api_root(u), "/prefix/v1");
  EXPECT_EQ(api_root(parse_http_url("http://h:1/prefix")), "/prefix/v1");
  u = parse_http_url("http://[::1]:8081");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, "8081");
  EXPECT_EQ(u.authority(), "[::1]:8081");
}

TEST(BenchServingUrl, RejectsWithAReason) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"127.0.0.1:8080", "expected http://"},
      {"https://host", "https is not supported"},
      {"http://", "no host"},
      {"http://:8080", "no host"},
      {"http://host:", "empty port"},
      {"http://host:abc", "not a number"},
      {"http://host:0", "outside 1..65535"},
      {"http://host:70000", "outside 1..65535"},
      {"http://::1:80", "brackets"},
      {"http://user:pw@host", "credentials"},
      {"http://host/x?y=1", "query"},
      {"http://[::1", "unterminated"},
  };
  for (const auto& [url, why] : bad) {
    try {
      parse_http_url(url);
      ADD_FAILURE() << url << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << url << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("--url"), std::string::npos) << e.what();
    }
  }
}

std::string validation_error(const ServingBenchOptions& o) {
  try {
    validate(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(BenchServingOptions, BadOptionsSayWhich) {
  ServingBenchOptions o;
  o.url = "http://127.0.0.1:8080";
  EXPECT_NE(validation_error(o).find("--concurrency"), std::string::npos);
  EXPECT_NE(validation_error(o).find("--rate"), std::string::npos);
  o.concurrency = 2;
  EXPECT_EQ(validation_error(o), "");
  o.rate = 5;
  EXPECT_NE(validation_error(o).find("not both"), std::string::npos);
  o.rate = 0;
  o.requests = 0;
  EXPECT_NE(validation_error(o).find("--requests"), std::string::npos);
  o.requests = 1;
  o.url = "localhost:8080";
  EXPECT_NE(validation_error(o).find("--url"), std::string::npos);
  o.url = "http://h:1";
  o.vocab = 3;
  EXPECT_NE(validation_error(o).find("--vocab"), std::string::npos);
  o.vocab = 100;
  o.timeout_s = 0;
  EXPECT_NE(validation_error(o).find("--timeout-s"), std::string::npos);
  o.timeout_s = 1;
  o.concurrency = -1;
  EXPECT_NE(validation_error(o).find("--concurrency must be at least 1"), std::string::npos);
  o.concurrency = 0;
  o.rate = 1;
  o.max_inflight = 0;
  EXPECT_NE(validation_error(o).find("--max-inflight"), std::string::npos);
  EXPECT_THROW(run_serving_bench(o), std::invalid_argument);
}

TEST(BenchServingPrompt, IdsInRangeAndVaried) {
  const auto a = prompt_ids(300, 10, 1, 0);
  const auto b = prompt_ids(300, 10, 1, 1);
  ASSERT_EQ(a.size(), 300u);
  std::set<int> seen;
  for (const int id : a) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, 10);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 7u) << "every allowed id shows up in 300 draws";
  EXPECT_NE(a, b);
  EXPECT_EQ(a, prompt_ids(300, 10, 1, 0));
  EXPECT_NE(a, prompt_ids(300, 10, 2, 0));
}

// ---- end to end against a fake server ----

struct FakeConfig {
  int tokens = 5;
  bool usage = true;
  bool chunked = true;      // else close-delimited: Connection: close, no length
  int reject_every = 0;     // every k-th completion (1-based) gets 429
  int vocab = 64;           // in /v1/models; 0 = not advertised
  bool models_404 = false;  // no /v1/models at all
  double stall_s = 0;       // before the first byte of a completion
  int max_model_len = 0;    // in /v1/models; 0 = not advertised
};

// Answers /v1/completions with a fixed SSE stream written in small uneven
// pieces, one thread per connection (sync Beast for the request, raw bytes for
// the response so that the framing is exactly what the test wants).
class FakeServer {
 public:
  explicit FakeServer(FakeConfig cfg) : cfg_(cfg), acceptor_(ioc_) {
    const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~FakeServer() {
    stop_ = true;
    {
      // Wakes the blocking accept().
      asio::io_context ioc;
      tcp::socket s(ioc);
      beast::error_code ec;
      s.connect({asio::ip::make_address("127.0.0.1"), port_}, ec);
    }
    accept_thread_.join();
    std::lock_guard lock(m_);
    for (auto& s : sockets_) ::shutdown(s->native_handle(), SHUT_RDWR);
    for (auto& t : threads_) t.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<json> bodies() {
    std::lock_guard lock(m_);
    return bodies_;
  }
  int max_active() const { return max_active_; }
  int connections() const { return connections_; }

 private:
  void accept_loop() {
    for (;;) {
      auto s = std::make_shared<tcp::socket>(ioc_);
      beast::error_code ec;
      acceptor_.accept(*s, ec);
      if (stop_) return;
      if (ec) continue;
      ++connections_;
      std::lock_guard lock(m_);
      sockets_.push_back(s);
      threads_.emplace_back([this, s] { serve(*s); });
    }
  }

  void serve(tcp::socket& s) {
    s.set_option(tcp::no_delay(true));
    beast::flat_buffer buf;
    for (;;) {
      http::request<http::string_body> req;
      beast::error_code ec;
      http::read(s, buf, req, ec);
      if (ec || stop_) return;
      if (req.target() == "/v1/models") {
        json models = {{"object", "list"}, {"data", {{{"id", "fake-model"}, {"object", "model"}}}}};
        if (cfg_.vocab > 0) models["data"][0]["vocab_size"] = cfg_.vocab;
        if (cfg_.max_model_len > 0) models["data"][0]["max_model_len"] = cfg_.max_model_len;
        respond(s, req, cfg_.models_404 ? 404 : 200, models.dump());
        continue;
      }
      if (req.target() != "/v1/completions") {
        respond(s, req, 404, "{}");
        continue;
      }
      int k;
      {
        std::lock_guard lock(m_);
        bodies_.push_back(json::parse(req.body()));
        k = int(bodies_.size());
      }
      if (cfg_.reject_every > 0 && k % cfg_.reject_every == 0) {
        respond(s, req, 429, R"({"error":{"message":"queue full"}})");
        continue;
      }
      const int now = ++active_;
      for (int seen = max_active_; now > seen && !max_active_.compare_exchange_weak(seen, now);) {
      }
      const bool keep = stream(s);
      --active_;
      if (!keep) return;
    }
  }

  void respond(tcp::socket& s, const http::request<http::string_body>& req, int status,
               const std::string& body) {
    http::response<http::string_body> res{http::status(status), 11};
    res.set(http::field::content_type, "application/json");
    if (status == 429) res.set(http::field::retry_after, "1");
    res.keep_alive(req.keep_alive());
    res.body() = body;
    res.prepare_payload();
    beast::error_code ec;
    http::write(s, res, ec);
  }

  // Returns whether the connection stays open.
  bool stream(tcp::socket& s) {
    const auto until = Clock::now() + std::chrono::milliseconds(int(cfg_.stall_s * 1000));
    while (Clock::now() < until && !stop_)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (stop_) return false;
    const std::string sse = test::sample_stream(cfg_.tokens, cfg_.usage);
    beast::error_code ec;
    asio::write(s,
                asio::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n") +
                             (cfg_.chunked ? "Transfer-Encoding: chunked\r\n\r\n"
                                           : "Connection: close\r\n\r\n")),
                ec);
    // Piece sizes that cut events, lines and "\n\n" pairs at odd places.
    static constexpr size_t kPieces[] = {1, 7, 13, 2, 29, 5, 61};
    size_t at = 0;
    for (int i = 0; at < sse.size() && !ec; ++i) {
      const size_t n = std::min(kPieces[i % 7], sse.size() - at);
      std::string piece = sse.substr(at, n);
      at += n;
      if (cfg_.chunked) {
        char size[16];
        std::snprintf(size, sizeof size, "%zx\r\n", n);
        piece = size + piece + "\r\n";
      }
      asio::write(s, asio::buffer(piece), ec);
    }
    if (cfg_.chunked) {
      asio::write(s, asio::buffer(std::string("0\r\n\r\n")), ec);
      return !ec;
    }
    s.shutdown(tcp::socket::shutdown_both, ec);
    return false;
  }

  FakeConfig cfg_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex m_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::vector<std::thread> threads_;
  std::vector<json> bodies_;
  std::atomic<int> active_{0}, max_active_{0}, connections_{0};
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
