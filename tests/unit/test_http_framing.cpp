// Response framing: Beast's serializer output, read back with Beast's parser.
#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/http.hpp>

#include "net/http_framing.h"

namespace troupe::http_framing {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

// Parses `wire` as one whole response; `eof`: the connection closed after it.
http::response<http::string_body> parse(const std::string& wire, bool eof = false) {
  http::response_parser<http::string_body> p;
  p.eager(true);
  beast::error_code ec;
  size_t used = p.put(boost::asio::buffer(wire), ec);
  EXPECT_FALSE(ec) << ec.message() << "\n" << wire;
  EXPECT_EQ(used, wire.size()) << wire;
  if (eof) {
    p.put_eof(ec);
    EXPECT_FALSE(ec) << ec.message();
  }
  EXPECT_TRUE(p.is_done()) << wire;
  return p.release();
}

std::string field(const http::response<http::string_body>& m, std::string_view name) {
  auto v = m[beast::string_view(name.data(), name.size())];
  return std::string(v.data(), v.size());
}

TEST(HttpFraming, WholeResponseHasLengthTypeAndExtraHeaders) {
  Response r;
  r.status = 429;
  r.body = R"({"error":{}})";
  r.headers = {{"Retry-After", "3"}};
  const std::string wire = response(r, /*keep_alive=*/true);
  EXPECT_EQ(wire.rfind("HTTP/1.1 429 Too Many Requests\r\n", 0), 0u) << wire;
  const auto m = parse(wire);
  EXPECT_EQ(m.result_int(), 429u);
  EXPECT_EQ(m.body(), r.body);
  EXPECT_EQ(field(m, "Content-Length"), std::to_string(r.body.size()));
  EXPECT_EQ(field(m, "Content-Type"), "application/json");
  EXPECT_EQ(field(m, "Retry-After"), "3");
  EXPECT_EQ(field(m, "Server"), "troupe");
  EXPECT_EQ(field(m, "Connection"), "keep-alive");
  r.content_type = "text/plain";
  EXPECT_EQ(field(parse(response(r, false)), "Connection"), "close");
  EXPECT_EQ(field(parse(response(r, false)), "Content-Type"), "text/plain");
}

// Headers every response on a request carries (CORS) come after the
// response's own; a 204 says no length (RFC 9110 8.6) and no type when it has none.
TEST(HttpFraming, ExtraHeadersAndNoContent) {
  Response r;
  r.status = 204;
  r.content_type.clear();
  r.headers = {{"Allow", "POST"}};
  const std::string wire =
      response(r, /*keep_alive=*/true, false, {{"Access-Control-Allow-Origin", "*"}});
  EXPECT_EQ(wire.rfind("HTTP/1.1 204 No Content\r\n", 0), 0u) << wire;
  EXPECT_EQ(wire.find("Content-Length"), std::string::npos) << wire;
  EXPECT_EQ(wire.find("Content-Type"), std::string::npos) << wire;
  EXPECT_LT(wire.find("Allow: POST"), wire.find("Access-Control-Allow-Origin: *")) << wire;
  EXPECT_EQ(wire.substr(wire.size() - 4), "\r\n\r\n");
  const std::string head = stream_head(true, true, {{"Access-Control-Allow-Origin", "*"}});
  EXPECT_NE(head.find("\r\nAccess-Control-Allow-Origin: *\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("\r\nContent-Type: text/event-stream; charset=utf-8\r\n"),
            std::string::npos)
      << head;
}

TEST(HttpFraming, InterimContinue) {
  EXPECT_EQ(interim_continue(), "HTTP/1.1 100 Continue\r\n\r\n");
}

TEST(HttpFraming, ChunkedStreamReadsBackAsItsEvents) {
  const std::string head = stream_head(/*chunked=*/true, /*keep_alive=*/true);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "the header alone";
  std::string wire = head;
  wire += stream_data("data: a\n\n", true);
  wire += stream_data("", true);  // nothing: an empty chunk would end the body
  wire += stream_data("data: [DONE]\n\n", true);
  EXPECT_EQ(stream_data("xy", true), "2\r\nxy\r\n");
  wire += stream_end(true);
  EXPECT_EQ(stream_end(true), "0\r\n\r\n");
  const auto m = parse(wire);
  EXPECT_EQ(m.result_int(), 200u);
  EXPECT_TRUE(m.chunked());
  EXPECT_EQ(m.body(), "data: a\n\ndata: [DONE]\n\n");
  EXPECT_EQ(field(m, "Content-Type"), "text/event-stream; charset=utf-8");
  EXPECT_EQ(field(m, "Cache-Control"), "no-cache");
  EXPECT_EQ(field(m, "X-Accel-Buffering"), "no");
  EXPECT_EQ(field(m, "Connection"), "keep-alive");
}

TEST(HttpFraming, ChunksAreWhatBeastsChunkEncoderWrites) {
  for (size_t n : {1u, 9u, 15u, 16u, 17u, 255u, 256u, 4095u, 4096u, 65536u, 1000003u}) {
    const std::string data(n, 'x');
    const std::string beast_chunk =
        beast::buffers_to_string(http::make_chunk(boost::asio::buffer(data.data(), data.size())));
    EXPECT_EQ(stream_data(data, true), beast_chunk) << n;
    std::string out = "before";
    append_stream_data(out, data, true);
    EXPECT_EQ(out, std::string("before") + beast_chunk) << n;
  }
  std::string out = "kept";
  append_stream_data(out, "", true);
  append_stream_data(out, "", false);
  EXPECT_EQ(out, "kept");
  append_stream_data(out, "raw", false);
  EXPECT_EQ(out, "keptraw");
}

TEST(HttpFraming, CloseDelimitedStreamForHttp10) {
  std::string wire = stream_head(/*chunked=*/false, /*keep_alive=*/false);
  wire += stream_data("data: a\n\n", false);
  EXPECT_EQ(stream_data("data: a\n\n", false), "data: a\n\n");
  EXPECT_EQ(stream_end(false), "");
  const auto m = parse(wire, /*eof=*/true);
  EXPECT_FALSE(m.chunked());
  EXPECT_EQ(field(m, "Content-Length"), "");
  EXPECT_EQ(field(m, "Connection"), "close");
  EXPECT_EQ(m.body(), "data: a\n\n");
  EXPECT_THROW(stream_head(false, true), std::logic_error);
}

}  // namespace
}  // namespace troupe::http_framing
