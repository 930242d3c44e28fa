// The link proxy's BASP frame tracker (net/link_proxy.h), which parses every
// byte that crosses a proxied link between two Troupe processes. Input: a
// 10-byte fault header (byte 0: bit 0 Drop, bit 1 Duplicate, bit 2 Reorder,
// bit 3 clear the faults halfway, bit 4 direction; then per fault a
// probability byte, a frame_ops byte and a reorder-wait byte), a byte that
// seeds how the stream is cut into reads, then the stream itself.
// Oracles, against a reference parse of the stream (32-byte headers:
// operation <= 6, zero padding, payload_len <= kMaxPayload):
//  - with no frame fault the output is the input, byte for byte;
//  - otherwise every whole frame out is a whole frame in, at most twice
//    (Duplicate) as often as it came in, and no more frames than came in
//    plus those duplicated; a stream ending at a frame boundary loses only
//    the frames dropped;
//  - what follows the first header that does not parse is passed on
//    unchanged, after everything before it; a frame cut short by the end of
//    the stream is passed on as it came, or dropped (Drop);
//  - the tracker never holds more than a collected frame, a frame held for
//    reordering and a header; poll() never asks to be called in the past.
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "net/link_proxy.h"

namespace troupe::fuzz {
namespace {

using Bytes = std::vector<uint8_t>;

struct Parsed {
  std::vector<Bytes> frames;  // whole frames, in order
  size_t tail = 0;            // offset of what follows them
  bool invalid = false;       // the tail starts with a header that does not parse
};

bool prefix_valid(const uint8_t* h, size_t have) {
  if (have >= 1 && h[0] > basp::kMaxOperation) return false;
  if (have >= 2 && h[1] != 0) return false;
  if (have >= 3 && h[2] != 0) return false;
  if (have >= 8) {
    const uint32_t len = uint32_t(h[4]) << 24 | uint32_t(h[5]) << 16 | uint32_t(h[6]) << 8 | h[7];
    if (len > basp::kMaxPayload) return false;
  }
  return true;
}

Parsed parse(const Bytes& s) {
  Parsed p;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t have = std::min(s.size() - pos, basp::kHeaderSize);
    if (!prefix_valid(s.data() + pos, have)) {
      p.invalid = true;
      break;
    }
    if (have < basp::kHeaderSize) break;
    const size_t len = basp::read_header(s.data() + pos).payload_len;
    if (s.size() - pos - basp::kHeaderSize < len) break;
    p.frames.emplace_back(s.begin() + long(pos), s.begin() + long(pos + basp::kHeaderSize + len));
    pos += basp::kHeaderSize + len;
  }
  p.tail = pos;
  return p;
}

bool ends_with(const Bytes& s, const uint8_t* suffix, size_t n) {
  return s.size() >= n && std::memcmp(s.data() + s.size() - n, suffix, n) == 0;
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  constexpr size_t kHeader = 10;
  if (size < kHeader + 1) return 0;
  const uint8_t flags = data[0];
  std::vector<BaspFrameTracker::FrameFault> faults;
  const LinkFault::Kind kinds[] = {LinkFault::Kind::Drop, LinkFault::Kind::Duplicate,
                                   LinkFault::Kind::Reorder};
  for (int k = 0; k < 3; ++k) {
    if (!(flags & (1u << k))) continue;
    const uint8_t* f = data + 1 + 3 * k;
    faults.push_back({k + 1, kinds[k], f[0] / 255.0, uint64_t(flags) * 31 + uint64_t(k),
                      uint32_t(f[1] & 0x7f), f[2] / 100.0});
  }
  const bool clear_halfway = flags & 8;
  const LinkDirection direction = flags & 16 ? LinkDirection::ToClient : LinkDirection::ToUpstream;
  uint32_t cut = data[kHeader] | 1u;
  const Bytes in(data + kHeader + 1, data + size);

  Bytes out;
  BaspFrameTracker tracker(direction,
                           [&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
  tracker.set_faults(faults);
  const size_t bound = 2 * BaspFrameTracker::kMaxCollected + basp::kHeaderSize;
  double now = 0;
  bool cleared = false;
  for (size_t pos = 0; pos < in.size();) {
    cut = cut * 1103515245u + 12345u;
    const size_t n = std::min<size_t>(in.size() - pos, 1 + (cut >> 16) % 97);
    if (clear_halfway && !cleared && pos >= in.size() / 2) {
      tracker.set_faults({});
      cleared = true;
    }
    tracker.feed(in.data() + pos, n, now);
    pos += n;
    if (tracker.held_bytes() > bound)
      violated("the tracker holds " + std::to_string(tracker.held_bytes()));
    now += 0.01 * double((cut >> 8) % 8);
    if (const auto due = tracker.poll(now); due && *due < now)
      violated("poll() asks to be called in the past");
  }
  tracker.finish();

  if (faults.empty()) {
    if (out != in) violated("without frame faults the output differs from the input");
    return 0;
  }
  const Parsed pin = parse(in), pout = parse(out);
  const auto& st = tracker.stats();
  std::map<Bytes, int> count_in, count_out;
  for (const Bytes& f : pin.frames) ++count_in[f];
  for (const Bytes& f : pout.frames) ++count_out[f];
  for (const auto& [f, c] : count_out) {
    const auto it = count_in.find(f);
    if (it == count_in.end()) violated("a frame out that never came in");
    if (c > 2 * it->second) violated("a frame out more than twice as often as it came in");
  }
  if (pout.frames.size() > pin.frames.size() + st.frames_duplicated)
    violated("more frames out than came in and were duplicated");
  if (pin.tail == in.size() && pout.frames.size() + st.frames_dropped < pin.frames.size())
    violated("frames lost that were not dropped");
  const size_t tail = in.size() - pin.tail;
  if (pin.invalid) {
    if (!ends_with(out, in.data() + pin.tail, tail))
      violated("what follows a header that does not parse was not passed on unchanged");
    if (tracker.parses()) violated("the tracker still parses past a header that does not");
  } else if (tail > 0 && !ends_with(out, in.data() + pin.tail, tail) && st.frames_dropped == 0) {
    violated("a frame cut short by the end of the stream was neither passed on nor dropped");
  }
  return 0;
}
