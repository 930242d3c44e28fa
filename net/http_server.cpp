#include "net/http_server.h"

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/text_streamer.h"
#include "util/rng.h"

namespace troupe {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

class Session;

// Lets sinks on runtime threads post to a connection only while the server's
// io_context exists: stop() closes the gate (waiting for posts in progress)
// before the io_context goes away.
struct Gate {
  std::shared_mutex mu;
  bool open = true;
};

constexpr size_t kMaxPipelinedBytes = 64 * 1024;  // read ahead while a request runs
constexpr auto kLingerTime = std::chrono::seconds(2);

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string_view path_of(beast::string_view target) {
  std::string_view t(target.data(), target.size());
  return t.substr(0, t.find('?'));
}

bool is_http_parse_error(const beast::error_code& ec) {
  return &ec.category() == &http::make_error_code(http::error::bad_target).category();
}

uint64_t next_request_id() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

// splitmix64 of one value: seeds that differ per request without a lock.
uint64_t mix64(uint64_t x) {
  return splitmix64(x);
}

double secs(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

struct HttpServer::Impl {
  Impl(Options o, CompletionService& s, std::optional<Tokenizer> t, openai::ModelLimits m,
       Metrics& mx)
      : opt(std::move(o)),
        service(s),
        tokenizer(std::move(t)),
        model(std::move(m)),
        metrics(mx),
        nonce(std::random_device{}() * 0x100000000ull ^ std::random_device{}()),
        created(std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count()) {}

  void run_io();
  void do_accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  void add_session(Session* s, std::weak_ptr<Session> w);
  void remove_session(Session* s);
  size_t session_count();

  Options opt;
  CompletionService& service;
  std::optional<Tokenizer> tokenizer;
  openai::ModelLimits model;
  Metrics& metrics;
  uint64_t nonce;
  int64_t created;

  std::shared_ptr<Gate> gate = std::make_shared<Gate>();
  // Declared before the io_context: sessions still queued in it at its
  // destruction unregister themselves here.
  std::mutex sessions_mu;
  std::condition_variable sessions_cv;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;

  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_retry;
  std::vector<std::thread> threads;
  std::atomic<uint16_t> bound_port{0};
  bool started = false;
  bool stopped = false;
};

namespace {

// One request/response on a connection, from submission to the last byte.
struct Exchange {
  uint64_t seq = 0;  // session-local: events of an earlier exchange are ignored
  uint64_t request_id = 0;
  openai::CompletionParams params;
  openai::ResponseMeta meta;
  int prompt_tokens = 0;
  std::optional<TextStreamer> streamer;
  StopStringFilter stop{{}};
  std::string text;      // non-streaming: everything released so far
  std::vector<int> ids;  // token ids not yet sent (streaming) or all (non-streaming)
  int completion_tokens = 0;
  Clock::time_point submitted, first_token, last_token;
  bool finished = false;      // the outcome is decided (and counted)
  bool cancel_sent = false;   // service.cancel() was called
  bool headers_sent = false;  // streaming: the 200 and SSE headers are out
  bool warned_overflow = false;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer::Impl& server)
      : server_(server), stream_(std::move(socket)) {}

  ~Session() { server_.remove_session(this); }

  net::any_io_executor executor() { return stream_.get_executor(); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // Beyond max_connections: one 503, then close.
  void reject_busy() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      openai::ApiError e;
      e.status = 503;
      e.type = "service_unavailable";
      e.message = "Too many open connections; retry later.";
      e.retry_after_s = 1;
      self->keep_alive_ = false;
      self->respond_error(e, /*close=*/true);
    });
  }

  // The server is stopping: give up the request in flight and close.
  void shutdown() {
    if (active_ && !active_->finished) {
      active_->finished = true;
      cancel_service();
    }
    close();
  }

  // ---- events from the sink (on the strand) ----

  void on_token(uint64_t seq, int id, Clock::time_point t) {
    Exchange* ex = current(seq);
    if (!ex) return;
    if (ex->completion_tokens >= ex->params.max_tokens) {
      if (!ex->warned_overflow)
        spdlog::warn("request {}: the service sent more than max_tokens={} tokens; extra ignored",
                     ex->request_id, ex->params.max_tokens);
      ex->warned_overflow = true;
      return;
    }
    if (ex->completion_tokens == 0) ex->first_token = t;
    ex->last_token = t;
    ++ex->completion_tokens;
    ex->ids.push_back(id);

    std::string piece;
    if (ex->streamer) {
      try {
        piece = ex->streamer->put(id);
      } catch (const std::exception& e) {
        spdlog::warn("request {}: token {} cannot be decoded: {}", ex->request_id, id, e.what());
      }
    }
    std::string out = ex->stop.push(piece);
    if (ex->stop.stopped()) {
      // Our stop string, not the service's: end now and stop the generation.
      cancel_service();
      finish_ok(FinishReason::Stop, out, t);
      return;
    }
    if (!ex->params.stream) {
      ex->text += out;
      return;
    }
    // Without a tokenizer every token is news (its id); with one, only text is.
    if (!out.empty() || !server_.tokenizer) {
      std::string chunk = openai::sse_text_chunk(ex->meta, out, std::nullopt,
                                                 ex->params.include_usage, ids_to_send(*ex));
      ex->ids.clear();
      stream_bytes(chunk, /*last=*/false);
    }
  }

  void on_done(uint64_t seq, FinishReason reason, int prompt_tokens, Clock::time_point t) {
    Exchange* ex = current(seq);
    if (!ex) return;
    if (reason == FinishReason::Cancelled) {
      // Only we cancel, and then the exchange has already ended.
      ServiceError e{ServiceErrorKind::Unavailable, "The request was cancelled by the server.", 1};
      finish_error(openai::from_service_error(e));
      return;
    }
    if (prompt_tokens > 0) ex->prompt_tokens = prompt_tokens;
    std::string tail;
    if (ex->streamer) {
      try {
        tail = ex->streamer->finish();
      } catch (const std::exception& e) {
        spdlog::warn("request {}: decoding the tail failed: {}", ex->request_id, e.what());
      }
    }
    std::string out = ex->stop.push(tail);
    if (ex->stop.stopped()) {
      reason = FinishReason::Stop;
    } else {
      out += ex->stop.flush();
    }
    finish_ok(reason, out, t);
  }

  void on_error(uint64_t seq, const ServiceError& e) {
    if (!current(seq)) return;
    finish_error(openai::from_service_error(e));
  }

 private:
  Exchange* current(uint64_t seq) {
    if (!active_ || active_->seq != seq || active_->finished) return nullptr;
    return &*active_;
  }

  const std::vector<int>* ids_to_send(const Exchange& ex) const {
    return (ex.params.return_token_ids || !server_.tokenizer) ? &ex.ids : nullptr;
  }

  // ---- reading requests ----

  void read_request() {
    if (closed_) return;
    active_.reset();
    response_complete_ = false;
    close_after_response_ = false;
    parser_.emplace();
    parser_->header_limit(uint32_t(std::min<size_t>(server_.opt.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(server_.opt.max_body_bytes);
    stream_.expires_after(seconds(server_.opt.read_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (ec) return on_read_error(ec);
    const auto& req = parser_->get();
    if (auto len = parser_->content_length(); len && *len > server_.opt.max_body_bytes)
      return on_read_error(http::error::body_limit);
    auto expect = req[http::field::expect];
    if (beast::iequals(expect, "100-continue")) queue_bytes("HTTP/1.1 100 Continue\r\n\r\n");
    stream_.expires_after(seconds(server_.opt.read_timeout_s));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    if (closed_) return;
    if (ec) return on_read_error(ec);
    req_ = parser_->release();
    parser_.reset();
    keep_alive_ = req_.keep_alive();
    try {
      handle_request();
    } catch (const std::exception& e) {
      // A bug, not the client's fault; the connection must still get an answer.
      spdlog::error("http: handling {} {} failed: {}", std::string(req_.method_string()),
                    std::string(req_.target()), e.what());
      openai::ApiError err;
      err.status = 500;
      err.type = "server_error";
      err.message = "Internal server error.";
      if (active_ && !active_->finished) {
        cancel_service();
        finish_error(err);
      } else if (!response_complete_) {
        respond_error(err, true);
      }
    }
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted) {
      // The client is done, or idle / too slow (the stream is already closed).
      return close();
    }
    keep_alive_ = false;
    if (ec == http::error::header_limit) {
      openai::ApiError e =
          openai::bad_request("The request headers are larger than " +
                              std::to_string(server_.opt.max_header_bytes) + " bytes.");
      e.status = 431;
      return respond_error(e, true);
    }
    if (ec == http::error::body_limit) {
      openai::ApiError e =
          openai::bad_request("The request body is larger than the limit of " +
                                  std::to_string(server_.opt.max_body_bytes) + " bytes.",
                              {}, "request_too_large");
      e.status = 413;
      if (parser_ && path_of(parser_->get().target()) == "/v1/completions")
        server_.metrics.request_finished(413);
      return respond_error(e, true);
    }
    if (is_http_parse_error(ec))
      return respond_error(openai::bad_request("Malformed HTTP request: " + ec.message()), true);
    close();  // reset by peer and the like
  }

  // ---- routing ----

  void handle_request() {
    std::string_view path = path_of(req_.target());
    auto method = req_.method();
    auto only = [&](http::verb v, const char* allow) {
      if (method == v) return true;
      openai::ApiError e =
          openai::bad_request("Method " + std::string(req_.method_string()) +
                              " is not allowed on " + std::string(path) + "; use " + allow + ".");
      e.status = 405;
      respond_error(e, false, {{"Allow", allow}});
      return false;
    };
    if (path == "/v1/completions") {
      if (only(http::verb::post, "POST")) handle_completions();
    } else if (path == "/v1/models") {
      if (only(http::verb::get, "GET"))
        respond(200, openai::dump(openai::models_response(server_.model, server_.created)));
    } else if (path == "/health") {
      if (only(http::verb::get, "GET")) respond(200, R"({"status":"ok"})");
    } else if (path == "/ready") {
      if (!only(http::verb::get, "GET")) return;
      if (server_.service.ready()) return respond(200, R"({"status":"ready"})");
      openai::ApiError e;
      e.status = 503;
      e.type = "service_unavailable";
      e.message = "No replica is ready to serve.";
      e.retry_after_s = 1;
      respond_error(e, false);
    } else if (path == "/metrics") {
      if (only(http::verb::get, "GET"))
        respond(200, server_.metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
    } else {
      openai::ApiError e = openai::bad_request("Not found: " + std::string(path), {}, "not_found");
      e.status = 404;
      respond_error(e, false);
    }
  }

  void handle_completions() {
    const openai::ModelLimits& limits = server_.model;
    auto parsed = openai::parse_completion_request(req_.body(), limits);
    if (auto* e = std::get_if<openai::ApiError>(&parsed)) return reject(*e);
    auto& params = std::get<openai::CompletionParams>(parsed);
    const Tokenizer* tok = server_.tokenizer ? &*server_.tokenizer : nullptr;
    auto prompt = openai::resolve_prompt(params, tok, limits);
    if (auto* e = std::get_if<openai::ApiError>(&prompt)) return reject(*e);
    std::vector<int>& ids = std::get<std::vector<int>>(prompt);

    Exchange& ex = active_.emplace();
    ex.seq = ++next_seq_;
    ex.request_id = next_request_id();
    ex.meta.id = openai::completion_id(server_.nonce, ex.request_id);
    ex.meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    ex.meta.model = limits.name;
    ex.prompt_tokens = int(ids.size());
    if (server_.tokenizer) ex.streamer.emplace(*server_.tokenizer);
    ex.stop = StopStringFilter(params.stop);
    ex.params = std::move(params);
    // HTTP/1.0 has no chunked encoding: stream until close instead.
    chunked_ = req_.version() >= 11;
    if (ex.params.stream && !chunked_) keep_alive_ = false;

    CompletionRequest r;
    r.id = ex.request_id;
    r.prompt = std::move(ids);
    r.max_tokens = ex.params.max_tokens;
    r.sampling.temperature = ex.params.temperature;
    r.sampling.top_p = ex.params.top_p;
    r.sampling.top_k = ex.params.top_k;
    r.sampling.seed = ex.params.seed ? *ex.params.seed : mix64(server_.nonce ^ ex.request_id);
    r.priority = ex.params.priority;
    r.timeout_s = server_.opt.request_timeout_s;
    r.ignore_eos = ex.params.ignore_eos;

    ex.submitted = Clock::now();
    auto sink = std::make_shared<Sink>(server_.gate, weak_from_this(), ex.seq);
    try {
      server_.service.submit(std::move(r), std::move(sink));
    } catch (const std::exception& e) {
      spdlog::error("request {}: submit failed: {}", ex.request_id, e.what());
      openai::ApiError err;
      err.status = 500;
      err.type = "server_error";
      err.message = "The request could not be submitted.";
      return finish_error(err);
    }
    // The events may already be queued on our strand; they run after this
    // handler, so the exchange is still ours here.
    if (active_ && !active_->finished) start_monitor();
  }

  // A completion request refused before submission.
  void reject(const openai::ApiError& e) {
    server_.metrics.request_finished(e.status);
    respond_error(e, false);
  }

  // ---- ending an exchange ----

  void finish_ok(FinishReason reason, const std::string& tail, Clock::time_point end) {
    Exchange& ex = *active_;
    ex.finished = true;
    openai::Usage usage{ex.prompt_tokens, ex.completion_tokens};
    if (ex.params.stream) {
      std::string bytes =
          openai::sse_text_chunk(ex.meta, tail, reason, ex.params.include_usage, ids_to_send(ex));
      if (ex.params.include_usage) bytes += openai::sse_usage_chunk(ex.meta, usage);
      bytes += openai::sse_done();
      stream_bytes(bytes, /*last=*/true);
    } else {
      ex.text += tail;
      respond(200, openai::dump(openai::completion_response(ex.meta, ex.text, reason, usage,
                                                            ids_to_send(ex))));
    }
    record(ex, 200, end);
  }

  void finish_error(const openai::ApiError& e) {
    Exchange& ex = *active_;
    ex.finished = true;
    if (ex.params.stream && ex.headers_sent) {
      stream_bytes(openai::sse_error(e) + openai::sse_done(), /*last=*/true);
    } else {
      respond_error(e, false);
    }
    record(ex, e.status, Clock::now());
  }

  void record(const Exchange& ex, int status, Clock::time_point end) {
    Metrics& m = server_.metrics;
    m.request_finished(status);
    m.add_prompt_tokens(ex.prompt_tokens);
    m.add_generation_tokens(ex.completion_tokens);
    if (status != 200) return;
    if (ex.completion_tokens > 0) {
      m.observe_time_to_first_token(secs(ex.first_token - ex.submitted));
      if (ex.completion_tokens > 1)
        m.observe_time_per_output_token(secs(ex.last_token - ex.first_token) /
                                        (ex.completion_tokens - 1));
    }
    m.observe_request_latency(secs(end - ex.submitted));
  }

  void cancel_service() {
    if (!active_ || active_->cancel_sent) return;
    active_->cancel_sent = true;
    try {
      server_.service.cancel(active_->request_id);
    } catch (const std::exception& e) {
      spdlog::error("request {}: cancel failed: {}", active_->request_id, e.what());
    }
  }

  // The client went away (EOF, reset, a failed or stalled write).
  void client_gone() {
    if (active_ && !active_->finished) {
      active_->finished = true;
      cancel_service();
      server_.metrics.request_finished(499);
      server_.metrics.add_prompt_tokens(active_->prompt_tokens);
      server_.metrics.add_generation_tokens(active_->completion_tokens);
    }
    close();
  }

  // ---- writing ----

  static std::string status_line(int status) {
    auto reason = http::obsolete_reason(http::int_to_status(unsigned(status)));
    return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) +
           "\r\n";
  }

  using Headers = std::vector<std::pair<std::string, std::string>>;

  void respond(int status, const std::string& body,
               std::string_view content_type = "application/json", const Headers& extra = {},
               bool close = false) {
    close_after_response_ = close_after_response_ || close || !keep_alive_;
    std::string out = status_line(status);
    out += "Server: troupe\r\nContent-Type: ";
    out += content_type;
    out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [k, v] : extra) out += k + ": " + v + "\r\n";
    out += close_after_response_ ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
    out += body;
    response_complete_ = true;
    queue_bytes(std::move(out));
  }

  void respond_error(const openai::ApiError& e, bool close, Headers extra = {}) {
    if (e.retry_after_s > 0)
      extra.emplace_back("Retry-After",
                         std::to_string(openai::retry_after_header_seconds(e.retry_after_s)));
    respond(e.status, openai::error_body(e), "application/json", extra, close);
  }

  // Streaming: the headers go out with the first bytes, so that an error
  // before any token (429, 503) still gets its own status.
  void stream_bytes(const std::string& data, bool last) {
    Exchange& ex = *active_;
    std::string out;
    if (!ex.headers_sent) {
      ex.headers_sent = true;
      out = status_line(200);
      out +=
          "Server: troupe\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
          "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
      out += chunked_ ? "Transfer-Encoding: chunked\r\n" : "";
      out += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    }
    if (chunked_) {
      char size[20];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      out += size;
      out += data;
      out += "\r\n";
      if (last) out += "0\r\n\r\n";
    } else {
      out += data;
    }
    if (last) {
      response_complete_ = true;
      close_after_response_ = close_after_response_ || !keep_alive_;
    }
    queue_bytes(std::move(out));
  }

  // One write in flight at a time; what arrives meanwhile is coalesced, so a
  // slow reader costs at most max_tokens chunks of memory.
  void queue_bytes(std::string bytes) {
    out_ += bytes;
    kick_writer();
  }

  void kick_writer() {
    if (writing_ || closed_ || out_.empty()) return;
    writing_ = true;
    inflight_.swap(out_);
    out_.clear();
    stream_.expires_after(seconds(server_.opt.write_timeout_s));
    net::async_write(
        stream_, net::buffer(inflight_),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    inflight_.clear();
    if (closed_) return;
    if (ec) return client_gone();
    if (!out_.empty()) return kick_writer();
    if (response_complete_) end_response();
  }

  void end_response() {
    response_complete_ = false;
    if (close_after_response_) return graceful_close();
    if (monitor_pending_) {
      // The watch read must end before the next request is read; whatever it
      // got is kept in buffer_.
      resume_after_monitor_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    read_request();
  }

  // ---- watching for disconnects while a request runs ----

  void start_monitor() {
    if (monitor_pending_ || closed_ || buffer_.size() >= kMaxPipelinedBytes) return;
    monitor_pending_ = true;
    stream_.expires_never();  // only the read side if a write is in flight
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_monitor(ec, n); });
  }

  void on_monitor(beast::error_code ec, size_t n) {
    monitor_pending_ = false;
    buffer_.commit(n);
    if (closed_) return;
    if (draining_) return drain();
    if (resume_after_monitor_) {
      resume_after_monitor_ = false;
      if (ec && ec != net::error::operation_aborted) return close();
      return read_request();
    }
    if (ec) return client_gone();
    start_monitor();  // pipelined bytes: keep them for the next request
  }

  // ---- closing ----

  // After an error response the client may still be sending (a body over the
  // limit): half-close, then read and discard for a moment, so that the
  // client sees the response instead of a connection reset.
  void graceful_close() {
    if (closed_) return;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    draining_ = true;
    if (monitor_pending_) {
      stream_.socket().cancel(ignored);  // on_monitor() continues with drain()
      return;
    }
    drain();
  }

  void drain() {
    if (closed_) return;
    if (drained_ > server_.opt.max_body_bytes + kMaxPipelinedBytes) return close();
    if (!linger_started_) {
      linger_started_ = true;
      stream_.expires_after(kLingerTime);
    }
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  class Sink : public CompletionSink {
   public:
    Sink(std::shared_ptr<Gate> gate, std::weak_ptr<Session> session, uint64_t seq)
        : gate_(std::move(gate)), session_(std::move(session)), seq_(seq) {}

    void on_token(int token_id) override {
      deliver(
          [seq = seq_, token_id, t = Clock::now()](Session& s) { s.on_token(seq, token_id, t); });
    }
    void on_done(FinishReason reason, int prompt_tokens, int) override {
      deliver([seq = seq_, reason, prompt_tokens, t = Clock::now()](Session& s) {
        s.on_done(seq, reason, prompt_tokens, t);
      });
    }
    void on_error(const ServiceError& error) override {
      deliver([seq = seq_, error](Session& s) { s.on_error(seq, error); });
    }

   private:
    // Never blocks the runtime thread beyond a shared lock and a post.
    template <class F>
    void deliver(F&& f) {
      std::shared_lock lock(gate_->mu);
      if (!gate_->open) return;
      std::shared_ptr<Session> s = session_.lock();
      if (!s) return;  // the connection is gone; its outcome is already counted
      net::any_io_executor ex = s->executor();
      net::post(ex, [s = std::move(s), f = std::forward<F>(f)]() mutable { f(*s); });
    }

    std::shared_ptr<Gate> gate_;
    std::weak_ptr<Session> session_;
    uint64_t seq_;
  };

  HttpServer::Impl& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  std::optional<Exchange> active_;
  uint64_t next_seq_ = 0;
  std::string out_, inflight_;
  std::array<char, 4096> scratch_{};
  size_t drained_ = 0;
  bool keep_alive_ = true;
  bool chunked_ = true;
  bool writing_ = false;
  bool response_complete_ = false;
  bool close_after_response_ = false;
  bool monitor_pending_ = false;
  bool resume_after_monitor_ = false;
  bool draining_ = false;
  bool linger_started_ = false;
  bool closed_ = false;
};

}  // namespace

// ---- HttpServer::Impl ----

void HttpServer::Impl::run_io() {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      // A handler threw: log it and keep serving the other connections.
      spdlog::error("http: io thread caught: {}", e.what());
    }
  }
}

void HttpServer::Impl::do_accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void HttpServer::Impl::on_accept(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
  if (ec) {
    // Out of file descriptors and the like: back off instead of spinning.
    spdlog::warn("http: accept failed: {}", ec.message());
    accept_retry->expires_after(std::chrono::milliseconds(100));
    accept_retry->async_wait([this](beast::error_code e) {
      if (!e && acceptor->is_open()) do_accept();
    });
    return;
  }
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);  // SSE chunks are small
  bool busy = session_count() >= opt.max_connections;
  auto session = std::make_shared<Session>(std::move(socket), *this);
  add_session(session.get(), session);
  if (busy) {
    session->reject_busy();
  } else {
    session->start();
  }
  do_accept();
}

void HttpServer::Impl::add_session(Session* s, std::weak_ptr<Session> w) {
  std::lock_guard lock(sessions_mu);
  sessions.emplace(s, std::move(w));
}

void HttpServer::Impl::remove_session(Session* s) {
  std::lock_guard lock(sessions_mu);
  sessions.erase(s);
  if (sessions.empty()) sessions_cv.notify_all();
}

size_t HttpServer::Impl::session_count() {
  std::lock_guard lock(sessions_mu);
  return sessions.size();
}

// ---- HttpServer ----

HttpServer::HttpServer(Options options, CompletionService& service,
                       std::optional<Tokenizer> tokenizer, openai::ModelLimits model,
                       Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), service, std::move(tokenizer),
                                   std::move(model), metrics)) {}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  Impl& s = *impl_;
  if (s.started) throw std::logic_error("HttpServer::start() called twice");
  const std::string where = s.opt.host + ":" + std::to_string(s.opt.port);
  try {
    tcp::resolver resolver(s.ioc);
    auto results = resolver.resolve(s.opt.host, std::to_string(s.opt.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service);
    if (results.empty()) throw std::runtime_error("no address");
    tcp::endpoint ep = results.begin()->endpoint();
    s.acceptor.emplace(net::make_strand(s.ioc));
    s.acceptor->open(ep.protocol());
    s.acceptor->set_option(net::socket_base::reuse_address(true));
    s.acceptor->bind(ep);
    s.acceptor->listen(net::socket_base::max_listen_connections);
    s.bound_port = s.acceptor->local_endpoint().port();
  } catch (const std::exception& e) {
    s.acceptor.reset();
    throw std::runtime_error("cannot listen on " + where + ": " + e.what());
  }
  s.accept_retry.emplace(s.acceptor->get_executor());
  s.work.emplace(s.ioc.get_executor());
  s.started = true;
  s.do_accept();
  int n = std::max(1, s.opt.io_threads);
  for (int i = 0; i < n; ++i) s.threads.emplace_back([&s] { s.run_io(); });
  spdlog::info("http: listening on {}:{} ({} io threads)", s.opt.host, s.bound_port.load(), n);
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  net::post(s.acceptor->get_executor(), [&s] {
    beast::error_code ignored;
    s.acceptor->close(ignored);
    s.accept_retry->cancel();
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(s.sessions_mu);
    for (auto& [ptr, weak] : s.sessions)
      if (auto p = weak.lock()) live.push_back(std::move(p));
  }
  for (auto& p : live) net::post(p->executor(), [p] { p->shutdown(); });
  live.clear();
  {
    // Sessions end once their cancelled operations complete; bounded, since
    // a stuck one must not hang shutdown (the io_context reclaims it).
    std::unique_lock lock(s.sessions_mu);
    s.sessions_cv.wait_for(lock, std::chrono::seconds(2), [&s] { return s.sessions.empty(); });
  }
  {
    std::unique_lock gate(s.gate->mu);
    s.gate->open = false;
  }
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

uint16_t HttpServer::port() const {
  return impl_->bound_port.load();
}

}  // namespace troupe
