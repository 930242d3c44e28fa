#pragma once
// A TCP proxy that injects faults on the link between two processes: a node
// joins 127.0.0.1:<port()> instead of its coordinator, the proxy forwards
// every connection to the coordinator's real node port, and a chaos harness
// adds and removes faults while traffic flows.
//
// Byte-level faults (Delay, Bandwidth, Cut) work on any TCP stream. Frame
// faults (Drop, Duplicate, Reorder) work on whole frames of CAF 0.17's BASP
// protocol (the middleman's wire format), which the proxy parses (see
// BaspFrameTracker below). A plain class: thread-safe, one I/O thread of its
// own (Boost.Asio), no actors.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/rng.h"

namespace troupe {

// ToUpstream: client (node) -> upstream (coordinator); ToClient: the reverse.
enum class LinkDirection { ToUpstream, ToClient, Both };

const char* to_string(LinkDirection d);

struct LinkFault {
  enum class Kind { Delay, Drop, Duplicate, Reorder, Cut, Bandwidth };
  Kind kind = Kind::Delay;
  LinkDirection direction = LinkDirection::Both;
  // Delay: every chunk (or frame) is held this long before it is forwarded;
  // order is kept. Several Delay faults add up.
  double delay_s = 0;
  // Drop / Duplicate / Reorder: the chance per eligible frame. A frame that
  // several of them hit is dropped if any Drop hit it, else duplicated if
  // any Duplicate did, else held for reordering.
  double probability = 1;
  // Bandwidth: a token bucket at this rate (bursts of at most 1/20 s worth);
  // with several, the lowest rate applies.
  double bytes_per_s = 0;
  // Reorder: how long a held frame waits for the next eligible frame; past
  // that it is sent anyway (and not counted as reordered).
  double reorder_wait_s = 0.2;
  // Randomness is repeatable from the seed: each connection and direction
  // draws from its own generator seeded from (seed, direction), once per
  // eligible frame, so the same frames in the same order meet the same fate.
  uint64_t seed = 1;
  // Drop / Duplicate / Reorder: which BASP operations are eligible, one bit
  // per operation number. Handshakes (0, 1) and heartbeats (6) never are,
  // whatever the mask says: losing one of those kills or never establishes
  // the connection, which tests connection death, not a lossy link (use Cut
  // or reset_connections() for that). Default: direct_message (2) and
  // routed_message (3). Note that CAF sends direct_messages of its own too:
  // right after connecting, a node asks the other's "SpawnServ" for its info
  // (a named receiver, flags bit 0x01), and the reply comes back; a fault in
  // force then hits them like any other message.
  uint32_t frame_ops = (1u << 2) | (1u << 3);
};

// Counters per direction, monotonic.
struct LinkDirectionCounters {
  uint64_t bytes_forwarded = 0;    // written to the destination socket
  uint64_t frames_forwarded = 0;   // BASP frames passed on (a duplicated frame counts twice)
  uint64_t frames_dropped = 0;     // eligible frames dropped
  uint64_t frames_duplicated = 0;  // eligible frames sent twice
  uint64_t frames_reordered = 0;   // eligible frames sent after the next eligible frame
  uint64_t chunks_delayed = 0;     // chunks (pieces of the stream as read) held by a Delay
  uint64_t bytes_throttled = 0;    // bytes written through a Bandwidth token bucket
  // Bytes a Cut held back that the proxy could see: what sat in the source
  // socket's receive buffer (and the proxy's queue) when the cut ended. The
  // rest of what the sender wrote meanwhile is still in its own buffers.
  uint64_t bytes_held_while_cut = 0;
  uint64_t cut_us = 0;            // time a Cut was in force in this direction
  uint64_t streams_not_basp = 0;  // connections whose stream did not parse as BASP
  uint64_t streams_refused = 0;   // connections a guard reset (ToUpstream only)
};

struct LinkCounters {
  uint64_t connections = 0;        // accepted
  uint64_t connect_failures = 0;   // upstream refused or unreachable (client closed)
  uint64_t connections_reset = 0;  // closed by reset_connections()
  uint64_t open_connections = 0;   // now (the one counter that is not monotonic)
  LinkDirectionCounters to_upstream;
  LinkDirectionCounters to_client;
  // Both reads as ToUpstream.
  const LinkDirectionCounters& operator[](LinkDirection d) const {
    return d == LinkDirection::ToClient ? to_client : to_upstream;
  }
};

// --- BASP framing (CAF 0.17, caf/io/basp/header.hpp) -----------------------
//
// A frame is a 32-byte header and payload_len bytes of payload:
//   offset  0  operation       uint8   0 server_handshake, 1 client_handshake,
//                                      2 direct_message, 3 routed_message,
//                                      4 monitor_message, 5 down_message,
//                                      6 heartbeat
//   offset  1  padding         2 x uint8, always 0
//   offset  3  flags           uint8
//   offset  4  payload_len     uint32
//   offset  8  operation_data  uint64
//   offset 16  source_actor    uint64
//   offset 24  dest_actor      uint64
// Byte order: big-endian (network order). CAF's binary_serializer passes
// every integer through detail::to_network_order; checked empirically on
// this CAF build by serializing a caf::io::basp::header (see the test
// BaspWire.HeaderByteOrderMatchesCaf in tests/integration/test_link_proxy_caf.cpp).
// Nothing precedes the first frame: each side's first frame is its handshake.
namespace basp {

constexpr size_t kHeaderSize = 32;
constexpr uint8_t kMaxOperation = 6;
constexpr uint32_t kMaxPayload = 256u << 20;  // above this the stream is not BASP

struct Header {
  uint8_t operation = 0;
  uint8_t flags = 0;
  uint32_t payload_len = 0;
  uint64_t operation_data = 0;
  uint64_t source_actor = 0;
  uint64_t dest_actor = 0;
};

// Writes/reads the 32-byte header in CAF's wire format.
void write_header(const Header& h, uint8_t* out);
Header read_header(const uint8_t* in);
// A whole frame: the header (with payload_len set to payload.size()) and the payload.
std::vector<uint8_t> frame(Header h, const std::vector<uint8_t>& payload);
inline bool is_handshake(uint8_t op) {
  return op <= 1;
}
inline bool is_heartbeat(uint8_t op) {
  return op == 6;
}

// Checks what a client sends to a BASP acceptor (CAF's middleman port), frame
// by frame as the bytes arrive: CAF reads a frame's payload_len and
// allocates that much before anything else, so a stray or hostile stream
// (a length of 4 GiB in its ninth byte) stalls the whole process. A client's
// first frame is its handshake (client_handshake, small); every header has a
// known operation, zero padding and a payload within the limit. Pure: the
// node-port guard of LinkProxy runs one per connection.
class Intake {
 public:
  static constexpr uint32_t kMaxHandshakePayload = 1u << 20;

  explicit Intake(uint32_t max_payload = kMaxPayload) : max_payload_(max_payload) {}
  // False once the stream broke a rule (and from then on); then problem()
  // says which. A header that breaks one is refused as soon as the byte that
  // does arrives, so no byte of it past that reaches the acceptor, and
  // never the header whole.
  bool admit(const uint8_t* data, size_t n);
  const std::string& problem() const { return problem_; }

 private:
  bool check_header_prefix();
  uint32_t max_payload_;
  uint8_t hdr_[kHeaderSize] = {};
  size_t hdr_have_ = 0;
  uint64_t payload_left_ = 0;
  uint64_t frames_ = 0;
  std::string problem_;
};

}  // namespace basp

// What the proxy does with one frame. Pure (no sockets), so the frame logic
// is unit-tested on its own; the proxy runs one per connection and direction.
//
// Every byte of the stream goes through feed(). A frame that starts while no
// frame fault is active is passed on byte by byte as it arrives (only its
// boundaries are tracked); one that starts while a frame fault is active has
// its header held until complete, then is dropped (its bytes discarded as
// they come), duplicated or held for reordering (collected whole first), or
// passed on. Once the stream fails to parse (an unknown operation, nonzero
// padding, or payload_len above kMaxPayload) every later byte is passed on
// unchanged.
class BaspFrameTracker {
 public:
  struct FrameFault {  // an active Drop / Duplicate / Reorder, as the tracker sees it
    int id;
    LinkFault::Kind kind;
    double probability;
    uint64_t seed;
    uint32_t frame_ops;
    double reorder_wait_s = 0.2;
  };
  struct Stats {
    uint64_t frames_forwarded = 0, frames_dropped = 0, frames_duplicated = 0, frames_reordered = 0;
  };
  // emit: bytes to pass on, in order (may be called several times per feed).
  using Emit = std::function<void(const uint8_t* data, size_t n)>;

  // A frame larger than this is never collected for Duplicate/Reorder (it
  // passes untouched); Drop works at any size.
  static constexpr size_t kMaxCollected = 16u << 20;

  BaspFrameTracker(LinkDirection direction, Emit emit);

  // The frame faults for this direction, in id order; applies from the next frame.
  void set_faults(std::vector<FrameFault> faults);
  bool frame_faults_active() const { return !faults_.empty(); }

  // Passes `n` bytes read at time `now_s` (seconds, any origin) through.
  void feed(const uint8_t* data, size_t n, double now_s);
  // Sends a frame held for reordering if it has waited its reorder_wait_s (not
  // counted as reordered). Returns when to call again (nullopt: nothing held).
  std::optional<double> poll(double now_s);
  // End of stream: passes on whatever is held (a frame held for reordering,
  // a partial header or frame).
  void finish();

  bool parses() const { return state_ != State::Raw; }
  // True once, right after the stream stopped parsing.
  bool take_parse_failure() {
    bool f = parse_failed_now_;
    parse_failed_now_ = false;
    return f;
  }
  // Bytes held here (partial header, a frame being collected, a frame held for reordering).
  size_t held_bytes() const {
    return (holding_header_ ? hdr_have_ : 0) + collect_.size() + reorder_held_.size();
  }
  const Stats& stats() const { return stats_; }

 private:
  enum class State { Header, Payload, Raw };
  enum class Action { Stream, Drop, Duplicate, Reorder };

  void header_complete();
  void frame_complete();
  void go_raw();
  bool at_boundary() const;
  void flush_reorder_held();
  void emit_frame(const std::vector<uint8_t>& f) { emit_(f.data(), f.size()); }
  bool header_prefix_valid() const;
  Xoshiro256& rng_for(const FrameFault& f);

  LinkDirection direction_;
  Emit emit_;
  std::vector<FrameFault> faults_;
  std::vector<std::pair<int, Xoshiro256>> rngs_;  // by fault id
  State state_ = State::Header;
  uint8_t hdr_[basp::kHeaderSize];
  size_t hdr_have_ = 0;
  bool holding_header_ = false;  // this frame started while a frame fault was active
  uint64_t payload_left_ = 0;
  Action action_ = Action::Stream;
  bool cur_partner_ = false;      // the current frame goes ahead of the one held for reordering
  std::vector<uint8_t> collect_;  // the frame being collected (Duplicate/Reorder)
  std::vector<uint8_t> reorder_held_;  // a frame waiting for the next eligible one
  double reorder_since_ = 0;
  double reorder_wait_ = 0;      // of the frame held
  double cur_reorder_wait_ = 0;  // of the frame being collected for reordering
  double now_ = 0;
  bool parse_failed_now_ = false;
  Stats stats_;
};

class LinkProxy {
 public:
  // Bytes held per connection and direction (queued for the destination, or
  // held by the frame tracker) before the proxy stops reading the source:
  // beyond it the sender feels backpressure, as from a slow link.
  static constexpr size_t kMaxHeldBytes = 64u << 20;

  // Listens on listen_host:listen_port (0: any free port) and forwards each
  // accepted connection to upstream (connecting when the client arrives).
  // Throws std::runtime_error naming the address when it cannot listen.
  // With `guard`, each client's stream passes a basp::Intake and a
  // connection that breaks its rules is reset (logged with the client's
  // address): the proxy then stands in front of a BASP acceptor as its
  // public port.
  LinkProxy(std::string upstream_host, uint16_t upstream_port,
            std::string listen_host = "127.0.0.1", uint16_t listen_port = 0, bool guard = false);
  ~LinkProxy();  // closes everything, joins its thread
  LinkProxy(const LinkProxy&) = delete;
  LinkProxy& operator=(const LinkProxy&) = delete;

  uint16_t port() const;

  // Faults apply to current and future connections, in force when add()
  // returns; several may be active at once. Throws std::invalid_argument on
  // a probability outside [0, 1], a negative delay or a Bandwidth without a
  // positive rate.
  int add(const LinkFault& f);
  void remove(int id);  // unknown ids are ignored
  void clear();
  // Closes every current connection both ways with a TCP reset (RST); both
  // ends see the connection fail. New connections are accepted as before.
  void reset_connections();
  LinkCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
