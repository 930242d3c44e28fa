#include "net/http_server.h"

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "net/access_log.h"
#include "net/admin_endpoint.h"
#include "net/bearer_auth.h"
#include "net/completion_choices.h"
#include "net/completion_exchange.h"
#include "net/cors.h"
#include "net/endpoints.h"
#include "net/http_framing.h"
#include "net/responses_api.h"
#include "service/version.h"
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
// Prompt texts up to this long are tokenized on the io thread (under half a
// millisecond); longer ones on the tokenizing thread.
constexpr size_t kTokenizeInlineBytes = 1024;
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLoggedTargetBytes = 256;  // of a request's target, in the access log

// A client's X-Request-Id as we repeat it (in the response, its id, the
// log): up to 128 of [A-Za-z0-9._:-], else not used at all.
std::string request_tag(std::string_view given) {
  if (given.empty() || given.size() > 128) return {};
  for (char c : given)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
          c == '-'))
      return {};
  return std::string(given);
}

std::string peer_of(const tcp::socket& socket) {
  beast::error_code ec;
  const tcp::endpoint e = socket.remote_endpoint(ec);
  if (ec) return "-";
  const std::string ip = e.address().to_string();
  return (e.address().is_v6() ? "[" + ip + "]" : ip) + ":" + std::to_string(e.port());
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A JSON answer, or the error instead.
Response json_answer(const openai::Result<nlohmann::json>& r) {
  if (auto* e = std::get_if<openai::ApiError>(&r)) return error_response(*e);
  Response out;
  out.body = openai::dump(std::get<nlohmann::json>(r));
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Beast 1.74's string_view is Boost's, which does not convert to std's.
std::string_view sv(beast::string_view s) {
  return {s.data(), s.size()};
}

bool is_http_parse_error(const beast::error_code& ec) {
  return &ec.category() == &http::make_error_code(http::error::bad_target).category();
}

uint64_t next_request_id() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

openai::ApiError server_error(std::string message) {
  openai::ApiError e;
  e.status = 500;
  e.type = "server_error";
  e.message = std::move(message);
  return e;
}

openai::ApiError unavailable(std::string message) {
  openai::ApiError e;
  e.status = 503;
  e.type = "service_unavailable";
  e.message = std::move(message);
  e.retry_after_s = 1;
  return e;
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
        cors(opt.allowed_origins),
        nonce(std::random_device{}() * 0x100000000ull ^ std::random_device{}()),
        created(unix_now()) {}

  void run_io();
  void do_accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  void add_session(Session* s, std::weak_ptr<Session> w);
  void remove_session(Session* s);
  size_t session_count();
  // The endpoints that answer at once (all but completions, and one model).
  Response answer(Endpoint endpoint);
  Response answer_model(std::string_view id);

  Options opt;
  CompletionService& service;
  std::optional<Tokenizer> tokenizer;
  openai::ModelLimits model;
  Metrics& metrics;
  CorsPolicy cors;
  uint64_t nonce;
  int64_t created;

  std::shared_ptr<Gate> gate = std::make_shared<Gate>();
  // Declared before the io_context: sessions still queued in it at its
  // destruction unregister themselves here.
  std::mutex sessions_mu;
  std::condition_variable sessions_cv;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;

  net::io_context ioc;
  // Long prompts' tokenization (one at a time, off the io threads). After
  // the io_context: destroyed first, its pending jobs release their sessions
  // while the sessions' io_context still exists.
  net::thread_pool tokenizing{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_retry;
  std::vector<std::thread> threads;
  std::atomic<uint16_t> bound_port{0};
  std::atomic<bool> draining{false};  // begin_shutdown() was called
  std::atomic<size_t> in_flight{0};   // completions accepted and not yet all written
  bool started = false;
  bool stopped = false;
};

namespace {

// One connection: reads requests, routes them, runs a completion exchange
// for POST /v1/completions and /v1/chat/completions, and writes the responses
// in order. Everything runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer::Impl& server)
      : server_(server),
        peer_(peer_of(socket)),
        stream_(std::move(socket)),
        write_timer_(stream_.get_executor()) {}

  ~Session() {
    end_flight();
    server_.remove_session(this);
  }

  net::any_io_executor executor() { return stream_.get_executor(); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // Beyond max_connections: one 503, then close.
  void reject_busy() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->reply_.keep_alive = false;
      self->respond(error_response(unavailable("Too many open connections; retry later.")));
    });
  }

  // The server is stopping: the request in flight ends with 503 (a stream
  // already started: an error event and [DONE]), its last bytes go out,
  // and the connection closes; an idle one closes now.
  void shutdown() {
    stopping_ = true;
    reply_.keep_alive = false;
    switch (phase_) {
      case Phase::Answering:
        cancel_service();
        apply(active_->fail(unavailable("The server is shutting down.")));
        if (phase_ == Phase::Flushing && !inflight_.empty()) return;  // end_response() closes
        return close();
      case Phase::Flushing:
        if (!inflight_.empty()) return;  // its last bytes are on the way
        return close();
      case Phase::Tokenizing: {
        // Its tokens, when they come, find the phase moved on.
        const openai::ApiError e = unavailable("The server is shutting down.");
        if (generates_path(path_of(sv(req_.target())))) return reject(e);
        return respond(error_response(e));
      }
      case Phase::ReadingRequest:
      case Phase::Rearming:
      case Phase::Draining:
      case Phase::Closed:
        return close();
    }
  }

  // ---- events from the sink (on the strand) ----

  void on_token(uint64_t request_id, int token_id, const TokenLogprobs* logprobs,
                Clock::time_point t) {
    if (answering(request_id)) apply(active_->on_token(request_id, token_id, logprobs, t));
  }

  void on_prompt_logprobs(uint64_t request_id, const std::vector<TokenLogprobs>& entries) {
    if (answering(request_id)) active_->on_prompt_logprobs(request_id, entries);
  }

  void on_done(uint64_t request_id, FinishReason reason, int prompt_tokens, int cached_tokens,
               Clock::time_point t) {
    if (answering(request_id))
      apply(active_->on_done(request_id, reason, prompt_tokens, cached_tokens, t));
  }

  void on_error(uint64_t request_id, const ServiceError& e) {
    if (answering(request_id)) apply(active_->on_error(request_id, e));
  }

 private:
  // Where the connection is: one state machine instead of a flag per concern.
  // Alongside the phase the socket may have one write in flight (inflight_
  // not empty) and, until a response is written, one read watching for the
  // client going away (watching_).
  enum class Phase {
    ReadingRequest,  // reading a request, until its response or exchange starts
    Tokenizing,      // its prompt is being tokenized elsewhere; nothing is read meanwhile
    Answering,       // a completion exchange runs; its bytes go out as they come
    Flushing,        // the response is complete; its last bytes are being written
    Rearming,        // written; the watch read is being stopped, then the next request
    Draining,        // after a closing response: half-closed, reading and discarding a moment
    Closed,
  };

  // How the current response goes on the wire.
  struct Reply {
    bool keep_alive = true;
    bool chunked = true;     // a streamed body; HTTP/1.0 streams until close instead
    bool head_only = false;  // HEAD: the header a GET would have, no body
    HeaderList extra;        // on every response to it: CORS (net/cors.h), X-Request-Id
    // Its X-Request-Id: the client's, when usable, else a completion's own id
    // once it has one; "" when none (then no header).
    std::string request_id;
    std::string request_line;      // "POST /v1/completions", for the access log
    Clock::time_point received{};  // when its header was read
  };

  bool answering(uint64_t request_id) const {
    return phase_ == Phase::Answering && active_->has(request_id);
  }

  // ---- reading requests ----

  void read_request() {
    if (phase_ == Phase::Closed) return;
    phase_ = Phase::ReadingRequest;
    active_.reset();
    reply_ = {};
    parser_.emplace();
    parser_->header_limit(uint32_t(std::min<size_t>(server_.opt.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(server_.opt.max_body_bytes);
    stream_.expires_after(seconds(server_.opt.read_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (phase_ == Phase::Closed) return;
    if (ec) return on_read_error(ec);
    const auto& req = parser_->get();
    reply_.received = Clock::now();
    if (server_.opt.access_log)
      reply_.request_line = std::string(sv(req.method_string())) + " " +
                            std::string(sv(req.target()).substr(0, kLoggedTargetBytes));
    if (auto len = parser_->content_length(); len && *len > server_.opt.max_body_bytes)
      return on_read_error(http::error::body_limit);
    // An HTTP/1.0 client knows no interim responses: its expectation is
    // ignored (RFC 9110 10.1.1).
    if (req.version() >= 11 && beast::iequals(req[http::field::expect], "100-continue"))
      send(http_framing::interim_continue());
    stream_.expires_after(seconds(server_.opt.read_timeout_s));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    if (phase_ == Phase::Closed) return;
    if (ec) return on_read_error(ec);
    req_ = parser_->release();
    parser_.reset();
    reply_.keep_alive = req_.keep_alive();
    reply_.head_only = req_.method() == http::verb::head;
    try {
      handle_request();
    } catch (const std::exception& e) {
      failed_internally(e);
    }
  }

  // A bug, not the client's fault; the connection must still get an answer.
  void failed_internally(const std::exception& e) {
    spdlog::error("http: handling {} {} failed: {}", std::string(req_.method_string()),
                  std::string(req_.target()), e.what());
    const openai::ApiError err = server_error("Internal server error.");
    if (phase_ == Phase::Answering) {
      cancel_service();
      apply(active_->fail(err));
    } else if (phase_ == Phase::ReadingRequest) {
      reply_.keep_alive = false;
      respond(error_response(err));
    }
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted) {
      // The client is done, or idle / too slow (the stream is already closed).
      return close();
    }
    reply_.keep_alive = false;
    if (ec == http::error::header_limit) {
      openai::ApiError e =
          openai::bad_request("The request headers are larger than " +
                              std::to_string(server_.opt.max_header_bytes) + " bytes.");
      e.status = 431;
      return respond(error_response(e));
    }
    if (ec == http::error::body_limit) {
      openai::ApiError e =
          openai::bad_request("The request body is larger than the limit of " +
                                  std::to_string(server_.opt.max_body_bytes) + " bytes.",
                              {}, "request_too_large");
      e.status = 413;
      if (parser_ && generates_path(path_of(sv(parser_->get().target()))))
        server_.metrics.request_finished(413);
      return respond(error_response(e));
    }
    if (is_http_parse_error(ec))
      return respond(
          error_response(openai::bad_request("Malformed HTTP request: " + ec.message())));
    close();  // reset by peer and the like
  }

  // ---- answering ----

  void handle_request() {
    const HttpServer::Options& o = server_.opt;
    const bool admin = o.faults && !o.admin_token.empty();
    const std::string_view path = path_of(sv(req_.target()));
    const std::string_view origin = sv(req_[http::field::origin]);
    // Browsers may read every answer but the admin endpoints' (not for pages).
    const bool admin_path = is_admin_path(path);
    if (!admin_path) reply_.extra = server_.cors.response_headers(origin);
    reply_.request_id = request_tag(sv(req_["X-Request-Id"]));
    if (!reply_.request_id.empty()) reply_.extra.emplace_back("X-Request-Id", reply_.request_id);
    auto routed = route(sv(req_.method_string()), sv(req_.target()), admin);
    if (auto* refusal = std::get_if<Response>(&routed)) return respond(*refusal);
    const Endpoint endpoint = std::get<Endpoint>(routed);
    if (endpoint == Endpoint::Options) {
      reply_.extra.clear();  // the preflight's answer says it all
      const std::string methods = allowed_methods(path, admin);
      if (admin_path) return respond(server_.cors.preflight(path, methods, {}, {}, {}));
      return respond(server_.cors.preflight(path, methods, origin,
                                            sv(req_[http::field::access_control_request_method]),
                                            sv(req_[http::field::access_control_request_headers])));
    }
    if (!o.api_key.empty() && needs_api_key(endpoint)) {
      static const BearerRefusal kRefusal{
          "You didn't provide an API key. You need to provide your API key in an Authorization "
          "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
          "Incorrect API key provided.", "invalid_api_key"};
      if (auto refused = refuse_bearer(sv(req_[http::field::authorization]), o.api_key, kRefusal)) {
        if (generates(endpoint)) server_.metrics.request_finished(refused->status);
        return respond(*refused);
      }
    }
    if (server_.draining) {
      // Shutting down: no new work, and the connection does not stay.
      reply_.keep_alive = false;
      if (generates(endpoint))
        return reject(unavailable("The server is shutting down; retry on another instance."));
    }
    if (endpoint == Endpoint::Completions) return start_completion(openai::Api::Completions);
    if (endpoint == Endpoint::ChatCompletions) return start_completion(openai::Api::Chat);
    if (endpoint == Endpoint::Responses) return start_completion(openai::Api::Responses);
    if (endpoint == Endpoint::Faults)
      return respond(answer_faults(*o.faults, o.admin_token, sv(req_.method_string()),
                                   sv(req_[http::field::authorization]), req_.body()));
    if (endpoint == Endpoint::Tokenize || endpoint == Endpoint::Detokenize)
      return start_tokenizer_call(endpoint);
    if (endpoint == Endpoint::Model)
      return respond(server_.answer_model(
          percent_decoded(path_of(sv(req_.target())).substr(kModelPathPrefix.size()))));
    respond(server_.answer(endpoint));
  }

  // Both endpoints from here on: one path to the service, one exchange.
  void start_completion(openai::Api api) {
    const openai::ModelLimits& limits = server_.model;
    const ChatFormat& tmpl = server_.opt.chat_template;
    auto parsed = api == openai::Api::Chat ? openai::parse_chat_request(req_.body(), limits, tmpl)
                  : api == openai::Api::Responses
                      ? openai::parse_responses_request(req_.body(), limits, tmpl)
                      : openai::parse_completion_request(req_.body(), limits);
    if (auto* e = std::get_if<openai::ApiError>(&parsed)) return reject(*e);
    auto& params = std::get<openai::CompletionParams>(parsed);
    const Tokenizer* tok = server_.tokenizer ? &*server_.tokenizer : nullptr;
    if (!tok || openai::prompt_text_bytes(params) <= kTokenizeInlineBytes)
      return submit_completion(api, params, openai::resolve_prompts(params, tok, limits));
    auto job = std::make_shared<openai::CompletionParams>(std::move(params));
    off_io_thread([this, job, tok] { return openai::resolve_prompts(*job, tok, server_.model); },
                  [this, job, api](openai::Result<std::vector<std::vector<int>>> prompt) {
                    submit_completion(api, *job, std::move(prompt));
                  });
  }

  // A long text is tokenized (or a long list of ids decoded) on the server's
  // tokenizing thread, about 1.5 s for a 1 MB body: on this one it would
  // stall every connection and stream the io thread serves. Runs `work`
  // there, then `then(its result)` back on this strand; meanwhile the
  // connection reads nothing, and a shutdown answers it (the phase moves on).
  template <class Work, class Then>
  void off_io_thread(Work work, Then then) {
    phase_ = Phase::Tokenizing;
    begin_flight();  // accepted: a shutdown's grace period waits for it
    net::post(server_.tokenizing, [self = shared_from_this(), work = std::move(work),
                                   then = std::move(then), gate = server_.gate]() mutable {
      auto result = work();
      std::shared_lock lock(gate->mu);
      if (!gate->open) return;  // the server stopped meanwhile
      net::post(self->executor(),
                [self, then = std::move(then), result = std::move(result)]() mutable {
                  if (self->phase_ != Phase::Tokenizing) return;  // shut down meanwhile: answered
                  self->phase_ = Phase::ReadingRequest;
                  try {
                    then(std::move(result));
                  } catch (const std::exception& e) {
                    self->failed_internally(e);
                  }
                });
    });
  }

  // vLLM's /tokenize and /detokenize.
  void start_tokenizer_call(Endpoint endpoint) {
    const openai::ModelLimits& limits = server_.model;
    const Tokenizer* tok = server_.tokenizer ? &*server_.tokenizer : nullptr;
    const auto answer = [this](const openai::Result<nlohmann::json>& r) {
      respond(json_answer(r));
    };
    if (endpoint == Endpoint::Detokenize) {
      auto ids = openai::parse_detokenize_request(req_.body(), limits);
      if (auto* e = std::get_if<openai::ApiError>(&ids)) return respond(error_response(*e));
      auto job = std::make_shared<std::vector<int>>(std::move(std::get<std::vector<int>>(ids)));
      // A piece is a few bytes of text: about as many ids as bytes of text.
      if (!tok || job->size() <= kTokenizeInlineBytes)
        return answer(openai::detokenize_response(*job, tok));
      return off_io_thread([job, tok] { return openai::detokenize_response(*job, tok); }, answer);
    }
    auto parsed = openai::parse_tokenize_request(req_.body(), limits, server_.opt.chat_template);
    if (auto* e = std::get_if<openai::ApiError>(&parsed)) return respond(error_response(*e));
    auto job = std::make_shared<openai::TokenizeParams>(
        std::move(std::get<openai::TokenizeParams>(parsed)));
    if (!tok || job->text.size() <= kTokenizeInlineBytes)
      return answer(openai::tokenize_response(*job, tok, limits));
    off_io_thread([this, job, tok] { return openai::tokenize_response(*job, tok, server_.model); },
                  answer);
  }

  // The request with its prompt's tokens (or why it has none): submitted
  // to the service, its exchange started.
  void submit_completion(openai::Api api, openai::CompletionParams& params,
                         openai::Result<std::vector<std::vector<int>>> prompt) {
    const openai::ModelLimits& limits = server_.model;
    const Tokenizer* tok = server_.tokenizer ? &*server_.tokenizer : nullptr;
    if (auto* e = std::get_if<openai::ApiError>(&prompt)) return reject(*e);
    const std::vector<std::vector<int>>& prompts = std::get<std::vector<std::vector<int>>>(prompt);

    // One request to the service per choice (n per prompt), each with its own seed.
    const size_t answers = prompts.size() * size_t(params.n);
    std::vector<uint64_t> request_ids;
    for (size_t i = 0; i < answers; ++i) request_ids.push_back(next_request_id());
    const uint64_t id = request_ids[0];
    reply_.chunked = req_.version() >= 11;
    if (params.stream && !reply_.chunked) reply_.keep_alive = false;
    std::vector<ChoicePrompt> choice_prompts;
    for (size_t p = 0; p < prompts.size(); ++p) {
      const std::vector<int>& ids = prompts[p];
      ChoicePrompt& c = choice_prompts.emplace_back();
      c.tokens = int(ids.size());
      c.tail.assign(
          ids.end() - std::ptrdiff_t(std::min(ids.size(), TextStreamer::kContinuationIds)),
          ids.end());
      if (!params.echo) continue;
      // The prompt as the client wrote it, or its ids' text (and the kept
      // tokens' text when it may have been truncated).
      const std::optional<std::string>& text =
          params.batch.empty() ? params.prompt_text : params.batch[p].text;
      c.echo_text = text && params.truncate_prompt_tokens == 0
                        ? *text
                        : (tok ? tok->decode(ids) : std::string());
      c.echo_ids = ids;
    }
    // A client's X-Request-Id names the response, as vLLM does ("cmpl-<id>"),
    // so that its logs and ours meet; otherwise the id says it.
    openai::ResponseMeta meta{openai::completion_id(server_.nonce, id, api, reply_.request_id),
                              unix_now(), limits.name, api};
    meta.named_tool_call = params.tool_calls == ToolCallFormat::ForcedNamed;
    if (reply_.request_id.empty()) {
      reply_.request_id = meta.id;
      reply_.extra.emplace_back("X-Request-Id", meta.id);
    }
    std::vector<CompletionRequest> requests;
    for (size_t i = 0; i < answers; ++i) {
      // A seed that differs per request and per process, without a lock.
      uint64_t seed_state = server_.nonce ^ request_ids[i];
      const uint64_t seed = splitmix64(seed_state);
      requests.push_back(service_request(request_ids[i], params, prompts[i / size_t(params.n)],
                                         seed, server_.opt.request_timeout_s,
                                         int(i % size_t(params.n))));
    }
    active_.emplace(request_ids, params, meta, choice_prompts, tok, Clock::now());
    phase_ = Phase::Answering;
    hold_ = shared_from_this();
    begin_flight();
    for (CompletionRequest& request : requests) {
      const uint64_t rid = request.id;
      auto sink = std::make_shared<Sink>(server_.gate, weak_from_this(), rid);
      try {
        server_.service.submit(std::move(request), std::move(sink));
      } catch (const std::exception& e) {
        spdlog::error("request {}: submit failed: {}", rid, e.what());
        cancel_service();
        return apply(active_->fail(server_error("The request could not be submitted.")));
      }
    }
    // The events may already be queued on our strand; they run after this
    // handler, so the exchange is still running here.
    start_watch();
  }

  // A completion request refused before submission.
  void reject(const openai::ApiError& e) {
    server_.metrics.request_finished(e.status);
    respond(error_response(e));
  }

  // Does what the exchange says, in its order.
  void apply(const ChoicesStep& step) {
    for (uint64_t id : step.cancel) cancel(id);
    if (step.response)
      send(http_framing::response(*step.response, reply_.keep_alive, reply_.head_only,
                                  reply_.extra));
    if (step.start_stream)
      out_ += http_framing::stream_head(reply_.chunked, reply_.keep_alive, reply_.extra);
    http_framing::append_stream_data(out_, step.events, reply_.chunked);
    if (step.end_stream) out_ += http_framing::stream_end(reply_.chunked);
    kick_writer();
    if (step.ends_response()) phase_ = Phase::Flushing;
    if (step.finished) finished(*step.finished);
  }

  void respond(const Response& r) {
    send(http_framing::response(r, reply_.keep_alive, reply_.head_only, reply_.extra));
    phase_ = Phase::Flushing;
    log_access(r.status, nullptr);
  }

  // A completion ended (answered, failed, or left by its client).
  void finished(const ExchangeFigures& f) {
    record(f, server_.metrics);
    log_access(f.status, &f);
  }

  void log_access(int status, const ExchangeFigures* f) {
    if (!server_.opt.access_log) return;
    const double s = reply_.received == Clock::time_point{}
                         ? 0
                         : std::chrono::duration<double>(Clock::now() - reply_.received).count();
    spdlog::info("access: {}",
                 access_line({peer_, reply_.request_line, status, s, f, reply_.request_id}));
  }

  // Every choice still running at the service.
  void cancel_service() {
    for (uint64_t id : active_->running()) cancel(id);
  }

  void cancel(uint64_t id) {
    try {
      server_.service.cancel(id);
    } catch (const std::exception& e) {
      spdlog::error("request {}: cancel failed: {}", id, e.what());
    }
  }

  // The client went away (EOF, reset, a failed or stalled write).
  void client_gone() {
    if (phase_ == Phase::Answering) {
      cancel_service();
      finished(active_->abandon());
    }
    close();
  }

  // ---- writing ----

  // One write in flight at a time; what arrives meanwhile is coalesced into
  // the next one, so a slow reader costs at most one response of memory.
  void send(const std::string& bytes) {
    out_ += bytes;
    kick_writer();
  }

  // Writes go to the socket itself, their time limit kept by write_timer_
  // rather than by the stream's own timer: that one is started and cancelled
  // around every write (two timer-queue updates, each a timerfd_settime, per
  // token), while this one is set again only when it fires.
  void kick_writer() {
    if (!inflight_.empty() || phase_ == Phase::Closed || out_.empty()) return;
    inflight_.swap(out_);
    write_started_ = Clock::now();
    if (!write_timer_armed_) arm_write_timer(write_started_ + seconds(server_.opt.write_timeout_s));
    net::async_write(
        stream_.socket(), net::buffer(inflight_),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); });
  }

  void arm_write_timer(Clock::time_point at) {
    write_timer_armed_ = true;
    write_timer_.expires_at(at);
    write_timer_.async_wait(
        [self = shared_from_this()](beast::error_code ec) { self->on_write_timer(ec); });
  }

  // A write still in flight write_timeout_s after it started: the client
  // stopped reading. Otherwise the timer waits for the write now in flight,
  // if any (the next write sets it again).
  void on_write_timer(beast::error_code ec) {
    write_timer_armed_ = false;
    if (ec || phase_ == Phase::Closed || inflight_.empty()) return;
    const auto deadline = write_started_ + seconds(server_.opt.write_timeout_s);
    if (Clock::now() < deadline) return arm_write_timer(deadline);
    client_gone();
  }

  void on_written(beast::error_code ec) {
    inflight_.clear();
    if (phase_ == Phase::Closed) return;
    if (ec) return client_gone();
    if (!out_.empty()) return kick_writer();
    if (phase_ == Phase::Flushing) end_response();
  }

  void end_response() {
    end_flight();
    hold_.reset();  // a handler holds this session: it is not the last reference
    if (stopping_) return close();
    if (!reply_.keep_alive) return graceful_close();
    if (watching_) {
      // The watch read must end before the next request is read; whatever it
      // got is kept in buffer_.
      phase_ = Phase::Rearming;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    read_request();
  }

  // ---- watching for disconnects while a request is answered ----

  void start_watch() {
    if (phase_ != Phase::Answering || watching_ || buffer_.size() >= kMaxPipelinedBytes) return;
    watching_ = true;
    stream_.expires_never();  // only the read side if a write is in flight
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    switch (phase_) {
      case Phase::Closed:
      case Phase::ReadingRequest:
      case Phase::Tokenizing:
        return;
      case Phase::Draining:
        return drain();
      case Phase::Rearming:
        if (ec && ec != net::error::operation_aborted) return close();
        return read_request();
      case Phase::Answering:
      case Phase::Flushing:
        if (ec) return client_gone();
        return start_watch();  // pipelined bytes: kept for the next request
    }
  }

  // ---- closing ----

  // After an error response the client may still be sending (a body over the
  // limit): half-close, then read and discard for a moment, so that the
  // client sees the response instead of a connection reset.
  void graceful_close() {
    if (phase_ == Phase::Closed) return;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    phase_ = Phase::Draining;
    linger_until_ = Clock::now() + kLingerTime;
    if (watching_) {
      stream_.socket().cancel(ignored);  // on_watch() continues with drain()
      return;
    }
    drain();
  }

  void drain() {
    if (phase_ != Phase::Draining) return;
    if (drained_ > server_.opt.max_body_bytes + kMaxPipelinedBytes) return close();
    stream_.expires_at(linger_until_);
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  // Counts the completion being answered in the server's in_flight.
  void begin_flight() {
    if (counted_) return;
    counted_ = true;
    ++server_.in_flight;
  }
  void end_flight() {
    if (!counted_) return;
    counted_ = false;
    --server_.in_flight;
  }

  void close() {
    end_flight();
    hold_.reset();  // as in end_response()
    if (phase_ == Phase::Closed) return;
    phase_ = Phase::Closed;
    write_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  class Sink : public CompletionSink {
   public:
    Sink(std::shared_ptr<Gate> gate, std::weak_ptr<Session> session, uint64_t request_id)
        : gate_(std::move(gate)), session_(std::move(session)), request_id_(request_id) {}

    void on_token(int token_id, const TokenLogprobs* logprobs) override {
      std::optional<TokenLogprobs> lp;
      if (logprobs) lp = *logprobs;
      deliver([id = request_id_, token_id, lp = std::move(lp), t = Clock::now()](Session& s) {
        s.on_token(id, token_id, lp ? &*lp : nullptr, t);
      });
    }
    void on_prompt_logprobs(const std::vector<TokenLogprobs>& entries) override {
      deliver([id = request_id_, entries](Session& s) { s.on_prompt_logprobs(id, entries); });
    }
    void on_done(FinishReason reason, int prompt_tokens, int, int cached_tokens) override {
      deliver([id = request_id_, reason, prompt_tokens, cached_tokens, t = Clock::now()](
                  Session& s) { s.on_done(id, reason, prompt_tokens, cached_tokens, t); });
    }
    void on_error(const ServiceError& error) override {
      deliver([id = request_id_, error](Session& s) { s.on_error(id, error); });
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
    uint64_t request_id_;
  };

  HttpServer::Impl& server_;
  const std::string peer_;  // "ip:port", for the access log
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  Phase phase_ = Phase::ReadingRequest;
  Reply reply_;
  std::optional<CompletionChoices> active_;  // the request being answered
  // This session, from a completion's start to the end of its response: the
  // sink holds only a weak reference, and with kMaxPipelinedBytes read ahead
  // no read is pending either, so without it nothing would keep the
  // connection up between two writes.
  std::shared_ptr<Session> hold_;
  bool watching_ = false;          // the watch read is in flight
  std::string out_, inflight_;     // queued bytes; the bytes being written
  net::steady_timer write_timer_;  // the limit on the write in flight
  bool write_timer_armed_ = false;
  Clock::time_point write_started_;
  Clock::time_point linger_until_;
  std::array<char, 4096> scratch_{};
  size_t drained_ = 0;
  bool counted_ = false;   // in server_.in_flight
  bool stopping_ = false;  // the server stops: close once the response is out
};

}  // namespace

// ---- HttpServer::Impl ----

Response HttpServer::Impl::answer(Endpoint endpoint) {
  Response r;
  switch (endpoint) {
    case Endpoint::Models:
      r.body = openai::dump(openai::models_response(model, created));
      break;
    case Endpoint::Health:
      r.body = R"({"status":"ok"})";
      break;
    case Endpoint::Ready:
      if (draining) return error_response(unavailable("The server is shutting down."));
      if (!service.ready()) return error_response(unavailable("No replica is ready to serve."));
      r.body = R"({"status":"ready"})";
      break;
    case Endpoint::Version:
      r.body = openai::dump({{"version", kVersion}});
      break;
    case Endpoint::Metrics:
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics.render();
      break;
    case Endpoint::StoredResponse: {
      openai::ApiError e = openai::bad_request(
          "Responses are not stored by this server (each request carries its whole "
          "conversation), so there is none to retrieve.",
          {}, "not_found");
      e.status = 404;
      return error_response(e);
    }
    case Endpoint::Completions:
    case Endpoint::ChatCompletions:
    case Endpoint::Responses:
    case Endpoint::Model:
    case Endpoint::Tokenize:
    case Endpoint::Detokenize:
    case Endpoint::Faults:
    case Endpoint::Options:
      throw std::logic_error("answered elsewhere");
  }
  return r;
}

Response HttpServer::Impl::answer_model(std::string_view id) {
  return json_answer(openai::model_response(id, model, created));
}

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

void HttpServer::begin_shutdown() {
  impl_->draining = true;
}

size_t HttpServer::in_flight() const {
  return impl_->in_flight.load();
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
  // A prompt being tokenized finishes (its result is dropped at the gate);
  // those not started are abandoned.
  s.tokenizing.stop();
  s.tokenizing.join();
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

uint16_t HttpServer::port() const {
  return impl_->bound_port.load();
}

}  // namespace troupe
