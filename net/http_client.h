#pragma once
// A blocking HTTP/1.1 client (Boost.Beast) on one connection, kept alive
// across requests, with every wait bounded. It serves the serving bench, the
// tests and load drivers alike: whole responses, streamed responses handed
// over piece by piece as they arrive (which the caller may stop, to go away
// mid-stream, or read slowly), extra headers, HTTP/1.0, and raw bytes for
// tests of a server's own parser.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// host:port as a Host header wants it: brackets around an IPv6 literal, no
// port when it is 80.
std::string http_authority(const std::string& host, const std::string& port);

// {"Authorization", "Bearer <secret>"}, or nothing for an empty secret (an
// API key, the admin token).
HttpHeaders bearer_headers(const std::string& secret);

struct HttpRequest {
  std::string method = "GET";
  std::string target = "/";
  std::string body;                               // sent when not empty, and always for POST
  std::string content_type = "application/json";  // with a body
  HttpHeaders headers;  // e.g. {"Authorization", "Bearer TOKEN"}; replaces a default of that name
  int version = 11;     // 10: HTTP/1.0
  bool keep_alive = true;  // false: ask the server to close after the response
};

// Why an operation fell short of a complete response.
enum class HttpFailure {
  None,
  Connect,  // no connection: refused, unreachable, unresolvable
  Timeout,  // a wait passed its timeout, or the request its deadline
  Io,       // reset, closed early, or an answer that is not HTTP
  Stopped,  // the body callback asked to stop; the connection was closed
};
const char* to_string(HttpFailure f);

struct HttpError {
  HttpFailure kind = HttpFailure::None;
  std::string message;  // in the OS's or the parser's words
  explicit operator bool() const { return kind != HttpFailure::None; }
};

struct HttpResponse {
  int status = 0;  // 0: no response header arrived
  HttpHeaders headers;
  std::string body;  // de-chunked; empty when a body callback took it
  bool keep_alive = false;
  HttpError error;  // set when the response is not complete
  bool complete() const { return !error; }
  // The first header of that name, compared case-insensitively; "" if none.
  std::string header(std::string_view name) const;
};

class HttpClient {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

  struct Options {
    std::string host = "127.0.0.1";
    std::string port = "80";
    std::string host_header;  // "": http_authority(host, port)
    std::string user_agent = "troupe";
    // Sent with every request (an API key's Authorization); a request's own
    // header of the same name replaces one.
    HttpHeaders headers;
    double connect_timeout_s = 10;
    // The longest wait for any one read or write: a silent server fails the
    // request after this, however long its deadline.
    double io_timeout_s = 60;
    size_t max_body_bytes = 16u << 20;  // whole bodies; a streamed body has no limit
    size_t read_chunk_bytes = 16384;    // the most one streamed piece holds
    // A kept-alive connection that the server closed while it was idle fails
    // before any response byte; that is no answer to this request, so it is
    // sent once more on a fresh connection.
    bool retry_stale_connection = true;
  };

  // Each piece of a streamed body as it arrives (chunk framing removed),
  // with the response's status and headers. Return false to stop reading and
  // close the connection: the client going away mid-stream.
  using BodyFn = std::function<bool(const HttpResponse& head, std::string_view piece)>;

  explicit HttpClient(Options options);
  ~HttpClient();
  HttpClient(HttpClient&&) noexcept;
  HttpClient& operator=(HttpClient&&) noexcept;

  // Connects now rather than at the first request.
  HttpError connect(Clock::time_point deadline = kNoDeadline);
  bool connected() const;
  void close();

  // Sends the request and reads the whole response. The deadline bounds the
  // whole exchange, on top of the per-wait timeouts.
  HttpResponse request(const HttpRequest& request, Clock::time_point deadline = kNoDeadline);
  // The same, with the body handed to `on_body` instead of kept.
  HttpResponse request(const HttpRequest& request, const BodyFn& on_body,
                       Clock::time_point deadline = kNoDeadline);

  // ---- raw bytes, for tests of a server's parser (malformed requests,
  // pipelining, Expect: 100-continue) ----

  HttpError write_raw(std::string_view bytes);
  // One response from the connection: to raw bytes sent, or one the server
  // sends unasked.
  HttpResponse read_response();
  // Reads until `needle` has arrived and returns everything up to and
  // including it (what follows stays for the next read); on EOF or timeout,
  // whatever arrived.
  std::string read_raw_until(std::string_view needle);
  // Reads and discards until the server closes (true) or a wait times out.
  bool wait_closed_by_peer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
