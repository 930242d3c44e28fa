#include "net/http_framing.h"

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/buffer_traits.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/http.hpp>
#include <stdexcept>

namespace troupe::http_framing {

namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// The message (or only its header) as the serializer would write it.
template <class Body>
std::string serialize(http::response<Body>& msg, bool header_only) {
  http::response_serializer<Body> sr{msg};
  sr.split(header_only);
  std::string out;
  beast::error_code ec;
  while (!(header_only ? sr.is_header_done() : sr.is_done())) {
    sr.next(ec, [&](beast::error_code&, const auto& buffers) {
      out += beast::buffers_to_string(buffers);
      sr.consume(beast::buffer_bytes(buffers));
    });
    if (ec) throw std::logic_error("serializing an HTTP response failed: " + ec.message());
  }
  return out;
}

template <class Body>
void set_common_fields(http::response<Body>& msg, bool keep_alive) {
  msg.set(http::field::server, "troupe");
  // Said even where it is the default, as clients and proxies read it.
  msg.set(http::field::connection, keep_alive ? "keep-alive" : "close");
}

}  // namespace

std::string response(const Response& r, bool keep_alive, bool head_only, const HeaderList& extra) {
  http::response<http::string_body> msg;
  msg.version(11);
  msg.result(unsigned(r.status));
  set_common_fields(msg, keep_alive);
  if (!r.content_type.empty()) msg.set(http::field::content_type, r.content_type);
  for (const auto& [name, value] : r.headers) msg.set(name, value);
  for (const auto& [name, value] : extra) msg.set(name, value);
  msg.body() = r.body;
  msg.prepare_payload();
  // A 204 has no body, and says no length either (RFC 9110 8.6).
  if (r.status == 204) msg.erase(http::field::content_length);
  return serialize(msg, head_only);
}

std::string interim_continue() {
  http::response<http::empty_body> msg{http::status::continue_, 11};
  return serialize(msg, /*header_only=*/true);
}

std::string stream_head(bool chunked, bool keep_alive, const HeaderList& extra) {
  if (!chunked && keep_alive)
    throw std::logic_error("a body that ends with the connection cannot keep it alive");
  http::response<http::empty_body> msg{http::status::ok, 11};
  set_common_fields(msg, keep_alive);
  msg.set(http::field::content_type, "text/event-stream; charset=utf-8");
  msg.set(http::field::cache_control, "no-cache");
  msg.set("X-Accel-Buffering", "no");  // nginx: pass events on at once
  for (const auto& [name, value] : extra) msg.set(name, value);
  if (chunked) msg.chunked(true);
  return serialize(msg, /*header_only=*/true);
}

std::string stream_data(std::string_view data, bool chunked) {
  std::string out;
  append_stream_data(out, data, chunked);
  return out;
}

void append_stream_data(std::string& out, std::string_view data, bool chunked) {
  if (data.empty()) return;
  if (chunked) {
    // "<size in lowercase hex>\r\n<data>\r\n", as http::make_chunk writes it.
    char hex[2 * sizeof(size_t)];
    char* p = hex + sizeof hex;
    for (size_t n = data.size(); n != 0; n >>= 4) *--p = "0123456789abcdef"[n & 0xF];
    out.append(p, hex + sizeof hex);
    out += "\r\n";
  }
  out += data;
  if (chunked) out += "\r\n";
}

std::string stream_end(bool chunked) {
  return chunked ? beast::buffers_to_string(http::make_chunk_last()) : std::string();
}

}  // namespace troupe::http_framing
