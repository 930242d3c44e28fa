// The link proxy's frame logic without sockets: BaspFrameTracker fed
// hand-built BASP frames (a 32-byte big-endian header and a payload), split
// at every possible place. The proxy itself, on real sockets, is tested in
// tests/integration/test_link_proxy.cpp; against CAF's own wire format in
// tests/integration/test_link_proxy_caf.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "net/link_proxy.h"

namespace troupe {
namespace {

using Bytes = std::vector<uint8_t>;
using Kind = LinkFault::Kind;

constexpr uint8_t kServerHandshake = 0, kClientHandshake = 1, kDirect = 2, kRouted = 3,
                  kMonitor = 4, kDown = 5, kHeartbeat = 6;

// A frame whose operation and tag (in operation_data and the payload) say which one it is.
Bytes frame(uint8_t op, uint64_t tag, size_t payload_size = 8) {
  basp::Header h;
  h.operation = op;
  h.operation_data = tag;
  h.source_actor = 7;
  h.dest_actor = 9;
  Bytes payload(payload_size);
  for (size_t i = 0; i < payload_size; ++i) payload[i] = uint8_t(tag + i);
  return basp::frame(h, payload);
}

Bytes concat(const std::vector<Bytes>& frames) {
  Bytes out;
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

// (operation, tag) of each frame in a stream; fails on a stream that does not split into frames.
std::vector<std::pair<int, uint64_t>> frames_in(const Bytes& s) {
  std::vector<std::pair<int, uint64_t>> out;
  size_t at = 0;
  while (at < s.size()) {
    EXPECT_GE(s.size() - at, basp::kHeaderSize) << "a partial header at " << at;
    if (s.size() - at < basp::kHeaderSize) break;
    const basp::Header h = basp::read_header(s.data() + at);
    EXPECT_LE(at + basp::kHeaderSize + h.payload_len, s.size()) << "a partial frame at " << at;
    out.emplace_back(h.operation, h.operation_data);
    at += basp::kHeaderSize + h.payload_len;
  }
  return out;
}

struct Harness {
  Bytes out;
  BaspFrameTracker tracker{LinkDirection::ToUpstream,
                           [this](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); }};

  void faults(const std::vector<LinkFault>& fs) {
    std::vector<BaspFrameTracker::FrameFault> v;
    int id = 1;
    for (const auto& f : fs)
      v.push_back({id++, f.kind, f.probability, f.seed, f.frame_ops, f.reorder_wait_s});
    tracker.set_faults(v);
  }
  // Feeds in pieces of `step` bytes (0: all at once).
  void feed(const Bytes& b, size_t step = 0, double now = 0) {
    if (step == 0) step = b.size();
    for (size_t at = 0; at < b.size(); at += step)
      tracker.feed(b.data() + at, std::min(step, b.size() - at), now);
  }
};

LinkFault fault(Kind k, double p = 1, uint64_t seed = 1) {
  LinkFault f;
  f.kind = k;
  f.probability = p;
  f.seed = seed;
  return f;
}

TEST(BaspHeader, WritesBigEndianFieldsAtCafsOffsets) {
  basp::Header h;
  h.operation = kDirect;
  h.flags = 0x01;
  h.payload_len = 0x11223344u;
  h.operation_data = 0x0102030405060708ull;
  h.source_actor = 0x1112131415161718ull;
  h.dest_actor = 0x2122232425262728ull;
  uint8_t b[32];
  basp::write_header(h, b);
  // What caf::binary_serializer wrote for the same header on this machine.
  const Bytes expected{0x02, 0x00, 0x00, 0x01, 0x11, 0x22, 0x33, 0x44, 0x01, 0x02, 0x03,
                       0x04, 0x05, 0x06, 0x07, 0x08, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16,
                       0x17, 0x18, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28};
  EXPECT_EQ(Bytes(b, b + 32), expected);
  const basp::Header r = basp::read_header(b);
  EXPECT_EQ(r.operation, h.operation);
  EXPECT_EQ(r.flags, h.flags);
  EXPECT_EQ(r.payload_len, h.payload_len);
  EXPECT_EQ(r.operation_data, h.operation_data);
  EXPECT_EQ(r.source_actor, h.source_actor);
  EXPECT_EQ(r.dest_actor, h.dest_actor);
}

// Every kind of frame, twice, with payloads of several sizes (0 included).
std::vector<Bytes> mixed_stream() {
  return {frame(kServerHandshake, 100, 40),
          frame(kClientHandshake, 101, 40),
          frame(kDirect, 1),
          frame(kHeartbeat, 102, 0),
          frame(kRouted, 2, 100),
          frame(kMonitor, 103, 16),
          frame(kDirect, 3, 0),
          frame(kDown, 104, 20),
          frame(kHeartbeat, 105, 0),
          frame(kDirect, 4, 3000)};
}

TEST(BaspFrameTracker, PassesEveryByteUnchangedWithoutFaultsHoweverSplit) {
  const Bytes s = concat(mixed_stream());
  for (size_t step :
       {size_t(1), size_t(5), size_t(31), size_t(32), size_t(33), size_t(1000), size_t(0)}) {
    Harness h;
    h.feed(s, step);
    EXPECT_EQ(h.out, s) << "step " << step;
    EXPECT_EQ(h.tracker.stats().frames_forwarded, 10u);
    EXPECT_TRUE(h.tracker.parses());
    EXPECT_EQ(h.tracker.held_bytes(), 0u);
  }
}

TEST(BaspFrameTracker, DropRemovesExactlyTheDirectAndRoutedMessages) {
  const Bytes s = concat(mixed_stream());
  std::vector<Bytes> kept;
  for (const auto& f : mixed_stream())
    if (f[0] != kDirect && f[0] != kRouted) kept.push_back(f);
  for (size_t step : {size_t(1), size_t(7), size_t(32), size_t(0)}) {
    Harness h;
    h.faults({fault(Kind::Drop)});
    h.feed(s, step);
    h.tracker.finish();
    EXPECT_EQ(h.out, concat(kept)) << "step " << step;
    EXPECT_EQ(h.tracker.stats().frames_dropped, 4u);
    EXPECT_EQ(h.tracker.stats().frames_forwarded, 6u);
  }
}

TEST(BaspFrameTracker, HandshakesAndHeartbeatsAreNeverEligibleWhateverTheMask) {
  Harness h;
  LinkFault f = fault(Kind::Drop);
  f.frame_ops = 0xffffffffu;  // asks for everything
  h.faults({f});
  h.feed(concat(mixed_stream()), 3);
  const std::vector<std::pair<int, uint64_t>> expected{
      {kServerHandshake, 100}, {kClientHandshake, 101}, {kHeartbeat, 102}, {kHeartbeat, 105}};
  EXPECT_EQ(frames_in(h.out), expected);
}

TEST(BaspFrameTracker, TheMaskChoosesTheEligibleOperations) {
  Harness h;
  LinkFault f = fault(Kind::Drop);
  f.frame_ops = 1u << kMonitor;
  h.faults({f});
  h.feed(concat(mixed_stream()));
  auto got = frames_in(h.out);
  EXPECT_EQ(got.size(), 9u);
  for (auto [op, tag] : got) EXPECT_NE(op, kMonitor);
}

TEST(BaspFrameTracker, DuplicateSendsEachEligibleFrameTwiceAndTheRestOnce) {
  for (size_t step : {size_t(1), size_t(13), size_t(0)}) {
    Harness h;
    h.faults({fault(Kind::Duplicate)});
    h.feed(concat(mixed_stream()), step);
    std::vector<Bytes> expected;
    for (const auto& f : mixed_stream()) {
      expected.push_back(f);
      if (f[0] == kDirect || f[0] == kRouted) expected.push_back(f);
    }
    EXPECT_EQ(h.out, concat(expected)) << "step " << step;
    EXPECT_EQ(h.tracker.stats().frames_duplicated, 4u);
    EXPECT_EQ(h.tracker.stats().frames_forwarded, 14u);
  }
}

TEST(BaspFrameTracker, ReorderSwapsAnEligibleFrameWithTheNextEligibleOne) {
  Harness h;
  h.faults({fault(Kind::Reorder)});
  // d1 is held; the heartbeat is not eligible and passes; d2 goes ahead of d1.
  h.feed(concat({frame(kDirect, 1), frame(kHeartbeat, 50, 0), frame(kDirect, 2)}), 5);
  const std::vector<std::pair<int, uint64_t>> expected{
      {kHeartbeat, 50}, {kDirect, 2}, {kDirect, 1}};
  EXPECT_EQ(frames_in(h.out), expected);
  EXPECT_EQ(h.tracker.stats().frames_reordered, 1u);
  EXPECT_EQ(h.tracker.held_bytes(), 0u);
}

TEST(BaspFrameTracker, AFrameWithoutPartnerGoesOutAfterTheWaitUncounted) {
  Harness h;
  h.faults({fault(Kind::Reorder)});
  h.feed(frame(kRouted, 1), 0, /*now=*/10.0);
  EXPECT_TRUE(h.out.empty());
  EXPECT_GT(h.tracker.held_bytes(), 0u);
  auto due = h.tracker.poll(10.05);
  ASSERT_TRUE(due.has_value());
  EXPECT_NEAR(*due, 10.0 + LinkFault{}.reorder_wait_s, 1e-9);
  EXPECT_TRUE(h.out.empty());
  EXPECT_FALSE(h.tracker.poll(10.25).has_value());
  EXPECT_EQ(h.out, frame(kRouted, 1));
  EXPECT_EQ(h.tracker.stats().frames_reordered, 0u);
  EXPECT_EQ(h.tracker.stats().frames_forwarded, 1u);
}

TEST(BaspFrameTracker, TheFaultSaysHowLongAFrameWaitsForItsPartner) {
  Harness h;
  LinkFault r = fault(Kind::Reorder);
  r.reorder_wait_s = 1.5;
  h.faults({r});
  h.feed(frame(kDirect, 1), 0, 10.0);
  EXPECT_EQ(h.tracker.poll(10.3), std::optional<double>(11.5));
  EXPECT_TRUE(h.out.empty());
  h.feed(frame(kDirect, 2), 0, 11.0);  // in time: swapped
  EXPECT_EQ(h.out, concat({frame(kDirect, 2), frame(kDirect, 1)}));
  EXPECT_EQ(h.tracker.stats().frames_reordered, 1u);
}

TEST(BaspFrameTracker, AHeldFrameWaitsForTheFrameInFlightToEnd) {
  Harness h;
  h.faults({fault(Kind::Reorder)});
  h.feed(frame(kDirect, 1), 0, 0.0);        // held
  const Bytes m = frame(kMonitor, 2, 100);  // not eligible: streams as it comes
  h.tracker.feed(m.data(), 40, 0.0);
  EXPECT_EQ(h.out, Bytes(m.begin(), m.begin() + 40));
  // Overdue, but sending it now would cut the monitor message in two.
  auto again = h.tracker.poll(1.0);
  ASSERT_TRUE(again.has_value());
  EXPECT_GT(*again, 1.0);
  EXPECT_EQ(h.out.size(), 40u);
  h.tracker.feed(m.data() + 40, m.size() - 40, 1.0);
  EXPECT_FALSE(h.tracker.poll(*again).has_value());
  EXPECT_EQ(h.out, concat({m, frame(kDirect, 1)}));
  EXPECT_EQ(h.tracker.stats().frames_reordered, 0u);
}

TEST(BaspFrameTracker, RemovingReorderReleasesTheHeldFrame) {
  Harness h;
  h.faults({fault(Kind::Reorder)});
  h.feed(frame(kDirect, 1), 0, 0.0);
  EXPECT_TRUE(h.out.empty());
  h.faults({});
  EXPECT_EQ(h.out, frame(kDirect, 1));
}

TEST(BaspFrameTracker, TheSameSeedDropsTheSameFrames) {
  std::vector<Bytes> frames;
  for (uint64_t i = 0; i < 64; ++i) frames.push_back(frame(i % 2 ? kDirect : kRouted, i));
  auto survivors = [&](uint64_t seed) {
    Harness h;
    h.faults({fault(Kind::Drop, 0.5, seed)});
    h.feed(concat(frames), 11);
    std::vector<uint64_t> tags;
    for (auto [op, tag] : frames_in(h.out)) tags.push_back(tag);
    return tags;
  };
  const auto a = survivors(42);
  EXPECT_EQ(a, survivors(42));
  EXPECT_GT(a.size(), 10u);  // p = 0.5 over 64 frames: far from all or none
  EXPECT_LT(a.size(), 54u);
  EXPECT_NE(a, survivors(43));
}

TEST(BaspFrameTracker, ProbabilityZeroTouchesNothing) {
  Harness h;
  h.faults({fault(Kind::Drop, 0), fault(Kind::Duplicate, 0), fault(Kind::Reorder, 0)});
  const Bytes s = concat(mixed_stream());
  h.feed(s, 9);
  EXPECT_EQ(h.out, s);
}

TEST(BaspFrameTracker, AStreamThatIsNotBaspPassesUnchanged) {
  for (bool with_fault : {false, true}) {
    Harness h;
    if (with_fault) h.faults({fault(Kind::Drop)});
    const std::string text = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    const Bytes s(text.begin(), text.end());
    h.feed(s, 4);
    EXPECT_EQ(h.out, s);
    EXPECT_FALSE(h.tracker.parses());
    EXPECT_TRUE(h.tracker.take_parse_failure());
    EXPECT_FALSE(h.tracker.take_parse_failure());  // once
  }
}

TEST(BaspFrameTracker, AnOversizedPayloadLengthIsNotBasp) {
  Harness h;
  h.faults({fault(Kind::Drop)});
  const Bytes good = frame(kDirect, 1);
  Bytes bad = frame(kDirect, 2);
  bad[4] = 0x20;  // payload_len 512 MiB + 8
  h.feed(concat({frame(kHeartbeat, 0, 0), good, bad}));
  EXPECT_FALSE(h.tracker.parses());
  // The heartbeat passed, the good direct message was dropped, the rest went out raw.
  EXPECT_EQ(h.out, concat({frame(kHeartbeat, 0, 0), bad}));
}

TEST(BaspFrameTracker, FinishPassesOnWhatIsHeld) {
  Harness h;
  h.faults({fault(Kind::Reorder)});
  const Bytes d1 = frame(kDirect, 1);
  const Bytes d2 = frame(kDirect, 2);
  h.feed(d1);
  h.tracker.feed(d2.data(), 10, 0);  // a partial header, held
  h.tracker.finish();
  Bytes expected = d1;
  expected.insert(expected.end(), d2.begin(), d2.begin() + 10);
  EXPECT_EQ(h.out, expected);
}

// The node port's intake: a client's handshake first, then frames of BASP's
// operations with payloads within the limit; the first byte that breaks a
// rule is refused, wherever the stream is split.
TEST(BaspIntake, TakesANodesStreamHoweverSplit) {
  const Bytes stream = concat({frame(kClientHandshake, 1, 40), frame(kDirect, 2, 300),
                               frame(kHeartbeat, 3, 0), frame(kRouted, 4, 5)});
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    basp::Intake in;
    EXPECT_TRUE(in.admit(stream.data(), cut) && in.admit(stream.data() + cut, stream.size() - cut))
        << cut << ": " << in.problem();
  }
}

TEST(BaspIntake, RefusesWhatIsNotANodesBasp) {
  const auto refused_at = [](const Bytes& s, uint32_t max_payload = basp::kMaxPayload) {
    basp::Intake in(max_payload);
    for (size_t i = 0; i < s.size(); ++i)
      if (!in.admit(&s[i], 1)) {
        EXPECT_FALSE(in.admit(s.data(), 1)) << "refused for good";
        return std::make_pair(int(i), in.problem());
      }
    return std::make_pair(-1, std::string());
  };
  // The 111 bytes of a stray stream whose length field reads 0xffffffff.
  Bytes garbage(3, 0);
  garbage.insert(garbage.end(), 100, 0xff);
  auto [at, why] = refused_at(garbage);
  EXPECT_EQ(at, 0) << "operation 0 is the server's handshake";
  // A client handshake claiming 4 GiB: refused at the length's last byte.
  Bytes big = frame(kClientHandshake, 1, 0);
  big[4] = big[5] = big[6] = big[7] = 0xff;
  std::tie(at, why) = refused_at(big);
  EXPECT_EQ(at, 7);
  EXPECT_NE(why.find("payload of 4294967295 bytes"), std::string::npos) << why;
  Bytes padded = frame(kClientHandshake, 1);
  padded[2] = 1;
  EXPECT_EQ(refused_at(padded).first, 2);
  EXPECT_EQ(refused_at(concat({frame(kClientHandshake, 1), frame(9, 2)})).first, 40);
  // After the handshake, the limit given.
  EXPECT_EQ(refused_at(concat({frame(kClientHandshake, 1), frame(kDirect, 2, 64)}), 63).first,
            40 + 7);
  EXPECT_EQ(refused_at(concat({frame(kClientHandshake, 1), frame(kDirect, 2, 64)}), 64).first, -1);
}

}  // namespace
}  // namespace troupe
