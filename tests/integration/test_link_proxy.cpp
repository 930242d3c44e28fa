// The link proxy on real sockets (127.0.0.1): a plain TCP server (echoing,
// and able to push bytes of its own) behind it, a blocking client in front.
// Timing checks are one-sided lower bounds: a timer never fires early, but
// these machines are shared and anything may be late.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "net/link_proxy.h"

namespace troupe {
namespace {

using Bytes = std::vector<uint8_t>;
using Kind = LinkFault::Kind;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int listen_socket(uint16_t port = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) {
    ::close(fd);
    throw std::runtime_error("test server: cannot listen");
  }
  return fd;
}

uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

bool send_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

// A TCP server on 127.0.0.1: records what each connection sent, echoes it
// back when asked to, and can push bytes to every connection.
class TestServer {
 public:
  explicit TestServer(bool echo) : echo_(echo), fd_(listen_socket()), port_(port_of(fd_)) {
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~TestServer() {
    stop_ = true;
    accept_thread_.join();
    for (auto& t : threads_) t.join();
    for (int fd : conns_) ::close(fd);
    ::close(fd_);
  }
  uint16_t port() const { return port_; }
  Bytes received(size_t conn = 0) {
    std::lock_guard lk(mu_);
    return conn < received_.size() ? received_[conn] : Bytes{};
  }
  // Waits until connection `conn` has sent n bytes in all; returns what it sent.
  Bytes wait_received(size_t n, double timeout_s, size_t conn = 0) {
    const auto t0 = Clock::now();
    for (;;) {
      Bytes b = received(conn);
      if (b.size() >= n || since(t0) > timeout_s) return b;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  void push(const Bytes& b) {
    std::lock_guard lk(mu_);
    for (int fd : conns_) send_all(fd, b.data(), b.size());
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      size_t index;
      {
        std::lock_guard lk(mu_);
        index = conns_.size();
        conns_.push_back(c);
        received_.emplace_back();
      }
      threads_.emplace_back([this, c, index] { serve(c, index); });
    }
  }
  void serve(int c, size_t index) {
    uint8_t buf[65536];
    while (!stop_) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) {  // the client is done: so are we (the fd stays open until the end)
        ::shutdown(c, SHUT_WR);
        return;
      }
      std::lock_guard lk(mu_);
      received_[index].insert(received_[index].end(), buf, buf + n);
      if (echo_) send_all(c, buf, size_t(n));
    }
  }

  bool echo_;
  int fd_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<Bytes> received_;
};

class Client {
 public:
  explicit Client(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("test client: cannot connect");
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Client() { ::close(fd_); }
  int fd() const { return fd_; }
  void send(const Bytes& b) { ASSERT_TRUE(send_all(fd_, b.data(), b.size())); }
  void send(const std::string& s) { send(Bytes(s.begin(), s.end())); }
  // Reads until n bytes came, the peer closed, or timeout_s passed.
  Bytes recv(size_t n, double timeout_s) {
    Bytes out;
    const auto t0 = Clock::now();
    uint8_t buf[65536];
    while (out.size() < n) {
      const double left = timeout_s - since(t0);
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, int(left * 1000) + 1) <= 0) continue;
      const ssize_t r = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (r <= 0) {
        closed_ = true;
        break;
      }
      out.insert(out.end(), buf, buf + r);
    }
    return out;
  }
  // Whatever arrives first within timeout_s (empty: nothing, or the end).
  Bytes recv_some(double timeout_s) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, int(timeout_s * 1000)) <= 0) return {};
    uint8_t buf[65536];
    const ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
    if (r <= 0) {
      closed_ = true;
      return {};
    }
    return Bytes(buf, buf + r);
  }
  std::string recv_text(size_t n, double timeout_s) {
    Bytes b = recv(n, timeout_s);
    return std::string(b.begin(), b.end());
  }
  // True when the connection ends (EOF or reset) within timeout_s; bytes before that are skipped.
  bool ends_within(double timeout_s) {
    recv(SIZE_MAX, timeout_s);
    return closed_;
  }

 private:
  int fd_;
  bool closed_ = false;
};

Bytes pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : b) {
    x = x * 1664525u + 1013904223u;
    c = uint8_t(x >> 24);
  }
  return b;
}

LinkFault fault(Kind k, LinkDirection d = LinkDirection::Both) {
  LinkFault f;
  f.kind = k;
  f.direction = d;
  return f;
}

// Polls `pred` until true or timeout_s.
template <class Pred>
bool eventually(Pred pred, double timeout_s = 5) {
  const auto t0 = Clock::now();
  while (!pred()) {
    if (since(t0) > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST(LinkProxy, PassesBytesUnchangedBothWaysAndCountsThem) {
  TestServer server(/*echo=*/true);
  LinkProxy proxy("127.0.0.1", server.port());
  ASSERT_NE(proxy.port(), 0);
  const Bytes data = pattern(300000, 1);
  Client c(proxy.port());
  std::thread sender([&] { c.send(data); });
  const Bytes back = c.recv(data.size(), 10);
  sender.join();
  EXPECT_TRUE(back == data) << "got " << back.size() << " of " << data.size() << " bytes back";
  EXPECT_TRUE(server.received() == data);
  // A write's bytes may arrive before the proxy's handler counts them.
  EXPECT_TRUE(eventually([&] {
    const LinkCounters k = proxy.counters();
    return k.to_upstream.bytes_forwarded == data.size() &&
           k.to_client.bytes_forwarded == data.size();
  }));
  const LinkCounters k = proxy.counters();
  EXPECT_EQ(k.connections, 1u);
  EXPECT_EQ(k.open_connections, 1u);
  EXPECT_EQ(k.to_upstream.bytes_forwarded, data.size());
  EXPECT_EQ(k.to_client.bytes_forwarded, data.size());
  EXPECT_EQ(k.to_upstream.frames_dropped + k.to_upstream.chunks_delayed, 0u);
}

// As the coordinator's node port: a stream that is not a node's BASP is
// reset before the bad header reaches the server; a node's passes.
TEST(LinkProxy, AGuardResetsAStreamThatIsNotANodesBasp) {
  TestServer server(/*echo=*/true);
  LinkProxy proxy("127.0.0.1", server.port(), "127.0.0.1", 0, /*guard=*/true);
  basp::Header h;
  h.operation = 1;  // a client's handshake
  const Bytes hello = basp::frame(h, Bytes(16, 7));
  Client good(proxy.port());
  good.send(hello);
  EXPECT_TRUE(good.recv(hello.size(), 5) == hello);
  Bytes garbage(3, 0);
  garbage.insert(garbage.end(), 100, 0xff);
  Client bad(proxy.port());
  bad.send(garbage);
  EXPECT_TRUE(bad.ends_within(5));
  EXPECT_TRUE(eventually([&] { return proxy.counters().to_upstream.streams_refused == 1; }));
  good.send(hello);  // the good one is untouched
  EXPECT_TRUE(good.recv(hello.size(), 5) == hello);
}

TEST(LinkProxy, SeveralConnectionsAreIndependent) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client a(proxy.port()), b(proxy.port());
  a.send("from a");
  b.send("from b");
  EXPECT_EQ(a.recv_text(6, 5), "from a");
  EXPECT_EQ(b.recv_text(6, 5), "from b");
  EXPECT_EQ(proxy.counters().connections, 2u);
}

TEST(LinkProxy, DelayAddsAtLeastItsTimeEachWay) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  c.send("warm");
  ASSERT_EQ(c.recv_text(4, 5), "warm");
  LinkFault d = fault(Kind::Delay);
  d.delay_s = 0.25;
  const int id = proxy.add(d);
  auto t0 = Clock::now();
  c.send("ping");
  ASSERT_EQ(c.recv_text(4, 5), "ping");
  EXPECT_GE(since(t0), 0.5);  // 0.25 to the server, 0.25 back
  EXPECT_GE(proxy.counters().to_upstream.chunks_delayed, 1u);
  EXPECT_GE(proxy.counters().to_client.chunks_delayed, 1u);
  // Order is kept within the delay.
  for (int i = 0; i < 20; ++i) c.send(std::string(1, char('a' + i)));
  EXPECT_EQ(c.recv_text(20, 5), "abcdefghijklmnopqrst");
  proxy.remove(id);
  c.send("fast");
  ASSERT_EQ(c.recv_text(4, 5), "fast");
}

TEST(LinkProxy, DelayOneWayOnly) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  LinkFault d = fault(Kind::Delay, LinkDirection::ToClient);
  d.delay_s = 0.3;
  proxy.add(d);
  const auto t0 = Clock::now();
  c.send("x");
  // Reaches the server with no delay to speak of: before the echo could come back.
  ASSERT_EQ(server.wait_received(1, 5).size(), 1u);
  EXPECT_EQ(c.recv_text(1, 5), "x");
  EXPECT_GE(since(t0), 0.3);
  EXPECT_EQ(proxy.counters().to_upstream.chunks_delayed, 0u);
}

TEST(LinkProxy, OneWayCutToUpstreamStopsOnlyThatDirectionAndLosesNothing) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  c.send("hello");
  ASSERT_EQ(c.recv_text(5, 5), "hello");

  const int cut = proxy.add(fault(Kind::Cut, LinkDirection::ToUpstream));
  const Bytes data = pattern(100000, 2);
  c.send(data);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.received().size(), 5u) << "bytes crossed a cut link";
  // The other direction still flows.
  server.push({'p', 'u', 's', 'h'});
  EXPECT_EQ(c.recv_text(4, 5), "push");
  EXPECT_EQ(proxy.counters().open_connections, 1u);

  proxy.remove(cut);
  Bytes expected{'h', 'e', 'l', 'l', 'o'};
  expected.insert(expected.end(), data.begin(), data.end());
  EXPECT_TRUE(server.wait_received(expected.size(), 10) == expected);
  EXPECT_TRUE(c.recv(data.size(), 10) == data);
  const LinkCounters k = proxy.counters();
  EXPECT_GT(k.to_upstream.bytes_held_while_cut, 0u);
  EXPECT_GE(k.to_upstream.cut_us, 250000u);
  EXPECT_EQ(k.to_client.cut_us, 0u);
}

TEST(LinkProxy, OneWayCutToClientStopsOnlyThatDirection) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  c.send("a");
  ASSERT_EQ(c.recv_text(1, 5), "a");
  const int cut = proxy.add(fault(Kind::Cut, LinkDirection::ToClient));
  c.send("bcd");
  EXPECT_EQ(server.wait_received(4, 5).size(), 4u);  // it reached the server
  EXPECT_EQ(c.recv_text(3, 0.3), "");                // its echo did not come back
  proxy.remove(cut);
  EXPECT_EQ(c.recv_text(3, 5), "bcd");
}

TEST(LinkProxy, ACutIsBackpressureNotBuffering) {
  TestServer server(false);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  c.send("x");
  ASSERT_EQ(server.wait_received(1, 5).size(), 1u);
  const int cut = proxy.add(fault(Kind::Cut, LinkDirection::ToUpstream));
  // The client writes until its socket refuses more: the proxy stopped reading.
  ::fcntl(c.fd(), F_SETFL, ::fcntl(c.fd(), F_GETFL) | O_NONBLOCK);
  const Bytes block = pattern(65536, 3);
  size_t sent = 0;
  const auto t0 = Clock::now();
  while (since(t0) < 10) {
    const ssize_t w = ::send(c.fd(), block.data(), block.size(), MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      // Still refused after a pause: the buffers are full.
      pollfd p{c.fd(), POLLOUT, 0};
      if (::poll(&p, 1, 100) == 0) break;
      continue;
    }
    ASSERT_GT(w, 0);
    sent += size_t(w);
  }
  EXPECT_LT(sent, size_t(64) << 20) << "the client never felt backpressure";
  EXPECT_EQ(server.received().size(), 1u);
  proxy.remove(cut);
  EXPECT_EQ(server.wait_received(1 + sent, 20).size(), 1 + sent);
  EXPECT_GE(proxy.counters().to_upstream.bytes_held_while_cut, 1u);
}

TEST(LinkProxy, BandwidthBoundsThroughput) {
  TestServer server(false);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  LinkFault b = fault(Kind::Bandwidth, LinkDirection::ToUpstream);
  b.bytes_per_s = 20000;
  proxy.add(b);
  const Bytes data = pattern(20000, 4);
  const auto t0 = Clock::now();
  c.send(data);
  ASSERT_TRUE(server.wait_received(data.size(), 20) == data);
  // 20000 bytes at 20000 B/s, less the first burst (1/20 s): at least 0.95 s.
  EXPECT_GE(since(t0), 0.9);
  EXPECT_TRUE(eventually([&] {  // counted when the write's handler runs
    return proxy.counters().to_upstream.bytes_throttled == data.size();
  }));
  EXPECT_EQ(proxy.counters().to_client.bytes_throttled, 0u);
}

TEST(LinkProxy, ResetConnectionsClosesTheClientsSocket) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  c.send("hi");
  ASSERT_EQ(c.recv_text(2, 5), "hi");
  proxy.reset_connections();
  EXPECT_TRUE(c.ends_within(5));
  const LinkCounters k = proxy.counters();
  EXPECT_EQ(k.connections_reset, 1u);
  EXPECT_EQ(k.open_connections, 0u);
  // New connections are served as before.
  Client d(proxy.port());
  d.send("again");
  EXPECT_EQ(d.recv_text(5, 5), "again");
}

TEST(LinkProxy, AClientsCloseReachesTheServerAndEndsTheConnection) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  {
    Client c(proxy.port());
    c.send("bye");
    ASSERT_EQ(c.recv_text(3, 5), "bye");
  }
  EXPECT_TRUE(eventually([&] { return proxy.counters().open_connections == 0; }));
}

TEST(LinkProxy, AnUnreachableUpstreamClosesTheClient) {
  const int fd = listen_socket();
  const uint16_t dead = port_of(fd);
  ::close(fd);  // nothing listens there now
  LinkProxy proxy("127.0.0.1", dead);
  Client c(proxy.port());
  EXPECT_TRUE(c.ends_within(5));
  EXPECT_EQ(proxy.counters().connect_failures, 1u);
}

TEST(LinkProxy, CannotListenThrowsNamingTheAddress) {
  const int fd = listen_socket();
  const uint16_t taken = port_of(fd);
  try {
    LinkProxy proxy("127.0.0.1", 1, "127.0.0.1", taken);
    ADD_FAILURE() << "listened on a port that is taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(taken)), std::string::npos)
        << e.what();
  }
  ::close(fd);
}

TEST(LinkProxy, RejectsFaultsThatMakeNoSense) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  LinkFault f = fault(Kind::Drop);
  f.probability = 1.5;
  EXPECT_THROW(proxy.add(f), std::invalid_argument);
  EXPECT_THROW(proxy.add(fault(Kind::Bandwidth)), std::invalid_argument);
}

// ---- frame faults, with hand-built BASP frames through the echo server ----

constexpr uint8_t kHandshake = 0, kDirect = 2, kRouted = 3, kHeartbeat = 6;

Bytes frame(uint8_t op, uint64_t tag, size_t payload = 12) {
  basp::Header h;
  h.operation = op;
  h.operation_data = tag;
  return basp::frame(h, pattern(payload, uint32_t(tag)));
}

Bytes concat(const std::vector<Bytes>& frames) {
  Bytes out;
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

// The (operation, tag) of each whole frame in s.
std::vector<std::pair<int, uint64_t>> frames_in(const Bytes& s) {
  std::vector<std::pair<int, uint64_t>> out;
  for (size_t at = 0; at + basp::kHeaderSize <= s.size();) {
    const basp::Header h = basp::read_header(s.data() + at);
    if (at + basp::kHeaderSize + h.payload_len > s.size()) break;
    out.emplace_back(h.operation, h.operation_data);
    at += basp::kHeaderSize + h.payload_len;
  }
  return out;
}

std::vector<Bytes> handshake_then(std::vector<Bytes> rest) {
  rest.insert(rest.begin(), frame(kHandshake, 1000, 40));
  return rest;
}

TEST(LinkProxyFrames, DropRemovesExactlyTheEligibleFrames) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  LinkFault d = fault(Kind::Drop, LinkDirection::ToUpstream);
  proxy.add(d);
  Client c(proxy.port());
  const auto sent =
      handshake_then({frame(kDirect, 1), frame(kHeartbeat, 2, 0), frame(kRouted, 3), frame(4, 4),
                      frame(kDirect, 5), frame(5, 6), frame(kHeartbeat, 7, 0)});
  c.send(concat(sent));
  std::vector<Bytes> kept;
  for (const auto& f : sent)
    if (f[0] != kDirect && f[0] != kRouted) kept.push_back(f);
  const Bytes want = concat(kept);
  EXPECT_TRUE(c.recv(want.size(), 5) == want);
  EXPECT_TRUE(c.recv(1, 0.2).empty()) << "more came back than the frames kept";
  const LinkCounters k = proxy.counters();
  EXPECT_EQ(k.to_upstream.frames_dropped, 3u);
  EXPECT_EQ(k.to_upstream.frames_forwarded, 5u);
  EXPECT_EQ(k.to_client.frames_forwarded, 5u);
  EXPECT_EQ(k.to_client.frames_dropped, 0u);
}

TEST(LinkProxyFrames, DuplicateDoublesTheEligibleFrames) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  proxy.add(fault(Kind::Duplicate, LinkDirection::ToUpstream));
  Client c(proxy.port());
  const auto sent = handshake_then({frame(kDirect, 1), frame(kHeartbeat, 2, 0), frame(kRouted, 3)});
  c.send(concat(sent));
  const Bytes want = concat({sent[0], sent[1], sent[1], sent[2], sent[3], sent[3]});
  EXPECT_TRUE(c.recv(want.size(), 5) == want);
  EXPECT_EQ(proxy.counters().to_upstream.frames_duplicated, 2u);
}

TEST(LinkProxyFrames, ReorderSwapsTwoAndSendsALoneFrameAfterTheWait) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  proxy.add(fault(Kind::Reorder, LinkDirection::ToUpstream));
  Client c(proxy.port());
  c.send(concat(handshake_then({frame(kDirect, 1), frame(kDirect, 2)})));
  const Bytes want = concat({frame(kHandshake, 1000, 40), frame(kDirect, 2), frame(kDirect, 1)});
  EXPECT_TRUE(c.recv(want.size(), 5) == want);
  // A third has no partner: held, then sent anyway.
  const auto t0 = Clock::now();
  c.send(frame(kDirect, 3));
  EXPECT_TRUE(c.recv(frame(kDirect, 3).size(), 5) == frame(kDirect, 3));
  EXPECT_GE(since(t0), LinkFault{}.reorder_wait_s);
  EXPECT_EQ(proxy.counters().to_upstream.frames_reordered, 1u);
}

TEST(LinkProxyFrames, TheSameSeedDropsTheSameFramesOnEveryConnection) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  LinkFault d = fault(Kind::Drop, LinkDirection::ToUpstream);
  d.probability = 0.5;
  d.seed = 1234;
  proxy.add(d);
  std::vector<Bytes> frames;
  for (uint64_t i = 1; i <= 40; ++i) frames.push_back(frame(kDirect, i));
  frames.push_back(frame(kHeartbeat, 999, 0));  // always passes: marks the end
  auto survivors = [&] {
    Client c(proxy.port());
    c.send(concat(frames));
    Bytes got;
    while (frames_in(got).empty() || frames_in(got).back().second != 999) {
      Bytes more = c.recv_some(5);
      if (more.empty()) break;
      got.insert(got.end(), more.begin(), more.end());
    }
    std::vector<uint64_t> tags;
    for (auto [op, tag] : frames_in(got)) tags.push_back(tag);
    return tags;
  };
  const auto first = survivors();
  const auto second = survivors();
  EXPECT_EQ(first, second);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first.back(), 999u);
  EXPECT_GT(first.size(), 6u);  // about half of 40 survive
  EXPECT_LT(first.size(), 36u);
}

TEST(LinkProxyFrames, AStreamThatIsNotBaspPassesUnchangedAndIsCounted) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  proxy.add(fault(Kind::Drop));
  Client c(proxy.port());
  c.send("this is not BASP at all");
  EXPECT_EQ(c.recv_text(23, 5), "this is not BASP at all");
  EXPECT_EQ(proxy.counters().to_upstream.streams_not_basp, 1u);
  EXPECT_EQ(proxy.counters().to_client.streams_not_basp, 1u);
}

TEST(LinkProxyFrames, FaultsChangeFromOtherThreadsWhileTrafficFlows) {
  TestServer server(true);
  LinkProxy proxy("127.0.0.1", server.port());
  Client c(proxy.port());
  std::atomic<bool> done{false};
  std::atomic<int> rounds{0};
  std::thread chaos([&] {
    while (!done) {
      LinkFault d = fault(Kind::Delay);
      d.delay_s = 0.001;
      const int a = proxy.add(d);
      const int b = proxy.add(fault(Kind::Cut, LinkDirection::ToClient));
      const int e = proxy.add(fault(Kind::Duplicate, LinkDirection::ToClient));
      (void)proxy.counters();
      proxy.remove(e);
      proxy.remove(b);
      proxy.remove(a);
      LinkFault z = fault(Kind::Drop);
      z.probability = 0;  // frames are held and parsed, none dropped
      const int f = proxy.add(z);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      proxy.remove(f);
      ++rounds;
    }
  });
  std::vector<Bytes> sent;
  for (uint64_t i = 0; i < 200; ++i)
    sent.push_back(frame(i % 2 ? kHandshake : kHeartbeat, i, i * 7));
  const Bytes all = concat(sent);
  std::thread sender([&] {
    // In pieces that split frames, while the faults come and go.
    for (size_t at = 0; at < all.size(); at += 1000) {
      c.send(Bytes(all.begin() + long(at), all.begin() + long(std::min(all.size(), at + 1000))));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  const Bytes back = c.recv(all.size(), 20);
  sender.join();
  done = true;
  chaos.join();
  EXPECT_TRUE(back == all) << back.size() << " of " << all.size();
  EXPECT_GT(rounds.load(), 5);
}

}  // namespace
}  // namespace troupe
