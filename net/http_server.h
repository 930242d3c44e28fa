#pragma once
// The OpenAI-compatible HTTP/1.1 server (Boost.Beast) in front of a
// CompletionService: POST /v1/completions and POST /v1/chat/completions (JSON
// or server-sent events),
// GET /v1/models, /health, /ready and /metrics; with the admin endpoints
// turned on, POST and GET /admin/faults.
//
// It runs on its own io threads, never on CAF's: tokens arrive through
// CompletionSink on runtime threads and are posted to the connection's strand,
// so the runtime never waits on a socket.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/metrics.h"
#include "net/fault_admin.h"
#include "net/openai_api.h"
#include "service/chat_template.h"
#include "service/completion_service.h"
#include "text/tokenizer.h"

namespace troupe {

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    uint16_t port = 8080;                 // 0: pick a free port (see port())
    size_t max_body_bytes = 1 << 20;      // larger bodies get 413
    size_t max_header_bytes = 16 * 1024;  // larger headers get 431
    // Each request's timeout_s for the service, which alone enforces it
    // (the client gets 504 when it passes).
    double request_timeout_s = 120;
    // Reading one request (headers and body), and waiting idle on a
    // keep-alive connection: a slow or silent client is dropped after this.
    double read_timeout_s = 30;
    // A client that stops reading its response is dropped after this.
    double write_timeout_s = 30;
    int io_threads = 1;
    // How /v1/chat/completions renders messages into a prompt.
    ChatFormat chat_template;
    size_t max_connections = 1024;  // beyond: 503 and close
    // Web pages (origins) whose scripts may read the answers: "*" for any,
    // as vLLM and llama-server; empty for none (net/cors.h).
    std::vector<std::string> allowed_origins = {"*"};
    // Not empty: the model's endpoints (needs_api_key in net/endpoints.h)
    // answer only requests that carry "Authorization: Bearer <api_key>",
    // others get 401 (OpenAI's invalid_api_key).
    std::string api_key;
    // One info line per answered request (net/access_log.h).
    bool access_log = false;
    // POST/GET /admin/faults: served only with both set, and only to
    // requests that carry "Authorization: Bearer <admin_token>".
    FaultAdmin* faults = nullptr;
    std::string admin_token;
  };

  // `tokenizer` may be empty: then only token-id prompts are accepted, and
  // completions carry text "" plus the generated "token_ids".
  HttpServer(Options options, CompletionService& service, std::optional<Tokenizer> tokenizer,
             openai::ModelLimits model, Metrics& metrics);
  // Stops (see stop()).
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads. Throws std::runtime_error
  // naming the address when it cannot listen.
  void start();
  // The server is going away: from now on a completion request gets 503
  // (Retry-After, "Connection: close"), and so does /ready; the requests in
  // flight go on. Idempotent; from any thread.
  void begin_shutdown();
  // Completion requests being answered: accepted, their response not yet
  // all written.
  size_t in_flight() const;
  // Ends every request still open with 503 (one that streams already: an
  // SSE error event, then [DONE]) and cancels it at the service, lets the
  // last bytes go out, closes every connection and the listener, and joins
  // the io threads; takes at most ~2 s even if a connection is stuck.
  // Idempotent. Not from an io thread (it joins them). Sink calls that
  // arrive afterwards are dropped, so the service may outlive the server.
  void stop();

  // The bound port (the chosen one when Options::port was 0); 0 before start().
  uint16_t port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
