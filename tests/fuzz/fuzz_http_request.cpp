// HTTP request parsing as the server does it, without a socket: Beast's
// request_parser with the server's header and body limits, the
// Content-Length check before the body, then the server's pure pieces:
// route() (endpoint, 404, 405 with Allow) and, for POST /v1/completions, the
// OpenAI decoder with the fortune tokenizer. Pipelined requests go on while
// the connection would be kept alive, as in net/http_server.cpp's Session.
// Oracles: no exception escapes, and each refusal the server would send,
// framed by net/http_framing, reads back as the same response.
// fuzz_http_server.cpp drives the real server over a socket.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <string>
#include <variant>

#include "fuzz_support.h"
#include "http_support.h"
#include "net/endpoints.h"
#include "net/http_framing.h"
#include "serving_support.h"

namespace troupe::fuzz {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

std::string_view sv(beast::string_view s) {
  return {s.data(), s.size()};
}

// The refusal as the client would read it back.
void check_framed(const Response& r, bool keep_alive) {
  const std::string wire = http_framing::response(r, keep_alive);
  MemoryStream in(wire, wire.size());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  beast::error_code ec;
  http::read(in, buffer, parser, ec);
  if (ec) violated("a framed response does not parse: " + ec.message() + "\n" + wire);
  if (int(parser.get().result_int()) != r.status || parser.get().body() != r.body)
    violated("a framed response reads back differently:\n" + wire);
}

void handle(const http::request<http::string_body>& req) {
  const auto routed = route(sv(req.method_string()), sv(req.target()));
  if (const auto* refusal = std::get_if<Response>(&routed))
    return check_framed(*refusal, req.keep_alive());
  const Endpoint endpoint = std::get<Endpoint>(routed);
  if (!generates(endpoint)) return;
  static const openai::ModelLimits limits = fortune_limits();
  auto parsed = endpoint == Endpoint::ChatCompletions
                    ? openai::parse_chat_request(req.body(), limits, ChatTemplate::Plain)
                    : openai::parse_completion_request(req.body(), limits);
  if (auto* params = std::get_if<openai::CompletionParams>(&parsed))
    (void)openai::resolve_prompts(*params, &fortune_tokenizer(), limits);
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  // Socket reads end anywhere; the size picks where, so one input is parsed
  // one way every time.
  MemoryStream in(as_text(data, size), 1 + size % 509);
  beast::flat_buffer buffer;
  const HttpServer::Options& opt = kServerLimits;
  for (int request = 0; request < 32; ++request) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(uint32_t(std::min<size_t>(opt.max_header_bytes, UINT32_MAX)));
    parser.body_limit(opt.max_body_bytes);
    beast::error_code ec;
    http::read_header(in, buffer, parser, ec);
    if (ec) break;  // 431, 400 or the end of the connection
    if (auto len = parser.content_length(); len && *len > opt.max_body_bytes) break;  // 413
    http::read(in, buffer, parser, ec);
    if (ec) break;
    const http::request<http::string_body> req = parser.release();
    handle(req);
    if (!req.keep_alive()) break;
  }
  return 0;
}
