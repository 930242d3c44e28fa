// HttpClient against a scripted server on 127.0.0.1: keep-alive, framing,
// headers, streamed bodies stopped mid-way, timeouts, stale connections and
// raw bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <thread>

#include "net/http_client.h"
#include "net/http_framing.h"
#include "support/process_support.h"
#include "support/scripted_server.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::ScriptedServer;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

HttpClient::Options options(uint16_t port, double timeout_s = 5) {
  return test::loopback_client(port, timeout_s);
}

HttpRequest get(const std::string& target) {
  HttpRequest r;
  r.target = target;
  return r;
}

// Echoes the target as the body, keeping the connection as the client asked.
bool echo(const ScriptedServer::Request& r, ScriptedServer::Connection& c) {
  return c.respond(200, r.target, {}, r.keep_alive) && r.keep_alive;
}

// Writes a text/event-stream response in the given pieces, chunked or until close.
bool stream_pieces(ScriptedServer::Connection& c, const std::vector<std::string>& pieces,
                   bool chunked, double pause_s = 0) {
  bool ok = c.write(http_framing::stream_head(chunked, chunked));
  for (const auto& p : pieces) {
    ok = ok && c.pause(pause_s) && c.write(http_framing::stream_data(p, chunked));
  }
  ok = ok && c.write(http_framing::stream_end(chunked));
  return ok && chunked;
}

uint16_t unused_port() {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor a(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

TEST(HttpClient, KeepAliveReusesOneConnection) {
  ScriptedServer server(echo);
  HttpClient c(options(server.port()));
  for (const char* target : {"/a", "/b?x=1", "/c"}) {
    const HttpResponse r = c.request(get(target));
    ASSERT_TRUE(r.complete()) << r.error.message;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, target);
    EXPECT_TRUE(r.keep_alive);
    EXPECT_EQ(r.header("content-type"), "application/json") << "names match in any case";
    EXPECT_EQ(r.header("X-Absent"), "");
  }
  EXPECT_TRUE(c.connected());
  EXPECT_EQ(server.connections(), 1);
  HttpRequest last = get("/bye");
  last.keep_alive = false;
  EXPECT_EQ(c.request(last).body, "/bye");
  EXPECT_FALSE(c.connected()) << "Connection: close ends it";
  EXPECT_EQ(c.request(get("/again")).body, "/again");
  EXPECT_EQ(server.connections(), 2);
}

TEST(HttpClient, RequestLineHeadersAndBodyReachTheServer) {
  ScriptedServer server(echo);
  HttpClient::Options o = options(server.port());
  o.user_agent = "chaos/1";
  HttpClient c(o);
  HttpRequest post;
  post.method = "POST";
  post.target = "/admin/faults";
  post.body = R"({"kill":1})";
  post.headers = {{"Authorization", "Bearer TOKEN"}, {"X-Trace", "7"}};
  ASSERT_EQ(c.request(post).status, 200);
  HttpRequest empty_post = post;
  empty_post.body.clear();
  empty_post.headers = {{"Host", "example.test"}};
  ASSERT_EQ(c.request(empty_post).status, 200);
  HttpRequest old = get("/old");
  old.version = 10;
  old.keep_alive = false;
  ASSERT_EQ(c.request(old).status, 200);

  const auto seen = server.requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].method, "POST");
  EXPECT_EQ(seen[0].target, "/admin/faults");
  EXPECT_EQ(seen[0].body, R"({"kill":1})");
  EXPECT_EQ(seen[0].header("authorization"), "Bearer TOKEN");
  EXPECT_EQ(seen[0].header("x-trace"), "7");
  EXPECT_EQ(seen[0].header("content-type"), "application/json");
  EXPECT_EQ(seen[0].header("content-length"), "10");
  EXPECT_EQ(seen[0].header("user-agent"), "chaos/1");
  EXPECT_EQ(seen[0].header("host"), "127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(seen[1].header("content-length"), "0") << "a POST always says its length";
  EXPECT_EQ(seen[1].header("host"), "example.test") << "an extra header replaces the default";
  EXPECT_EQ(seen[2].version, 10u);
  EXPECT_FALSE(seen[2].keep_alive);
}

TEST(HttpClient, ChunkedAndCloseDelimitedBodiesArriveWhole) {
  const std::vector<std::string> pieces = {"data: a\n", "\n", "data: [DONE]\n\n"};
  ScriptedServer server([&](const ScriptedServer::Request& r, ScriptedServer::Connection& c) {
    return stream_pieces(c, pieces, /*chunked=*/r.target == "/chunked");
  });
  HttpClient c(options(server.port()));
  const HttpResponse chunked = c.request(get("/chunked"));
  ASSERT_TRUE(chunked.complete()) << chunked.error.message;
  EXPECT_EQ(chunked.body, "data: a\n\ndata: [DONE]\n\n");
  EXPECT_EQ(chunked.header("transfer-encoding"), "chunked");
  EXPECT_TRUE(c.connected());
  const HttpResponse until_close = c.request(get("/close"));
  ASSERT_TRUE(until_close.complete()) << until_close.error.message;
  EXPECT_EQ(until_close.body, chunked.body);
  EXPECT_FALSE(until_close.keep_alive);
  EXPECT_FALSE(c.connected());
}

TEST(HttpClient, StreamedPiecesArriveAsTheyAreSent) {
  ScriptedServer server([](const ScriptedServer::Request&, ScriptedServer::Connection& c) {
    return stream_pieces(c, {"one ", "two ", "three"}, true, 0.05);
  });
  HttpClient c(options(server.port()));
  std::string got;
  int pieces = 0;
  Clock::time_point first;
  const HttpResponse r = c.request(get("/s"), [&](const HttpResponse& head, std::string_view p) {
    EXPECT_EQ(head.status, 200);
    EXPECT_EQ(head.header("content-type").rfind("text/event-stream", 0), 0u);
    if (pieces++ == 0) first = Clock::now();
    got.append(p);
    return true;
  });
  const auto end = Clock::now();
  ASSERT_TRUE(r.complete()) << r.error.message;
  EXPECT_TRUE(r.body.empty()) << "the callback took the body";
  EXPECT_EQ(got, "one two three");
  EXPECT_GE(pieces, 2) << "not held back until the end";
  EXPECT_GE(end - first, 80ms) << "the first piece came two pauses before the end";
}

TEST(HttpClient, StoppingMidStreamClosesTheConnection) {
  std::atomic<bool> server_saw_close{false};
  ScriptedServer server([&](const ScriptedServer::Request&, ScriptedServer::Connection& c) {
    bool ok = c.write(http_framing::stream_head(true, true));
    for (int i = 0; ok && i < 400; ++i)
      ok = c.pause(0.005) && c.write(http_framing::stream_data("data: x\n\n", true));
    server_saw_close = !ok;
    return false;
  });
  HttpClient c(options(server.port()));
  int pieces = 0;
  const HttpResponse r =
      c.request(get("/s"), [&](const HttpResponse&, std::string_view) { return ++pieces < 2; });
  EXPECT_EQ(r.error.kind, HttpFailure::Stopped);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(pieces, 2);
  EXPECT_FALSE(c.connected());
  for (int i = 0; i < 200 && !server_saw_close; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(server_saw_close) << "the server's writes fail once the client is gone";
}

TEST(HttpClient, SlowReaderGetsEverything) {
  const std::string big(256 * 1024, 'z');
  ScriptedServer server([&](const ScriptedServer::Request&, ScriptedServer::Connection& c) {
    return c.respond(200, big);
  });
  HttpClient::Options o = options(server.port());
  o.read_chunk_bytes = 4096;
  HttpClient c(o);
  std::string body;
  int reads = 0;
  const HttpResponse r = c.request(get("/big"), [&](const HttpResponse&, std::string_view p) {
    EXPECT_LE(p.size(), 4096u);
    body.append(p);
    if (++reads % 16 == 0) std::this_thread::sleep_for(1ms);
    return true;
  });
  ASSERT_TRUE(r.complete()) << r.error.message;
  EXPECT_EQ(body, big);
  EXPECT_GE(reads, 64);
}

TEST(HttpClient, FailuresSayWhich) {
  HttpClient refused(options(unused_port()));
  const HttpResponse r = refused.request(get("/"));
  EXPECT_EQ(r.error.kind, HttpFailure::Connect);
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.error.message.empty());
  EXPECT_STREQ(to_string(r.error.kind), "connect");

  ScriptedServer silent([](const ScriptedServer::Request&, ScriptedServer::Connection& c) {
    c.pause(10);
    return false;
  });
  HttpClient slow(options(silent.port(), /*timeout_s=*/0.2));
  auto t0 = Clock::now();
  EXPECT_EQ(slow.request(get("/")).error.kind, HttpFailure::Timeout);
  EXPECT_LT(Clock::now() - t0, 3s);
  HttpClient bounded(options(silent.port(), /*timeout_s=*/30));
  t0 = Clock::now();
  EXPECT_EQ(bounded.request(get("/"), Clock::now() + 200ms).error.kind, HttpFailure::Timeout)
      << "the deadline cuts a long timeout short";
  EXPECT_LT(Clock::now() - t0, 3s);

  ScriptedServer big([](const ScriptedServer::Request&, ScriptedServer::Connection& c) {
    return c.respond(200, std::string(5000, 'b'));
  });
  HttpClient::Options o = options(big.port());
  o.max_body_bytes = 1000;
  HttpClient limited(o);
  EXPECT_EQ(limited.request(get("/")).error.kind, HttpFailure::Io);

  ScriptedServer garbage([](const ScriptedServer::Request&, ScriptedServer::Connection& c) {
    c.write("SPEAKING NOT HTTP\r\n\r\n");
    return false;
  });
  HttpClient confused(options(garbage.port()));
  EXPECT_EQ(confused.request(get("/")).error.kind, HttpFailure::Io);
}

TEST(HttpClient, StaleKeptAliveConnectionIsRetriedOnce) {
  // Says keep-alive, then closes: the next request finds a dead connection.
  ScriptedServer server([](const ScriptedServer::Request& r, ScriptedServer::Connection& c) {
    c.respond(200, r.target);
    return false;
  });
  HttpClient c(options(server.port()));
  EXPECT_EQ(c.request(get("/1")).body, "/1");
  std::this_thread::sleep_for(50ms);
  const HttpResponse again = c.request(get("/2"));
  ASSERT_TRUE(again.complete()) << again.error.message;
  EXPECT_EQ(again.body, "/2");
  EXPECT_EQ(server.connections(), 2);

  HttpClient::Options o = options(server.port());
  o.retry_stale_connection = false;
  HttpClient strict(o);
  EXPECT_EQ(strict.request(get("/3")).body, "/3");
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(strict.request(get("/4")).error.kind, HttpFailure::Io);
}

TEST(HttpClient, RawBytesPipeliningAndPeerClose) {
  ScriptedServer server(echo);
  HttpClient c(options(server.port()));
  ASSERT_FALSE(c.connect());
  ASSERT_FALSE(c.write_raw("GET /x HTTP/1.1\r\nHost: h\r\n\r\nGET /y HTTP/1.1\r\nHost: h\r\n\r\n"));
  const HttpResponse x = c.read_response();
  const HttpResponse y = c.read_response();
  EXPECT_EQ(x.body, "/x");
  EXPECT_EQ(y.body, "/y");
  ASSERT_FALSE(c.write_raw("GET /z HTTP/1.1\r\nHost: h\r\n\r\n"));
  const std::string head = c.read_raw_until("\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "nothing past the needle";
  EXPECT_EQ(c.read_raw_until("/z"), "/z") << "the rest stayed for the next read";
  ASSERT_FALSE(c.write_raw("GET /bye HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"));
  EXPECT_TRUE(c.wait_closed_by_peer());
  EXPECT_FALSE(c.connected());
  EXPECT_TRUE(bool(c.write_raw("x"))) << "no connection to write to";
}

}  // namespace
}  // namespace troupe
