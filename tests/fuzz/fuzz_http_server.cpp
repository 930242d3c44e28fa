// The real HTTP server (net/http_server: Beast's parser with the server's
// limits, the connection's state machine, routing, the OpenAI decoder, the
// completion exchange, the framing) on 127.0.0.1, in this process, in front
// of a service that answers at once. Each input is written to a fresh
// connection as the client's bytes (pipelined requests and all), the client
// half-closes, and reads until the server closes.
// Oracles: the server closes the connection within a bound (no hang); what
// it sent is a sequence of well-formed HTTP responses with statuses it
// documents, nothing after a "Connection: close" one, and only a streamed
// response cut short (the client went away mid-stream); no crash on the
// server's threads.
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <memory>
#include <set>
#include <string>

#include "fuzz_support.h"
#include "http_support.h"
#include "metrics/metrics.h"
#include "serving_support.h"

namespace troupe::fuzz {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Answers at once, on the server's own thread: the prompt's ids back as the
// generated tokens (real ids, so the detokenizer and stop strings see real
// text), up to max_tokens. The priority (the client's to choose) picks a
// failure instead, so that error paths before and during a stream are
// reachable: 1 queue full, 2 an error after the first token, 3 unavailable.
class InstantService : public CompletionService {
 public:
  void submit(CompletionRequest r, std::shared_ptr<CompletionSink> sink) override {
    const int n = std::min<int>(r.max_tokens, int(r.prompt.size()));
    switch (r.priority) {
      case 1:
        return sink->on_error({ServiceErrorKind::QueueFull, "queue full", 2});
      case 2:
        sink->on_token(r.prompt.front(), nullptr);
        return sink->on_error({ServiceErrorKind::Internal, "step failed", 0});
      case 3:
        return sink->on_error({ServiceErrorKind::Unavailable, "", 0});
      default:
        break;
    }
    for (int i = 0; i < n; ++i) sink->on_token(r.prompt[size_t(i)], nullptr);
    sink->on_done(n == r.max_tokens ? FinishReason::Length : FinishReason::Stop,
                  int(r.prompt.size()), n);
  }
  void cancel(uint64_t) override {}
  bool ready() const override { return true; }
};

struct Server {
  InstantService service;
  Metrics metrics;
  HttpServer http;
  Server() : http(options(), service, fortune_tokenizer(), fortune_limits(), metrics) {
    http.start();
  }
  static HttpServer::Options options() {
    HttpServer::Options o = kServerLimits;
    o.port = 0;
    // Bounds on a stuck connection, well under the client's wait below.
    o.read_timeout_s = 2;
    o.write_timeout_s = 2;
    return o;
  }
};

// The server's answers, read back as a client would.
void check_responses(const std::string& wire) {
  static const std::set<int> kStatuses{100, 200, 400, 404, 405, 413, 429, 431, 500, 503, 504};
  MemoryStream in(wire, wire.size());
  beast::flat_buffer buffer;
  bool closing = false;
  while (!in.empty() || buffer.size() > 0) {
    if (closing) violated("bytes after a Connection: close response:\n" + wire);
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    beast::error_code ec;
    http::read(in, buffer, parser, ec);
    const auto& res = parser.get();
    const bool streamed = res[http::field::content_type].starts_with("text/event-stream");
    if (ec == http::error::partial_message && parser.is_header_done() && streamed) return;
    if (ec) violated("the server's answer does not parse (" + ec.message() + "):\n" + wire);
    if (!kStatuses.count(int(res.result_int())))
      violated("undocumented status " + std::to_string(res.result_int()) + ":\n" + wire);
    if (res.result() != http::status::continue_) closing = !res.keep_alive();
  }
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::fuzz;
  static Server server;
  static asio::io_context ioc;
  const tcp::endpoint at(asio::ip::make_address("127.0.0.1"), server.http.port());
  tcp::socket socket(ioc);
  socket.connect(at);
  // The whole exchange is bounded: a server that neither answers nor closes
  // within this hangs its clients.
  const timeval wait{10, 0};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  // libFuzzer's timer signal interrupts blocking calls (EINTR): retried.
  beast::error_code ec;
  for (size_t sent = 0; sent < size;) {
    sent += socket.write_some(asio::buffer(data + sent, size - sent), ec);
    if (ec && ec != asio::error::interrupted) break;  // the server may close early
  }
  socket.shutdown(tcp::socket::shutdown_send, ec);
  std::string wire;
  char chunk[16384];
  for (;;) {
    const size_t n = socket.read_some(asio::buffer(chunk), ec);
    wire.append(chunk, n);
    if (ec == asio::error::eof || ec == asio::error::connection_reset) break;
    if (ec == asio::error::interrupted) continue;
    if (ec == asio::error::would_block || ec == asio::error::try_again)
      violated("the server did not close the connection within 10 s");
    if (ec) violated("reading the server's answer failed: " + ec.message());
  }
  check_responses(wire);
  return 0;
}
