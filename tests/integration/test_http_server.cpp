// HttpServer on 127.0.0.1 (port 0) against a fake CompletionService and the
// real fortune tokenizer, driven by the shared HTTP client. Every client
// operation has a timeout, so a hung server fails a test instead of hanging it.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "metrics/metrics.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "net/sse_parser.h"
#include "service/version.h"
#include "support/process_support.h"
#include "support/test_support.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

const Tokenizer& fortune() {
  static const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  return tok;
}

openai::ModelLimits limits() {
  openai::ModelLimits l;
  l.name = "fortune";
  l.context_length = 256;
  l.vocab_size = 2000;
  l.max_tokens_cap = 200;
  return l;
}

// What the fake generates for a prompt: ordinary pieces (ids >= 300, past the
// control and byte-fallback ids), a pure function of the prompt.
std::vector<int> fake_output(const std::vector<int>& prompt, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int id : prompt) h = (h ^ uint64_t(id)) * 1099511628211ull;
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(300 + int((h + uint64_t(i) * 7919u) % 1700u));
  return out;
}

// The text that follows the prompt ids: what decode(prompt + output) has
// past decode(prompt), so that prompt + completion reads as one text.
std::string continuation(const std::vector<int>& prompt, const std::vector<int>& output) {
  std::vector<int> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  return fortune().decode(all).substr(fortune().decode(prompt).size());
}

std::string expected_text(const std::string& prompt, int n) {
  const std::vector<int> ids = fortune().encode(prompt, true);
  return continuation(ids, fake_output(ids, n));
}

// ---- the fake service ----

// One worker thread plays a batcher: each step, every running job gets one
// token. Knobs make it fail, hang, stall or stop early. Like the runtime's
// request table, it alone enforces a request's timeout_s: a job still running
// then is stopped and ends with ServiceErrorKind::Timeout.
class FakeService : public CompletionService {
 public:
  FakeService() : worker_([this] { run(); }) {}
  ~FakeService() override { shutdown(); }

  void shutdown() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void submit(CompletionRequest r, std::shared_ptr<CompletionSink> sink) override {
    std::unique_lock lock(mu_);
    submitted_.push_back(r);
    changed_.notify_all();
    if (fail_) {
      ServiceError e = *fail_;
      lock.unlock();
      sink->on_error(e);  // synchronously, as a router refusing at once might
      return;
    }
    Job j;
    if (r.timeout_s > 0)
      j.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(r.timeout_s));
    j.out = fake_output(r.prompt, r.max_tokens);
    j.prompt_tokens = int(r.prompt.size());
    j.req = std::move(r);
    j.sink = std::move(sink);
    j.hang = hang_;
    jobs_.push_back(std::move(j));
    cv_.notify_all();
  }

  void cancel(uint64_t id) override {
    std::lock_guard lock(mu_);
    ++cancels_[id];
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->req.id != id) continue;
      it->sink->on_done(FinishReason::Cancelled, it->prompt_tokens, int(it->next), 0);
      jobs_.erase(it);
      break;
    }
    changed_.notify_all();
  }

  bool ready() const override { return ready_; }

  // Knobs.
  std::atomic<bool> ready_{true};
  void fail_with(std::optional<ServiceError> e) {
    std::lock_guard lock(mu_);
    fail_ = std::move(e);
  }
  void set_hang(bool h) {
    std::lock_guard lock(mu_);
    hang_ = h;
  }
  void set_token_delay(std::chrono::milliseconds d) {
    std::lock_guard lock(mu_);
    delay_ = d;
  }
  void fail_after(int tokens, ServiceError e) {
    std::lock_guard lock(mu_);
    fail_after_ = tokens;
    fail_after_error_ = std::move(e);
  }
  void eos_after(int tokens) {
    std::lock_guard lock(mu_);
    eos_after_ = tokens;
  }

  // Observations.
  int cancel_count(uint64_t id) {
    std::lock_guard lock(mu_);
    return count(cancels_, id);
  }
  // Requests that their deadline ended.
  int timeout_count(uint64_t id) {
    std::lock_guard lock(mu_);
    return count(timeouts_, id);
  }
  // Times the request was stopped, by cancel() or by its deadline.
  int stop_count(uint64_t id) {
    std::lock_guard lock(mu_);
    return count(cancels_, id) + count(timeouts_, id);
  }
  bool wait_cancel(uint64_t id, std::chrono::milliseconds within = 5000ms) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, within, [&] { return cancels_.count(id) > 0; });
  }
  // The n-th submitted request (1-based), waiting for it.
  std::optional<CompletionRequest> wait_submitted(size_t n,
                                                  std::chrono::milliseconds within = 5000ms) {
    std::unique_lock lock(mu_);
    if (!changed_.wait_for(lock, within, [&] { return submitted_.size() >= n; }))
      return std::nullopt;
    return submitted_[n - 1];
  }
  size_t submitted_count() {
    std::lock_guard lock(mu_);
    return submitted_.size();
  }
  size_t running() {
    std::lock_guard lock(mu_);
    return jobs_.size();
  }

 private:
  struct Job {
    CompletionRequest req;
    std::shared_ptr<CompletionSink> sink;
    std::vector<int> out;
    size_t next = 0;
    int prompt_tokens = 0;
    bool hang = false;
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  };

  static int count(const std::map<uint64_t, int>& m, uint64_t id) {
    auto it = m.find(id);
    return it == m.end() ? 0 : it->second;
  }

  bool any_active() const {
    for (const Job& j : jobs_)
      if (!j.hang) return true;
    return false;
  }

  std::chrono::steady_clock::time_point next_deadline() const {
    auto t = std::chrono::steady_clock::time_point::max();
    for (const Job& j : jobs_) t = std::min(t, j.deadline);
    return t;
  }

  // As the runtime does: stop the generation, then end with Timeout.
  void end_late_jobs() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->deadline > now) {
        ++it;
        continue;
      }
      ++timeouts_[it->req.id];
      it->sink->on_error(ServiceError{ServiceErrorKind::Timeout, "request timed out", 0});
      it = jobs_.erase(it);
      changed_.notify_all();
    }
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      if (stop_) return;
      // Woken by a new job, a stop, or the earliest deadline, which a new
      // job may have moved: so no predicate, and look again each time.
      const auto deadline = next_deadline();
      if (!any_active() && deadline > std::chrono::steady_clock::now()) {
        if (deadline == std::chrono::steady_clock::time_point::max())
          cv_.wait(lock);
        else
          cv_.wait_until(lock, deadline);
        continue;
      }
      end_late_jobs();
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        Job& j = *it;
        if (j.hang) {
          ++it;
          continue;
        }
        if (fail_after_ >= 0 && int(j.next) == fail_after_) {
          j.sink->on_error(fail_after_error_);
          it = jobs_.erase(it);
          continue;
        }
        if (eos_after_ >= 0 && int(j.next) == eos_after_) {
          j.sink->on_done(FinishReason::Stop, j.prompt_tokens, int(j.next), 0);
          it = jobs_.erase(it);
          continue;
        }
        j.sink->on_token(j.out[j.next++], nullptr);
        if (j.next == j.out.size()) {
          j.sink->on_done(FinishReason::Length, j.prompt_tokens, int(j.next), 0);
          it = jobs_.erase(it);
        } else {
          ++it;
        }
      }
      auto delay = delay_;
      lock.unlock();
      std::this_thread::sleep_for(delay);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, changed_;
  std::list<Job> jobs_;
  std::vector<CompletionRequest> submitted_;
  std::map<uint64_t, int> cancels_;
  std::map<uint64_t, int> timeouts_;
  std::optional<ServiceError> fail_;
  bool hang_ = false;
  std::chrono::milliseconds delay_{1};
  int fail_after_ = -1;
  ServiceError fail_after_error_;
  int eos_after_ = -1;
  bool stop_ = false;
  std::thread worker_;  // last: starts after the state above exists
};

// ---- the shared client, connected at once ----

// A transport failure throws, so that a test fails loudly instead of reading
// an empty response. Never retried on a fresh connection: a test that the
// connection still works must see it if the server closed it.
class Client {
 public:
  explicit Client(uint16_t port, std::chrono::milliseconds timeout = 10000ms)
      : http_(test::loopback_client(port, std::chrono::duration<double>(timeout).count(),
                                    /*retry_stale=*/false)) {
    if (HttpError e = http_.connect()) throw std::runtime_error("connect: " + e.message);
  }

  HttpResponse request(const std::string& method, const std::string& target,
                       const std::string& body = "", const HttpHeaders& headers = {},
                       int version = 11) {
    // HTTP/1.0 as old clients speak it: no keep-alive.
    const HttpRequest r{.method = method,
                        .target = target,
                        .body = body,
                        .headers = headers,
                        .version = version,
                        .keep_alive = version >= 11};
    return checked(http_.request(r), "request");
  }
  HttpResponse post(const std::string& target, const json& body) {
    return request("POST", target, body.dump());
  }
  HttpResponse get(const std::string& target) { return request("GET", target); }

  void send(const std::string& bytes) {
    if (HttpError e = http_.write_raw(bytes)) throw std::runtime_error("write: " + e.message);
  }
  HttpResponse read_response() { return checked(http_.read_response(), "read response"); }
  // Raw bytes until `needle` shows up (or EOF / timeout).
  std::string read_until(const std::string& needle) { return http_.read_raw_until(needle); }
  // True if the server closes the connection within the client timeout.
  bool closed_by_server() { return http_.wait_closed_by_peer(); }
  void close() { http_.close(); }

 private:
  static HttpResponse checked(HttpResponse r, const char* what) {
    if (!r.complete()) throw std::runtime_error(std::string(what) + ": " + r.error.message);
    return r;
  }

  HttpClient http_;
};

json body_json(const HttpResponse& r) {
  return json::parse(r.body);
}

// The data of each event of an SSE body, in order. This server sends only
// "data: <payload>\n\n" events, so the body must be exactly those.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events = troupe::sse_events(body);
  std::string framed;
  for (const std::string& e : events) framed += "data: " + e + "\n\n";
  EXPECT_EQ(framed, body) << "not a sequence of data-only events";
  return events;
}

struct StreamResult {
  std::string text;
  std::string finish_reason;
  std::optional<json> usage;
  std::optional<json> error;
  bool done = false;
  int chunks = 0;
};

// A completion stream's text, checking its shape; a chat stream (`chat`)
// also has the role first, then content deltas, and the finish reason alone
// in an empty delta.
StreamResult collect_stream(const std::string& body, bool chat = false) {
  StreamResult r;
  bool role = false;
  for (const std::string& ev : sse_events(body)) {
    EXPECT_FALSE(r.done) << "event after [DONE]: " << ev;
    if (ev == "[DONE]") {
      r.done = true;
      continue;
    }
    json j = json::parse(ev);
    if (j.contains("error")) {
      r.error = j;
      continue;
    }
    EXPECT_EQ(j["object"], chat ? "chat.completion.chunk" : "text_completion");
    EXPECT_EQ(j["model"], "fortune");
    if (chat) {
      EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    }
    if (j["choices"].empty()) {
      r.usage = j["usage"];
      continue;
    }
    EXPECT_TRUE(r.finish_reason.empty()) << "chunk after the finish_reason chunk";
    ++r.chunks;
    const json& choice = j["choices"][0];
    const bool last = !choice["finish_reason"].is_null();
    if (last) r.finish_reason = choice["finish_reason"];
    if (!chat) {
      r.text += choice["text"].get<std::string>();
      continue;
    }
    const json& delta = choice["delta"];
    EXPECT_EQ(delta.contains("role"), !role) << "the role comes first, once: " << ev;
    role = true;
    if (delta.contains("content")) r.text += delta["content"].get<std::string>();
    if (last) {
      EXPECT_EQ(delta, json::object()) << ev;
    }
  }
  return r;
}

// The value of one series in a /metrics body, or -1.
double metric(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

// ---- fixture ----

class HttpServerTest : public ::testing::Test {
 protected:
  HttpServer::Options default_options() {
    HttpServer::Options o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.max_body_bytes = 64 * 1024;
    o.max_header_bytes = 8 * 1024;
    o.request_timeout_s = 30;
    o.read_timeout_s = 5;
    o.io_threads = 2;
    return o;
  }

  // The one request submitted is cancelled, exactly once, and runs no more.
  void expect_cancelled_once() {
    auto req = fake_.wait_submitted(1);
    ASSERT_TRUE(req);
    EXPECT_TRUE(fake_.wait_cancel(req->id));
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(fake_.cancel_count(req->id), 1);
    EXPECT_EQ(fake_.running(), 0u);
  }

  void start(std::optional<HttpServer::Options> o = std::nullopt, bool with_tokenizer = true) {
    server_ = std::make_unique<HttpServer>(
        o ? *o : default_options(), fake_,
        with_tokenizer ? std::optional<Tokenizer>(fortune()) : std::nullopt, limits(), metrics_);
    server_->start();
    port_ = server_->port();
    ASSERT_NE(port_, 0);
  }

  void TearDown() override {
    server_.reset();  // before the fake: late sink calls must be harmless
    fake_.shutdown();
  }

  json completion(const std::string& prompt, int max_tokens, json extra = json::object()) {
    json body = {
        {"model", "fortune"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }

  FakeService fake_;
  Metrics metrics_;
  std::unique_ptr<HttpServer> server_;
  uint16_t port_ = 0;
};

// ---- tests ----

TEST_F(HttpServerTest, HealthReadyAndModels) {
  start();
  Client c(port_);
  HttpResponse h = c.get("/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(body_json(h)["status"], "ok");
  EXPECT_EQ(c.get("/ready").status, 200);
  fake_.ready_ = false;
  HttpResponse r = c.get("/ready");
  EXPECT_EQ(r.status, 503);
  EXPECT_TRUE(body_json(r)["error"]["message"].is_string());
  EXPECT_EQ(c.get("/health").status, 200);  // alive, just not ready
  HttpResponse m = c.get("/v1/models");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(body_json(m)["data"][0]["id"], "fortune");
  EXPECT_EQ(m.header("content-type"), "application/json");
}

TEST_F(HttpServerTest, NonStreamingCompletion) {
  start();
  Client c(port_);
  const std::string prompt = "Once upon a time";
  HttpResponse r =
      c.post("/v1/completions", completion(prompt, 12, {{"priority", 1}, {"seed", 7}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = body_json(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fortune");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], expected_text(prompt, 12));
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  int prompt_tokens = int(fortune().encode(prompt, true).size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + 12);

  auto req = fake_.wait_submitted(1);
  ASSERT_TRUE(req);
  EXPECT_EQ(req->prompt, fortune().encode(prompt, true));
  EXPECT_EQ(req->max_tokens, 12);
  EXPECT_EQ(req->sampling.temperature, 0.0f);
  EXPECT_EQ(req->sampling.seed, 7u);
  EXPECT_EQ(req->priority, 1);
  EXPECT_DOUBLE_EQ(req->timeout_s, 30);
}

TEST_F(HttpServerTest, StreamingMatchesNonStreaming) {
  start();
  Client c(port_);
  const std::string prompt = "The meaning of life";
  HttpResponse plain = c.post("/v1/completions", completion(prompt, 24));
  ASSERT_EQ(plain.status, 200);
  HttpResponse s = c.post(
      "/v1/completions",
      completion(prompt, 24, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.header("content-type").rfind("text/event-stream", 0), 0u);
  EXPECT_EQ(s.header("transfer-encoding"), "chunked");
  StreamResult r = collect_stream(s.body);
  EXPECT_TRUE(r.done);
  EXPECT_GT(r.chunks, 5);
  EXPECT_EQ(r.text, body_json(plain)["choices"][0]["text"]);
  EXPECT_EQ(r.text, expected_text(prompt, 24));
  EXPECT_EQ(r.finish_reason, "length");
  ASSERT_TRUE(r.usage);
  EXPECT_EQ((*r.usage)["completion_tokens"], 24);
  EXPECT_EQ(sse_events(s.body).back(), "[DONE]");
}

// ---- chat completions: the same path to the service, a chat's shapes ----

json chat(const std::string& user, int max_tokens, json extra = json::object()) {
  json body = {
      {"model", "fortune"},
      {"messages",
       {{{"role", "system"}, {"content", "Be wise."}}, {{"role", "user"}, {"content", user}}}},
      {"max_tokens", max_tokens},
      {"temperature", 0}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

std::string rendered(const std::string& user) {
  return "System: Be wise.\nUser: " + user + "\nAssistant:";
}

TEST_F(HttpServerTest, ChatIsTheCompletionOfItsRenderedPrompt) {
  start();
  Client c(port_);
  HttpResponse r = c.post("/v1/chat/completions", chat("Hello", 12, {{"seed", 7}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = body_json(r);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "fortune");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected_text(rendered("Hello"), 12));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const int prompt_tokens = int(fortune().encode(rendered("Hello"), true).size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + 12);
  auto req = fake_.wait_submitted(1);
  ASSERT_TRUE(req);
  EXPECT_EQ(req->prompt, fortune().encode(rendered("Hello"), true));
  EXPECT_EQ(req->max_tokens, 12);
  EXPECT_EQ(req->sampling.seed, 7u);
  EXPECT_DOUBLE_EQ(req->timeout_s, 30);

  HttpResponse s =
      c.post("/v1/chat/completions",
             chat("Hello", 12, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.header("content-type").rfind("text/event-stream", 0), 0u);
  StreamResult st = collect_stream(s.body, true);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.text, expected_text(rendered("Hello"), 12));
  EXPECT_EQ(st.finish_reason, "length");
  ASSERT_TRUE(st.usage);
  EXPECT_EQ((*st.usage)["completion_tokens"], 12);
}

TEST_F(HttpServerTest, ChatErrorsHaveTheCompletionsStatusesAndShape) {
  start();
  Client c(port_);
  HttpResponse bad =
      c.post("/v1/chat/completions",
             {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(body_json(bad)["error"]["param"], "messages[0].content[0].type");
  EXPECT_EQ(body_json(bad)["error"]["type"], "invalid_request_error");
  HttpResponse unknown = c.post("/v1/chat/completions", chat("x", 4, {{"model", "gpt-4"}}));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(body_json(unknown)["error"]["code"], "model_not_found");
  for (const auto& [kind, status] :
       {std::pair{ServiceErrorKind::QueueFull, 429}, std::pair{ServiceErrorKind::Unavailable, 503},
        std::pair{ServiceErrorKind::Timeout, 504}}) {
    fake_.fail_with(ServiceError{kind, "fake says no", 2});
    for (bool stream : {false, true}) {
      HttpResponse r = c.post("/v1/chat/completions", chat("x", 5, {{"stream", stream}}));
      EXPECT_EQ(r.status, status) << r.body;
      EXPECT_EQ(body_json(r)["error"]["message"], "fake says no");
      EXPECT_EQ(r.header("retry-after"), status == 504 ? "" : "2") << status;
    }
  }
  fake_.fail_with(std::nullopt);
  Client m(port_);
  const std::string text = m.get("/metrics").body;
  EXPECT_EQ(metric(text, "troupe_requests_total{status=\"429\"}"), 2);
  EXPECT_EQ(metric(text, "troupe_requests_total{status=\"404\"}"), 1);
}

// Every choice of a request with `n` is its own request to the service: a
// client that goes away has each cancelled once; a choice the service
// refuses fails the request and stops the others.
TEST_F(HttpServerTest, ChoicesAreCancelledTogether) {
  start();
  fake_.set_token_delay(20ms);
  {
    Client c(port_);
    std::string body = completion("Disconnect us", 200, {{"stream", true}, {"n", 3}}).dump();
    c.send(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body);
    std::string got = c.read_until("\"index\":2");
    ASSERT_NE(got.find("data: "), std::string::npos) << got;
    c.close();
  }
  for (size_t n = 1; n <= 3; ++n) {
    auto req = fake_.wait_submitted(n);
    ASSERT_TRUE(req);
    EXPECT_TRUE(fake_.wait_cancel(req->id)) << "choice " << n;
  }
  std::this_thread::sleep_for(200ms);
  for (size_t n = 1; n <= 3; ++n) EXPECT_EQ(fake_.cancel_count(fake_.wait_submitted(n)->id), 1);
  EXPECT_EQ(fake_.running(), 0u);
  // One request in /metrics, whatever its choices.
  Client m(port_);
  EXPECT_EQ(m.post("/v1/completions", completion("x", 4, {{"n", 3}})).status, 200);
  std::string t;
  for (int i = 0; i < 50 && metric(t, "troupe_requests_total{status=\"200\"}") != 1; ++i) {
    std::this_thread::sleep_for(20ms);
    t = m.get("/metrics").body;
  }
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"200\"}"), 1) << t;
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"499\"}"), 1) << t;
}

TEST_F(HttpServerTest, ChatClientDisconnectMidStreamCancelsOnce) {
  start();
  fake_.set_token_delay(20ms);
  {
    Client c(port_);
    std::string body = chat("Disconnect me", 200, {{"stream", true}}).dump();
    c.send(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body);
    std::string got = c.read_until("content");
    ASSERT_NE(got.find("data: "), std::string::npos) << got;
    c.close();
  }
  expect_cancelled_once();
}

TEST_F(HttpServerTest, OneModelByItsId) {
  start();
  Client c(port_);
  HttpResponse m = c.get("/v1/models/fortune");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(body_json(m), body_json(c.get("/v1/models"))["data"][0]);
  HttpResponse missing = c.get("/v1/models/gpt-4");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(body_json(missing)["error"]["code"], "model_not_found");
}

// A JSON error of `status` whose message holds `fragment` (and names `param`).
void expect_error(const HttpResponse& r, int status, const std::string& fragment,
                  const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  std::string msg = j["error"]["message"];
  EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param);
  }
  EXPECT_EQ(r.header("content-type"), "application/json");
}

// vLLM's tokenizer endpoints count what the completions count, and a long
// text (tokenized off the io thread) gives the tokenizer's own ids.
TEST_F(HttpServerTest, TokenizeAndDetokenizeAsVllm) {
  start();
  Client c(port_);
  const std::string text = "A fool and his money are soon parted.";
  HttpResponse t = c.post("/tokenize", {{"prompt", text}});
  ASSERT_EQ(t.status, 200) << t.body;
  HttpResponse done = c.post("/v1/completions", completion(text, 2));
  ASSERT_EQ(done.status, 200) << done.body;
  EXPECT_EQ(body_json(t)["count"], body_json(done)["usage"]["prompt_tokens"]);
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  HttpResponse tc = c.post("/tokenize", {{"messages", messages}});
  HttpResponse chat = c.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 2}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(body_json(tc)["count"], body_json(chat)["usage"]["prompt_tokens"]);
  HttpResponse d = c.post("/detokenize", {{"tokens", body_json(t)["tokens"]}});
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(body_json(d)["prompt"], text);

  std::string long_text;
  while (long_text.size() < 16 * 1024)
    long_text += "Time flies like an arrow; fruit flies like a banana. ";
  HttpResponse lt = c.post("/tokenize", {{"prompt", long_text}, {"add_special_tokens", false}});
  ASSERT_EQ(lt.status, 200);
  const std::vector<int> ids = fortune().encode(long_text, false);
  EXPECT_EQ(body_json(lt)["tokens"], json(ids));
  HttpResponse ld = c.post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(ld.status, 200);
  EXPECT_EQ(body_json(ld)["prompt"], long_text);

  expect_error(c.post("/detokenize", {{"tokens", {1, 2000}}}), 400, "outside the vocabulary");
  expect_error(c.post("/tokenize", {{"prompt", "x"}, {"model", "gpt-4"}}), 404, "does not exist");
  expect_error(c.get("/tokenize"), 405, "not allowed");
  HttpResponse v = c.get("/version");
  ASSERT_EQ(v.status, 200);
  EXPECT_EQ(body_json(v)["version"], std::string(kVersion));
}

TEST_F(HttpServerTest, TokenIdPromptAndReturnTokenIds) {
  start();
  Client c(port_);
  std::vector<int> prompt = {1, 400, 500, 600};
  HttpResponse r = c.post(
      "/v1/completions",
      {{"model", "fortune"}, {"prompt", prompt}, {"max_tokens", 5}, {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = body_json(r);
  EXPECT_EQ(j["choices"][0]["token_ids"], json(fake_output(prompt, 5)));
  EXPECT_EQ(j["choices"][0]["text"], continuation(prompt, fake_output(prompt, 5)));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
}

TEST_F(HttpServerTest, ServiceEndsWithStop) {
  start();
  fake_.eos_after(3);
  Client c(port_);
  HttpResponse r = c.post("/v1/completions", completion("Hello", 20));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(body_json(r)["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body_json(r)["usage"]["completion_tokens"], 4) << "3 delivered and the EOS";
}

TEST_F(HttpServerTest, StopStringTruncatesAndCancelsOnce) {
  start();
  const std::string prompt = "A stop string test";
  std::string full = expected_text(prompt, 30);
  ASSERT_GT(full.size(), 40u);
  std::string stop = full.substr(20, 5);
  std::string want = full.substr(0, full.find(stop));
  for (bool stream : {false, true}) {
    Client c(port_);
    size_t before = fake_.submitted_count();
    HttpResponse r =
        c.post("/v1/completions", completion(prompt, 30, {{"stop", stop}, {"stream", stream}}));
    ASSERT_EQ(r.status, 200) << r.body;
    if (stream) {
      StreamResult s = collect_stream(r.body);
      EXPECT_EQ(s.text, want);
      EXPECT_EQ(s.finish_reason, "stop");
      EXPECT_TRUE(s.done);
    } else {
      EXPECT_EQ(body_json(r)["choices"][0]["text"], want);
      EXPECT_EQ(body_json(r)["choices"][0]["finish_reason"], "stop");
    }
    auto req = fake_.wait_submitted(before + 1);
    ASSERT_TRUE(req);
    EXPECT_TRUE(fake_.wait_cancel(req->id));
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(fake_.cancel_count(req->id), 1);
  }
}

TEST_F(HttpServerTest, BadInputGetsStatusAndMessage) {
  start();
  Client c(port_);
  expect_error(c.request("POST", "/v1/completions", "{\"prompt\": \"x\",,}"), 400,
               "Malformed JSON");
  expect_error(c.post("/v1/completions", completion("x", 5, {{"max_tokens", "many"}})), 400,
               "`max_tokens`", "max_tokens");
  expect_error(c.post("/v1/completions", completion("x", 5, {{"temperature", "hot"}})), 400,
               "`temperature`", "temperature");
  expect_error(c.post("/v1/completions", completion("x", 5, {{"n", 65}})), 400,
               "`n` must be between 1 and 64", "n");
  expect_error(c.post("/v1/completions", completion("x", 5, {{"model", "gpt-4"}})), 404,
               "The model `gpt-4` does not exist.");
  expect_error(c.post("/v1/completions", completion("x", 5000)), 400, "at most 200");
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += "word ";
  expect_error(c.post("/v1/completions", completion(long_prompt, 10)), 400,
               "maximum context length is 256 tokens");
  expect_error(c.post("/v1/completions", {{"prompt", {1, 2, 99999}}}), 400, "99999", "prompt");
  expect_error(c.get("/nope"), 404, "/nope");
  HttpResponse wrong = c.get("/v1/completions");
  expect_error(wrong, 405, "not allowed");
  EXPECT_EQ(wrong.header("allow"), "POST");
  expect_error(c.request("POST", "/health", "{}"), 405, "not allowed");
  // The same connection still works after all of that.
  EXPECT_EQ(c.get("/health").status, 200);
  EXPECT_EQ(fake_.submitted_count(), 0u);
}

TEST_F(HttpServerTest, BodyTooLargeIs413) {
  start();
  Client c(port_);
  std::string big = json{{"prompt", std::string(100 * 1024, 'a')}}.dump();
  HttpResponse r = c.request("POST", "/v1/completions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(body_json(r)["error"]["message"].get<std::string>().find("65536"), std::string::npos);
  EXPECT_EQ(r.header("connection"), "close");
  // Chunked bodies have no length up front; the limit still holds.
  Client d(port_);
  std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string chunk(32 * 1024, 'b');
  std::string body;
  for (int i = 0; i < 3; ++i) body += "8000\r\n" + chunk + "\r\n";
  d.send(head + body + "0\r\n\r\n");
  EXPECT_EQ(d.read_response().status, 413);
  EXPECT_EQ(Client(port_).get("/health").status, 200);
}

TEST_F(HttpServerTest, MalformedHttpAndHugeHeaders) {
  start();
  {
    Client c(port_);
    c.send("THIS IS NOT HTTP\r\n\r\n");
    EXPECT_EQ(c.read_response().status, 400);
  }
  {
    Client c(port_);
    c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'h') + "\r\n\r\n");
    EXPECT_EQ(c.read_response().status, 431);
  }
  EXPECT_EQ(Client(port_).get("/health").status, 200);
}

TEST_F(HttpServerTest, GarbageNeverCrashesTheServer) {
  start();
  const std::vector<std::string> inputs = {
      std::string("\x00\x01\x02\xff\xfe\r\n\r\n", 9),
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      std::string("GET /").append(20000, 'a').append(" HTTP/1.1\r\nHost: x\r\n\r\n"),
      "GET /health HTTP/9.9\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n" +
          std::string("\xff\xfe\x00\x01", 4),
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]",
  };
  for (const std::string& in : inputs) {
    Client c(port_, 5000ms);
    c.send(in);
    auto t0 = std::chrono::steady_clock::now();
    try {
      HttpResponse r = c.read_response();
      EXPECT_GE(r.status, 400) << in.substr(0, 80);
      EXPECT_LT(r.status, 500) << in.substr(0, 80);
    } catch (const std::exception&) {
      // Closing the connection is an acceptable answer to garbage.
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << in.substr(0, 80);
  }
  EXPECT_EQ(fake_.submitted_count(), 0u);
  EXPECT_EQ(Client(port_).get("/health").status, 200);
}

TEST_F(HttpServerTest, SlowClientIsDropped) {
  HttpServer::Options o = default_options();
  o.read_timeout_s = 0.5;
  start(o);
  Client c(port_, 5000ms);
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");  // and then nothing
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_EQ(Client(port_).get("/health").status, 200);
}

// A client that sends requests and never reads what comes back: once the
// socket buffers are full a write stalls, and write_timeout_s after that write
// started the server drops the connection (counting a request still being
// answered as 499) instead of answering the rest.
TEST_F(HttpServerTest, ClientThatStopsReadingIsDroppedAfterTheWriteTimeout) {
  HttpServer::Options o = default_options();
  o.write_timeout_s = 0.5;
  o.read_timeout_s = 60;  // an idle keep-alive connection is not what closes it
  start(o);
  fake_.set_token_delay(0ms);
  Client c(port_, 10000ms);
  const std::string body = completion("Never read", 200, {{"stream", true}}).dump();
  const std::string one =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  int requests = 0;
  std::string pipelined;
  for (; pipelined.size() < 60 * 1024; ++requests) pipelined += one;  // megabytes of responses
  c.send(pipelined);
  std::this_thread::sleep_for(3s);
  Client m(port_);
  const std::string metrics = m.get("/metrics").body;
  const double ok = metric(metrics, "troupe_requests_total{status=\"200\"}");
  const double dropped = std::max(0.0, metric(metrics, "troupe_requests_total{status=\"499\"}"));
  EXPECT_GT(ok, 0);
  EXPECT_LT(ok + dropped, requests) << "the server kept answering a client that does not read";
  EXPECT_LE(dropped, 1);
  EXPECT_EQ(fake_.running(), 0u) << "a request of the dropped connection still runs";
  EXPECT_TRUE(c.closed_by_server());  // what was sent before the drop, then the end
  EXPECT_EQ(m.get("/health").status, 200);
}

TEST_F(HttpServerTest, ServiceErrorsMapToStatuses) {
  start();
  Client c(port_);
  struct Case {
    ServiceErrorKind kind;
    int status;
    double retry;
    std::string retry_header;
  };
  for (const Case& k :
       {Case{ServiceErrorKind::QueueFull, 429, 2.5, "3"},
        Case{ServiceErrorKind::Unavailable, 503, 0.2, "1"},
        Case{ServiceErrorKind::Timeout, 504, 0, ""}, Case{ServiceErrorKind::Internal, 500, 0, ""},
        Case{ServiceErrorKind::BadRequest, 400, 0, ""}}) {
    fake_.fail_with(ServiceError{k.kind, "fake says no", k.retry});
    for (bool stream : {false, true}) {
      HttpResponse r = c.post("/v1/completions", completion("x", 5, {{"stream", stream}}));
      EXPECT_EQ(r.status, k.status) << r.body;
      EXPECT_EQ(body_json(r)["error"]["message"], "fake says no");
      EXPECT_EQ(r.header("retry-after"), k.retry_header) << k.status;
    }
  }
  fake_.fail_with(std::nullopt);
  EXPECT_EQ(c.post("/v1/completions", completion("x", 5)).status, 200);
}

TEST_F(HttpServerTest, ErrorAfterStreamStartedIsAnEvent) {
  start();
  fake_.fail_after(3, ServiceError{ServiceErrorKind::Internal, "replica exploded", 0});
  Client c(port_);
  HttpResponse r = c.post("/v1/completions", completion("Boom", 10, {{"stream", true}}));
  ASSERT_EQ(r.status, 200);
  StreamResult s = collect_stream(r.body);
  ASSERT_TRUE(s.error);
  EXPECT_EQ((*s.error)["error"]["message"], "replica exploded");
  EXPECT_EQ((*s.error)["error"]["status"], 500);
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.finish_reason.empty());
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamCancelsOnce) {
  start();
  fake_.set_token_delay(20ms);
  {
    Client c(port_);
    std::string req =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    std::string body = completion("Disconnect me", 200, {{"stream", true}}).dump();
    c.send(req + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    std::string got = c.read_until("data: ");
    ASSERT_NE(got.find("data: "), std::string::npos) << got;
    c.close();
  }
  expect_cancelled_once();
  Client m(port_);
  EXPECT_EQ(metric(m.get("/metrics").body, "troupe_requests_total{status=\"499\"}"), 1);
}

TEST_F(HttpServerTest, ClientDisconnectWhileWaitingCancelsOnce) {
  start();
  fake_.set_hang(true);
  {
    Client c(port_);
    std::string body = completion("Never answered", 10).dump();
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body);
    ASSERT_TRUE(fake_.wait_submitted(1));
    c.close();
  }
  auto req = fake_.wait_submitted(1);
  EXPECT_TRUE(fake_.wait_cancel(req->id));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(fake_.cancel_count(req->id), 1);
}

TEST_F(HttpServerTest, RequestDeadlineGives504) {
  HttpServer::Options o = default_options();
  o.request_timeout_s = 0.5;  // the service ends the request after this
  start(o);
  fake_.set_hang(true);
  Client c(port_);
  auto t0 = std::chrono::steady_clock::now();
  HttpResponse r = c.post("/v1/completions", completion("Slow", 5));
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_EQ(body_json(r)["error"]["message"], "request timed out");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 500ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 6s);
  auto req = fake_.wait_submitted(1);
  EXPECT_DOUBLE_EQ(req->timeout_s, 0.5);
  EXPECT_EQ(fake_.timeout_count(req->id), 1) << "the service's deadline ended it";
  EXPECT_EQ(fake_.stop_count(req->id), 1)
      << "stopped once: the server does not cancel what the service ended";
}

TEST_F(HttpServerTest, ThirtyTwoConcurrentRequests) {
  start();
  constexpr int kClients = 32;
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        std::string prompt = "Request number " + std::to_string(i);
        bool stream = i % 2 == 1;
        Client c(port_, 20000ms);
        HttpResponse r = c.post("/v1/completions", completion(prompt, 20, {{"stream", stream}}));
        std::string text;
        if (r.status != 200) {
          failures[i] = "status " + std::to_string(r.status) + ": " + r.body;
          return;
        }
        text = stream ? collect_stream(r.body).text
                      : body_json(r)["choices"][0]["text"].get<std::string>();
        if (text != expected_text(prompt, 20)) failures[i] = "wrong text: " + text;
      } catch (const std::exception& e) {
        failures[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(failures[i], "") << "client " << i;
  EXPECT_EQ(fake_.submitted_count(), size_t(kClients));
}

TEST_F(HttpServerTest, KeepAlivePipeliningAndExpectContinue) {
  start();
  Client c(port_);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.post("/v1/completions", completion("k", 3)).status, 200);
  // Two requests in one write: two answers, in order.
  std::string body = completion("pipelined", 4).dump();
  std::string one =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  c.send(one + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  HttpResponse a = c.read_response();
  HttpResponse b = c.read_response();
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(body_json(a)["choices"][0]["text"], expected_text("pipelined", 4));
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(body_json(b)["status"], "ok");
  // Expect: 100-continue gets its interim answer before the body is sent.
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n");
  std::string interim = c.read_until("\r\n\r\n");
  EXPECT_EQ(interim.rfind("HTTP/1.1 100 Continue", 0), 0u) << interim;
  c.send(body);
  EXPECT_EQ(c.read_response().status, 200);
}

// HEAD is GET without the body (health checkers, curl -I): the same header,
// Content-Length included, and nothing after it, so the next response on the
// connection starts right there. A proxy's absolute-form target is routed by
// its path.
TEST_F(HttpServerTest, HeadAndAbsoluteFormTargets) {
  start();
  Client c(port_);
  const HttpResponse get = c.get("/health");
  ASSERT_EQ(get.status, 200);
  c.send("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string head = c.read_until("\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: " + std::to_string(get.body.size()) + "\r\n"),
            std::string::npos)
      << head;
  c.send("HEAD /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string refused = c.read_until("\r\n\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 405", 0), 0u) << refused;
  EXPECT_NE(refused.find("Allow: POST\r\n"), std::string::npos) << refused;
  const HttpResponse after = c.get("/v1/models");
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(body_json(after)["data"][0]["id"], body_json(c.get("/v1/models"))["data"][0]["id"]);
  const HttpResponse absolute = c.post(
      "http://127.0.0.1:" + std::to_string(port_) + "/v1/completions", completion("absolute", 3));
  EXPECT_EQ(absolute.status, 200);
  EXPECT_EQ(body_json(absolute)["choices"][0]["text"], expected_text("absolute", 3));
}

// A web page's requests (CORS): the preflight a browser sends before a JSON
// POST, then the answer, whole or streamed, carries the origin's permission;
// with a list of origins only those are allowed, and a refused preflight
// says why. The connection goes on after each answer.
TEST_F(HttpServerTest, BrowserPagesArePreflightedAndAllowedByOrigin) {
  start();
  Client c(port_);
  const HttpHeaders page{{"Origin", "http://localhost:3000"}};
  const HttpResponse pre =
      c.request("OPTIONS", "/v1/chat/completions", "",
                {{"Origin", "http://localhost:3000"},
                 {"Access-Control-Request-Method", "POST"},
                 {"Access-Control-Request-Headers", "authorization,content-type"}});
  EXPECT_EQ(pre.status, 204);
  EXPECT_TRUE(pre.body.empty());
  EXPECT_EQ(pre.header("Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(pre.header("Access-Control-Allow-Methods"), "POST");
  EXPECT_EQ(pre.header("Access-Control-Allow-Headers"), "authorization,content-type");
  const HttpResponse whole =
      c.request("POST", "/v1/completions", completion("cors", 3).dump(), page);
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.header("Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(body_json(whole)["choices"][0]["text"], expected_text("cors", 3));
  const HttpResponse streamed =
      c.request("POST", "/v1/completions", completion("cors", 3, {{"stream", true}}).dump(), page);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.header("Access-Control-Allow-Origin"), "*");
  EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos) << streamed.body;
  const HttpResponse refused = c.request("GET", "/v1/completions", "", page);
  EXPECT_EQ(refused.status, 405);
  EXPECT_EQ(refused.header("Access-Control-Allow-Origin"), "*") << "pages may read errors too";
  EXPECT_EQ(c.get("/health").header("Access-Control-Allow-Origin"), "") << "no Origin, no CORS";
  server_.reset();

  HttpServer::Options o = default_options();
  o.allowed_origins = {"http://localhost:3000"};
  start(o);
  Client d(port_);
  EXPECT_EQ(d.request("GET", "/v1/models", "", page).header("Access-Control-Allow-Origin"),
            "http://localhost:3000");
  const HttpResponse other =
      d.request("GET", "/v1/models", "", {{"Origin", "http://localhost:4000"}});
  EXPECT_EQ(other.status, 200) << "a browser hides it; the server still answers";
  EXPECT_EQ(other.header("Access-Control-Allow-Origin"), "");
  EXPECT_EQ(other.header("Vary"), "Origin");
  const HttpResponse no =
      d.request("OPTIONS", "/v1/completions", "",
                {{"Origin", "http://localhost:4000"}, {"Access-Control-Request-Method", "POST"}});
  EXPECT_EQ(no.status, 403);
  EXPECT_NE(body_json(no)["error"]["message"].get<std::string>().find("http://localhost:4000"),
            std::string::npos);
  EXPECT_EQ(d.get("/health").status, 200);
}

// server.api_key: the model's endpoints answer only requests that carry the
// key (OpenAI's 401 invalid_api_key otherwise, counted like any refusal);
// probes, metrics and a browser's preflight need none.
TEST_F(HttpServerTest, TheApiKeyGuardsTheModelsEndpoints) {
  HttpServer::Options o = default_options();
  o.api_key = "sk-local-1";
  start(o);
  Client c(port_);
  const HttpHeaders key{{"Authorization", "Bearer sk-local-1"}};
  const HttpResponse none = c.post("/v1/completions", completion("key", 3));
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.header("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(body_json(none)["error"]["code"], "invalid_api_key");
  const HttpResponse wrong = c.request("POST", "/v1/completions", completion("key", 3).dump(),
                                       {{"Authorization", "Bearer sk-local-2"}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(body_json(wrong)["error"]["message"], "Incorrect API key provided.");
  EXPECT_EQ(fake_.submitted_count(), 0u) << "nothing reaches the service without the key";
  const HttpResponse ok = c.request("POST", "/v1/completions", completion("key", 3).dump(), key);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(body_json(ok)["choices"][0]["text"], expected_text("key", 3));
  const HttpResponse chat = c.request(
      "POST", "/v1/chat/completions",
      json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}.dump(), key);
  EXPECT_EQ(chat.status, 200) << chat.body;
  for (const char* path : {"/v1/models", "/v1/models/fortune"}) {
    EXPECT_EQ(c.get(path).status, 401) << path;
    EXPECT_EQ(c.request("GET", path, "", key).status, 200) << path;
  }
  EXPECT_EQ(c.request("POST", "/tokenize", R"({"prompt":"a"})").status, 401);
  EXPECT_EQ(c.request("POST", "/tokenize", R"({"prompt":"a"})", key).status, 200);
  EXPECT_EQ(c.request("POST", "/detokenize", R"({"tokens":[1]})").status, 401);
  for (const char* open : {"/health", "/ready", "/version", "/metrics"})
    EXPECT_EQ(c.get(open).status, 200) << open;
  EXPECT_EQ(c.request("OPTIONS", "/v1/completions", "",
                      {{"Origin", "http://x"}, {"Access-Control-Request-Method", "POST"}})
                .status,
            204);
  const std::string text = c.get("/metrics").body;
  EXPECT_EQ(metric(text, "troupe_requests_total{status=\"401\"}"), 2) << text;
}

// X-Request-Id, as vLLM and OpenAI: a client's id names the response
// ("cmpl-<id>") and comes back in the header; without one (or with one that
// is not a plain token) the header carries the response's own id.
TEST_F(HttpServerTest, RequestIdsComeBackAndNameTheResponse) {
  start();
  Client c(port_);
  const HttpResponse tagged = c.request("POST", "/v1/completions", completion("id", 2).dump(),
                                        {{"X-Request-Id", "trace-42.a_b:c"}});
  ASSERT_EQ(tagged.status, 200);
  EXPECT_EQ(tagged.header("X-Request-Id"), "trace-42.a_b:c");
  EXPECT_EQ(body_json(tagged)["id"], "cmpl-trace-42.a_b:c");
  const HttpResponse chat = c.request("POST", "/v1/chat/completions",
                                      json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                           {"max_tokens", 2},
                                           {"stream", true}}
                                          .dump(),
                                      {{"X-Request-Id", "t1"}});
  ASSERT_EQ(chat.status, 200);
  EXPECT_EQ(chat.header("X-Request-Id"), "t1");
  EXPECT_NE(chat.body.find("\"id\":\"chatcmpl-t1\""), std::string::npos) << chat.body;
  const HttpResponse plain = c.post("/v1/completions", completion("id", 2));
  EXPECT_EQ(plain.header("X-Request-Id"), body_json(plain)["id"]);
  for (const std::string& bad : {std::string("has space"), std::string(129, 'x')}) {
    const HttpResponse r =
        c.request("POST", "/v1/completions", completion("id", 2).dump(), {{"X-Request-Id", bad}});
    EXPECT_EQ(r.header("X-Request-Id"), body_json(r)["id"]) << bad;
    EXPECT_EQ(body_json(r)["id"].get<std::string>().find(bad), std::string::npos) << bad;
  }
  EXPECT_EQ(c.request("GET", "/health", "", {{"X-Request-Id", "probe-1"}}).header("X-Request-Id"),
            "probe-1");
  EXPECT_EQ(c.get("/health").header("X-Request-Id"), "");
}

// server.access_log: one line per answered request, completions with their
// figures, errors too; none without it.
TEST_F(HttpServerTest, AccessLogHasALinePerRequest) {
  std::ostringstream out;
  const auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(
      "access-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  spdlog::set_default_logger(logger);
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() { spdlog::set_default_logger(logger); }
  } restore{previous};
  HttpServer::Options o = default_options();
  o.access_log = true;
  start(o);
  Client c(port_);
  ASSERT_EQ(c.post("/v1/completions", completion("logged", 4)).status, 200);
  ASSERT_EQ(c.post("/v1/completions", completion("logged", 3, {{"stream", true}})).status, 200);
  ASSERT_EQ(c.get("/nope").status, 404);
  server_.reset();
  const std::string log = out.str();
  const int prompt = int(fortune().encode("logged", true).size());
  EXPECT_NE(log.find("\"POST /v1/completions\" 200 "), std::string::npos) << log;
  EXPECT_NE(log.find("prompt " + std::to_string(prompt) + ", completion 4 tokens, first token "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("completion 3 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("\"GET /nope\" 404 "), std::string::npos) << log;
  EXPECT_NE(log.find("access: 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find(", id cmpl-"), std::string::npos) << log;

  out.str("");
  start();  // the default: no access log
  Client d(port_);
  ASSERT_EQ(d.post("/v1/completions", completion("quiet", 2)).status, 200);
  server_.reset();
  EXPECT_EQ(out.str().find("access:"), std::string::npos) << out.str();
}

// More pipelined bytes than the server reads ahead while it answers (64 KiB):
// the watch for a disconnect stops, and nothing else may hold the connection
// up, yet every request is answered, in order. (The session used to be
// destroyed as soon as no read or write was pending: the connection closed
// without a byte while its request was being generated.)
TEST_F(HttpServerTest, PipelinedRequestsBeyondTheReadAheadAreAllAnswered) {
  fake_.set_token_delay(5ms);  // the first answer is still running when the bytes are in
  start();
  Client c(port_);
  const std::string pad(2000, 'x');
  std::string bytes;
  const int n = 40;  // about 85 KiB
  for (int i = 0; i < n; ++i) {
    json b = completion("pipelined " + std::to_string(i), 4, {{"stream", i % 2 == 1}});
    b["pad"] = pad;  // unknown fields are ignored
    const std::string body = b.dump();
    bytes +=
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  ASSERT_GT(bytes.size(), 64u * 1024);
  c.send(bytes);
  for (int i = 0; i < n; ++i) {
    HttpResponse r = c.read_response();
    ASSERT_EQ(r.status, 200) << "request " << i;
    const std::string want = expected_text("pipelined " + std::to_string(i), 4);
    if (i % 2 == 1) {
      StreamResult s = collect_stream(r.body);
      EXPECT_TRUE(s.done) << "request " << i;
      EXPECT_EQ(s.text, want) << "request " << i;
    } else {
      EXPECT_EQ(body_json(r)["choices"][0]["text"], want) << "request " << i;
    }
  }
  EXPECT_EQ(c.get("/health").status, 200);
}

// RFC 9110 10.1.1: a 100-continue expectation in an HTTP/1.0 request is
// ignored. An HTTP/1.0 client knows no interim responses, so a "100 Continue"
// would be read as the response itself and the real one as garbage after it.
TEST_F(HttpServerTest, Http10ExpectContinueGetsNoInterimResponse) {
  start();
  Client c(port_);
  const std::string body = completion("Old client", 3).dump();
  c.send("POST /v1/completions HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string head = c.read_until("\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK", 0), 0u) << head;
}

TEST_F(HttpServerTest, Http10StreamIsCloseDelimited) {
  start();
  Client c(port_);
  HttpResponse r = c.request("POST", "/v1/completions",
                             completion("Old client", 6, {{"stream", true}}).dump(), {}, 10);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("transfer-encoding"), "");
  StreamResult s = collect_stream(r.body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, expected_text("Old client", 6));
}

TEST_F(HttpServerTest, WithoutTokenizerOnlyTokenIds) {
  start(std::nullopt, /*with_tokenizer=*/false);
  Client c(port_);
  HttpResponse text = c.post("/v1/completions", completion("words", 3));
  EXPECT_EQ(text.status, 400);
  std::vector<int> prompt = {1, 700};
  HttpResponse ids = c.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 3}});
  ASSERT_EQ(ids.status, 200) << ids.body;
  EXPECT_EQ(body_json(ids)["choices"][0]["text"], "");
  EXPECT_EQ(body_json(ids)["choices"][0]["token_ids"], json(fake_output(prompt, 3)));
  HttpResponse s =
      c.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 3}, {"stream", true}});
  ASSERT_EQ(s.status, 200) << s.body;
  std::vector<int> streamed;
  for (const std::string& ev : sse_events(s.body)) {
    if (ev == "[DONE]") continue;
    json chunk = json::parse(ev);
    for (int id : chunk["choices"][0]["token_ids"]) streamed.push_back(id);
  }
  EXPECT_EQ(streamed, fake_output(prompt, 3)) << s.body;
}

TEST_F(HttpServerTest, TooManyConnectionsGet503) {
  HttpServer::Options o = default_options();
  o.max_connections = 2;
  start(o);
  Client a(port_), b(port_);
  EXPECT_EQ(a.get("/health").status, 200);
  EXPECT_EQ(b.get("/health").status, 200);
  Client extra(port_);
  HttpResponse r = extra.read_response();  // refused without being asked
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.header("retry-after"), "1");
  extra.close();
  a.close();
  // Once a slot frees up, new connections are served again.
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {
    std::this_thread::sleep_for(20ms);
    Client d(port_);
    served = d.get("/health").status == 200;
  }
  EXPECT_TRUE(served);
}

TEST_F(HttpServerTest, MetricsCountRequestsByStatus) {
  start();
  Client c(port_);
  EXPECT_EQ(c.post("/v1/completions", completion("one", 4)).status, 200);
  EXPECT_EQ(c.post("/v1/completions", completion("two", 4, {{"stream", true}})).status, 200);
  EXPECT_EQ(c.post("/v1/completions", completion("x", 4, {{"n", 0}})).status, 400);
  EXPECT_EQ(c.post("/v1/completions", completion("x", 4, {{"model", "m"}})).status, 404);
  fake_.fail_with(ServiceError{ServiceErrorKind::QueueFull, "full", 1});
  EXPECT_EQ(c.post("/v1/completions", completion("x", 4)).status, 429);
  fake_.fail_with(ServiceError{ServiceErrorKind::Unavailable, "down", 1});
  EXPECT_EQ(c.post("/v1/completions", completion("x", 4)).status, 503);
  fake_.fail_with(std::nullopt);
  EXPECT_EQ(c.get("/health").status, 200);  // not a completion: not counted

  HttpResponse m = c.get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.header("content-type").rfind("text/plain; version=0.0.4", 0), 0u);
  const std::string& t = m.body;
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"200\"}"), 2) << t;
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"400\"}"), 1);
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"404\"}"), 1);
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"429\"}"), 1);
  EXPECT_EQ(metric(t, "troupe_requests_total{status=\"503\"}"), 1);
  EXPECT_EQ(metric(t, "troupe_time_to_first_token_seconds_count"), 2);
  EXPECT_EQ(metric(t, "troupe_time_per_output_token_seconds_count"), 2);
  EXPECT_EQ(metric(t, "troupe_request_latency_seconds_count"), 2);
  EXPECT_EQ(metric(t, "troupe_generation_tokens_total"), 8);
  EXPECT_GT(metric(t, "troupe_prompt_tokens_total"), 0);
}

TEST_F(HttpServerTest, StopWithRequestsInFlight) {
  start();
  fake_.set_hang(true);
  Client c(port_);
  std::string body = completion("in flight at shutdown", 10).dump();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  auto req = fake_.wait_submitted(1);
  ASSERT_TRUE(req);
  auto t0 = std::chrono::steady_clock::now();
  server_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_EQ(fake_.cancel_count(req->id), 1);
  EXPECT_TRUE(c.closed_by_server());
}

// Shutting down: new requests get 503 at once (and /ready), those in
// flight go on; stop() then ends each with a 503 of its own, a JSON body,
// or for a stream that started an error event and [DONE], whatever the
// service does, before it closes.
TEST_F(HttpServerTest, ShutdownRefusesNewRequestsAndStopEndsOpenOnesWith503) {
  start();
  fake_.set_hang(true);
  Client waiting(port_);
  const std::string body = completion("never answered", 10).dump();
  waiting.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_TRUE(fake_.wait_submitted(1));
  fake_.set_hang(false);
  fake_.set_token_delay(50ms);
  Client streaming(port_);
  const std::string sbody = completion("Streams for long", 200, {{"stream", true}}).dump();
  streaming.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 std::to_string(sbody.size()) + "\r\n\r\n" + sbody);
  ASSERT_NE(streaming.read_until("data: ").find("data: "), std::string::npos);
  EXPECT_EQ(server_->in_flight(), 2u);

  server_->begin_shutdown();
  {
    Client late(port_);
    HttpResponse r = late.post("/v1/completions", completion("too late", 5));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("shutting down"), std::string::npos) << r.body;
    EXPECT_FALSE(r.header("Retry-After").empty());
    EXPECT_FALSE(r.keep_alive);
    Client probe(port_);
    EXPECT_EQ(probe.get("/ready").status, 503);
  }
  EXPECT_EQ(fake_.submitted_count(), 2u);  // the late one never reached the service
  EXPECT_EQ(server_->in_flight(), 2u);     // the open ones go on

  std::thread stopper([&] { server_->stop(); });
  HttpResponse r = waiting.read_response();
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(body_json(r)["error"]["message"].get<std::string>().find("shutting down"),
            std::string::npos)
      << r.body;
  const std::string rest = streaming.read_until("data: [DONE]");
  const size_t error = rest.find("\"error\"");
  EXPECT_NE(error, std::string::npos) << rest;
  EXPECT_NE(rest.find("\"status\":503", error), std::string::npos) << rest;
  EXPECT_NE(rest.find("data: [DONE]", error), std::string::npos) << rest;
  stopper.join();
  EXPECT_EQ(server_->in_flight(), 0u);
  EXPECT_FALSE(r.keep_alive);  // "Connection: close"
  EXPECT_TRUE(streaming.closed_by_server());
}

}  // namespace
}  // namespace troupe
