// The link proxy between two CAF actor systems (in this process, each with
// its own middleman): CAF's real BASP traffic through it. Drop, Duplicate
// and Reorder only do what they say if the proxy cuts CAF's stream into
// frames exactly where CAF does, so these tests check the frame parsing
// against the wire format rather than against our own idea of it.
#include <gtest/gtest.h>

#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp/header.hpp>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "net/link_proxy.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using Kind = LinkFault::Kind;
using Clock = std::chrono::steady_clock;

using counter_actor = caf::typed_actor<caf::replies_to<int32_t>::with<int32_t>>;

// Counts its calls and records the values in the order it saw them.
struct Seen {
  std::atomic<int> calls{0};
  std::mutex mu;
  std::vector<int32_t> values;
};

counter_actor::behavior_type counter(counter_actor::pointer, Seen* seen) {
  return {[seen](int32_t x) -> int32_t {
    {
      std::lock_guard lk(seen->mu);
      seen->values.push_back(x);
    }
    ++seen->calls;
    return x + 1;
  }};
}

struct System {
  System() : sys(cfg.load<caf::io::middleman>()) {}
  caf::actor_system_config cfg;
  caf::actor_system sys;
};

// A server system publishing a counter on 127.0.0.1:0, a proxy in front of
// it, and a client system holding a handle to the counter through the proxy.
struct TwoSystems {
  TwoSystems() {
    actor = server.sys.spawn(counter, &seen);
    auto port = server.sys.middleman().publish(actor, 0, "127.0.0.1", true);
    if (!port) throw std::runtime_error("publish: " + server.sys.render(port.error()));
    proxy = std::make_unique<LinkProxy>("127.0.0.1", *port);
    auto r = client.sys.middleman().remote_actor<counter_actor>("127.0.0.1", proxy->port());
    if (!r) throw std::runtime_error("remote_actor: " + client.sys.render(r.error()));
    remote = *r;
    if (ask(0) != 1) throw std::runtime_error("no answer through the proxy");
    settle();
  }
  ~TwoSystems() {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    proxy.reset();  // the connection ends: both middlemen see it go
  }

  // Waits until no frame has crossed the proxy for 250 ms. Right after a
  // connection, CAF exchanges messages of its own (the client asks the
  // server's "SpawnServ" for its info: a direct_message with a named
  // receiver, and its reply), possibly after the first request; a fault
  // added before they are through would hit them too.
  void settle() {
    auto frames = [&] {
      const LinkCounters k = proxy->counters();
      return k.to_upstream.frames_forwarded + k.to_client.frames_forwarded;
    };
    uint64_t last = frames();
    auto quiet_since = Clock::now();
    const auto t0 = Clock::now();
    while (Clock::now() - quiet_since < 250ms && Clock::now() - t0 < 5s) {
      std::this_thread::sleep_for(10ms);
      if (uint64_t now = frames(); now != last) {
        last = now;
        quiet_since = Clock::now();
      }
    }
  }

  // x + 1, or -1 when the request failed (a timeout).
  int32_t ask(int32_t x, std::chrono::milliseconds timeout = 500ms) {
    caf::scoped_actor self{client.sys};  // a fresh one: a stray duplicate reply stays out
    int32_t out = -1;
    self->request(remote, timeout, x)
        .receive([&](int32_t y) { out = y; }, [&](caf::error&) { out = -1; });
    return out;
  }

  Seen seen;
  System server;
  System client;
  counter_actor actor;
  std::unique_ptr<LinkProxy> proxy;
  counter_actor remote;
};

template <class Pred>
bool eventually(Pred pred, double timeout_s = 5) {
  const auto t0 = Clock::now();
  while (!pred()) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

LinkFault fault(Kind k, LinkDirection d) {
  LinkFault f;
  f.kind = k;
  f.direction = d;
  return f;
}

TEST(BaspWire, HeaderByteOrderMatchesCaf) {
  System s;
  std::vector<char> buf;
  caf::binary_serializer sink{s.sys, buf};
  caf::io::basp::header h{caf::io::basp::message_type::routed_message,
                          0x02,
                          0x00a1b2c3u,
                          0x0102030405060708ull,
                          0x1112131415161718ull,
                          0x2122232425262728ull};
  ASSERT_FALSE(sink(h));
  ASSERT_EQ(buf.size(), basp::kHeaderSize);
  ASSERT_EQ(caf::io::basp::header_size, basp::kHeaderSize);
  basp::Header ours;
  ours.operation = 3;
  ours.flags = 0x02;
  ours.payload_len = 0x00a1b2c3u;
  ours.operation_data = 0x0102030405060708ull;
  ours.source_actor = 0x1112131415161718ull;
  ours.dest_actor = 0x2122232425262728ull;
  uint8_t mine[32];
  basp::write_header(ours, mine);
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.end()), std::vector<uint8_t>(mine, mine + 32));
  const basp::Header back = basp::read_header(reinterpret_cast<const uint8_t*>(buf.data()));
  EXPECT_EQ(back.operation, 3);
  EXPECT_EQ(back.flags, 0x02);
  EXPECT_EQ(back.payload_len, 0x00a1b2c3u);
  EXPECT_EQ(back.operation_data, 0x0102030405060708ull);
  EXPECT_EQ(back.source_actor, 0x1112131415161718ull);
  EXPECT_EQ(back.dest_actor, 0x2122232425262728ull);
}

TEST(LinkProxyCaf, ARequestGoesThroughAndItsStreamParsesAsBasp) {
  TwoSystems t;
  EXPECT_EQ(t.ask(41), 42);
  EXPECT_EQ(t.ask(1), 2);
  const LinkCounters k = t.proxy->counters();
  EXPECT_EQ(k.connections, 1u);
  EXPECT_EQ(k.to_upstream.streams_not_basp, 0u);
  EXPECT_EQ(k.to_client.streams_not_basp, 0u);
  // Each way at least a handshake and the two messages.
  EXPECT_GE(k.to_upstream.frames_forwarded, 3u);
  EXPECT_GE(k.to_client.frames_forwarded, 3u);
}

TEST(LinkProxyCaf, DroppedRequestsTimeOutAndLaterOnesSucceed) {
  TwoSystems t;  // one request (0) answered already
  const int drop = t.proxy->add(fault(Kind::Drop, LinkDirection::ToUpstream));
  EXPECT_EQ(t.ask(10), -1);
  EXPECT_EQ(t.seen.calls.load(), 1) << "a dropped request reached the actor";
  EXPECT_GE(t.proxy->counters().to_upstream.frames_dropped, 1u);
  t.proxy->remove(drop);
  EXPECT_EQ(t.ask(20), 21);
  EXPECT_EQ(t.proxy->counters().to_upstream.streams_not_basp, 0u);
}

TEST(LinkProxyCaf, DroppedRepliesTimeOutToo) {
  TwoSystems t;
  const int drop = t.proxy->add(fault(Kind::Drop, LinkDirection::ToClient));
  EXPECT_EQ(t.ask(10), -1);
  EXPECT_EQ(t.seen.calls.load(), 2);  // the request got there, its reply did not come back
  t.proxy->remove(drop);
  EXPECT_EQ(t.ask(20), 21);
}

TEST(LinkProxyCaf, ADuplicatedRequestRunsTheHandlerTwice) {
  TwoSystems t;
  t.proxy->add(fault(Kind::Duplicate, LinkDirection::ToUpstream));
  EXPECT_EQ(t.ask(5), 6);
  EXPECT_TRUE(eventually([&] { return t.seen.calls.load() == 3; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(t.seen.calls.load(), 3);  // 1 before, then twice, not more
  EXPECT_EQ(t.proxy->counters().to_upstream.frames_duplicated, 1u);
}

TEST(LinkProxyCaf, ReorderedMessagesArriveSwapped) {
  TwoSystems t;
  LinkFault r = fault(Kind::Reorder, LinkDirection::ToUpstream);
  r.reorder_wait_s = 10;  // however slow this machine, 200 goes ahead of 100
  t.proxy->add(r);
  caf::anon_send(t.remote, int32_t{100});
  caf::anon_send(t.remote, int32_t{200});
  ASSERT_TRUE(eventually([&] { return t.seen.calls.load() == 3; }));
  std::lock_guard lk(t.seen.mu);
  EXPECT_EQ(t.seen.values, (std::vector<int32_t>{0, 200, 100}));
}

TEST(LinkProxyCaf, ACutStallsRequestsAndNothingIsLostAfterIt) {
  TwoSystems t;
  const int cut = t.proxy->add(fault(Kind::Cut, LinkDirection::ToUpstream));
  caf::anon_send(t.remote, int32_t{7});
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(t.seen.calls.load(), 1);
  t.proxy->remove(cut);
  EXPECT_TRUE(eventually([&] { return t.seen.calls.load() == 2; }));
  EXPECT_EQ(t.ask(2), 3);
}

}  // namespace
}  // namespace troupe
