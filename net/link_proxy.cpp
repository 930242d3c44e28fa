#include "net/link_proxy.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

namespace troupe {

const char* to_string(LinkDirection d) {
  switch (d) {
    case LinkDirection::ToUpstream:
      return "to_upstream";
    case LinkDirection::ToClient:
      return "to_client";
    case LinkDirection::Both:
      return "both";
  }
  return "?";
}

// ---- BASP framing ----------------------------------------------------------

namespace basp {
namespace {

void put_be(uint8_t* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out[i] = uint8_t(v & 0xff);
    v >>= 8;
  }
}

uint64_t get_be(const uint8_t* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | in[i];
  return v;
}

}  // namespace

void write_header(const Header& h, uint8_t* out) {
  out[0] = h.operation;
  out[1] = 0;
  out[2] = 0;
  out[3] = h.flags;
  put_be(out + 4, h.payload_len, 4);
  put_be(out + 8, h.operation_data, 8);
  put_be(out + 16, h.source_actor, 8);
  put_be(out + 24, h.dest_actor, 8);
}

bool Intake::check_header_prefix() {
  const auto refuse = [&](std::string what) {
    problem_ = "frame " + std::to_string(frames_ + 1) + ": " + std::move(what);
    return false;
  };
  if (hdr_have_ >= 1 && hdr_[0] > kMaxOperation)
    return refuse("operation " + std::to_string(hdr_[0]) + " is not BASP's");
  if (hdr_have_ >= 1 && frames_ == 0 && hdr_[0] != 1)
    return refuse("operation " + std::to_string(hdr_[0]) + " where a client's handshake starts");
  if ((hdr_have_ >= 2 && hdr_[1] != 0) || (hdr_have_ >= 3 && hdr_[2] != 0))
    return refuse("nonzero padding");
  if (hdr_have_ >= 8) {
    const uint32_t len = read_header(hdr_).payload_len;
    const uint32_t most =
        frames_ == 0 ? std::min(max_payload_, kMaxHandshakePayload) : max_payload_;
    if (len > most)
      return refuse("a payload of " + std::to_string(len) + " bytes, over the " +
                    std::to_string(most) + " allowed");
  }
  return true;
}

bool Intake::admit(const uint8_t* data, size_t n) {
  if (!problem_.empty()) return false;
  while (n > 0) {
    if (payload_left_ > 0) {
      const size_t take = size_t(std::min<uint64_t>(n, payload_left_));
      payload_left_ -= take;
      data += take;
      n -= take;
      if (payload_left_ == 0) ++frames_;
      continue;
    }
    // Byte by byte through the first eight: the one that breaks a rule is
    // refused before anything after it is looked at.
    const size_t take = std::min(n, hdr_have_ < 8 ? size_t(1) : kHeaderSize - hdr_have_);
    std::memcpy(hdr_ + hdr_have_, data, take);
    hdr_have_ += take;
    data += take;
    n -= take;
    if (!check_header_prefix()) return false;
    if (hdr_have_ == kHeaderSize) {
      payload_left_ = read_header(hdr_).payload_len;
      hdr_have_ = 0;
      if (payload_left_ == 0) ++frames_;
    }
  }
  return true;
}

Header read_header(const uint8_t* in) {
  Header h;
  h.operation = in[0];
  h.flags = in[3];
  h.payload_len = uint32_t(get_be(in + 4, 4));
  h.operation_data = get_be(in + 8, 8);
  h.source_actor = get_be(in + 16, 8);
  h.dest_actor = get_be(in + 24, 8);
  return h;
}

std::vector<uint8_t> frame(Header h, const std::vector<uint8_t>& payload) {
  h.payload_len = uint32_t(payload.size());
  std::vector<uint8_t> out(kHeaderSize + payload.size());
  write_header(h, out.data());
  std::copy(payload.begin(), payload.end(), out.begin() + kHeaderSize);
  return out;
}

}  // namespace basp

// ---- BaspFrameTracker ------------------------------------------------------

BaspFrameTracker::BaspFrameTracker(LinkDirection direction, Emit emit)
    : direction_(direction), emit_(std::move(emit)) {}

void BaspFrameTracker::set_faults(std::vector<FrameFault> faults) {
  faults_ = std::move(faults);
  std::erase_if(rngs_, [&](const auto& r) {
    return std::none_of(faults_.begin(), faults_.end(),
                        [&](const FrameFault& f) { return f.id == r.first; });
  });
  // Without a Reorder fault nothing stays held; it goes out at the next boundary.
  const bool reorder = std::any_of(faults_.begin(), faults_.end(), [](const FrameFault& f) {
    return f.kind == LinkFault::Kind::Reorder;
  });
  if (!reorder && !reorder_held_.empty() && at_boundary()) flush_reorder_held();
}

Xoshiro256& BaspFrameTracker::rng_for(const FrameFault& f) {
  for (auto& [id, rng] : rngs_)
    if (id == f.id) return rng;
  // Each direction its own sequence from the same seed.
  const uint64_t salt = direction_ == LinkDirection::ToClient ? 0x9e3779b97f4a7c15ull : 0;
  rngs_.emplace_back(f.id, Xoshiro256(f.seed ^ salt));
  return rngs_.back().second;
}

bool BaspFrameTracker::header_prefix_valid() const {
  if (hdr_have_ >= 1 && hdr_[0] > basp::kMaxOperation) return false;
  if (hdr_have_ >= 2 && hdr_[1] != 0) return false;
  if (hdr_have_ >= 3 && hdr_[2] != 0) return false;
  if (hdr_have_ >= 8 && basp::read_header(hdr_).payload_len > basp::kMaxPayload) return false;
  return true;
}

bool BaspFrameTracker::at_boundary() const {
  // No byte of the current frame has been passed on yet.
  if (state_ == State::Header) return hdr_have_ == 0 || holding_header_;
  if (state_ == State::Payload) return action_ != Action::Stream;
  return true;
}

void BaspFrameTracker::flush_reorder_held() {
  if (reorder_held_.empty()) return;
  std::vector<uint8_t> f = std::move(reorder_held_);
  reorder_held_.clear();
  emit_frame(f);
  ++stats_.frames_forwarded;
}

void BaspFrameTracker::go_raw() {
  state_ = State::Raw;
  parse_failed_now_ = true;
  // Everything held came before the bytes that failed to parse.
  flush_reorder_held();
  if (holding_header_ && hdr_have_ > 0) emit_(hdr_, hdr_have_);
  hdr_have_ = 0;
  holding_header_ = false;
  if (!collect_.empty()) {  // cannot happen at a header, kept for safety
    emit_(collect_.data(), collect_.size());
    collect_.clear();
  }
}

void BaspFrameTracker::feed(const uint8_t* data, size_t n, double now_s) {
  now_ = now_s;
  while (n > 0) {
    switch (state_) {
      case State::Raw:
        emit_(data, n);
        return;
      case State::Header: {
        if (hdr_have_ == 0) {  // a frame starts
          const bool reorder = std::any_of(faults_.begin(), faults_.end(), [](const auto& f) {
            return f.kind == LinkFault::Kind::Reorder;
          });
          if (!reorder_held_.empty() && (!reorder || now_ - reorder_since_ >= reorder_wait_))
            flush_reorder_held();
          holding_header_ = !faults_.empty();
        }
        const size_t take = std::min(n, basp::kHeaderSize - hdr_have_);
        std::memcpy(hdr_ + hdr_have_, data, take);
        hdr_have_ += take;
        if (!header_prefix_valid()) {
          const bool held = holding_header_;
          go_raw();                      // emits the held header bytes, if held
          if (!held) emit_(data, take);  // else they were part of hdr_
          data += take;
          n -= take;
          continue;
        }
        if (!holding_header_) emit_(data, take);
        data += take;
        n -= take;
        if (hdr_have_ == basp::kHeaderSize) header_complete();
        break;
      }
      case State::Payload: {
        const size_t take = size_t(std::min<uint64_t>(n, payload_left_));
        switch (action_) {
          case Action::Stream:
            emit_(data, take);
            break;
          case Action::Drop:
            break;
          case Action::Duplicate:
          case Action::Reorder:
            collect_.insert(collect_.end(), data, data + take);
            break;
        }
        payload_left_ -= take;
        data += take;
        n -= take;
        if (payload_left_ == 0) frame_complete();
        break;
      }
    }
  }
}

void BaspFrameTracker::header_complete() {
  const basp::Header h = basp::read_header(hdr_);
  payload_left_ = h.payload_len;
  state_ = State::Payload;
  cur_partner_ = false;
  action_ = Action::Stream;
  if (holding_header_) {
    const bool never =
        basp::is_handshake(h.operation) || basp::is_heartbeat(h.operation) || h.operation >= 32;
    bool drop = false, dup = false, reorder = false, eligible = false;
    if (!never) {
      for (const auto& f : faults_) {
        if ((f.frame_ops & (1u << h.operation)) == 0) continue;
        eligible = true;
        // One draw per fault and eligible frame, whatever the others decide,
        // so that each fault's pattern depends only on its seed.
        const bool hit = rng_for(f).uniform01() < f.probability;
        if (!hit) continue;
        if (f.kind == LinkFault::Kind::Drop) drop = true;
        if (f.kind == LinkFault::Kind::Duplicate) dup = true;
        if (f.kind == LinkFault::Kind::Reorder) {
          cur_reorder_wait_ =
              reorder ? std::max(cur_reorder_wait_, f.reorder_wait_s) : f.reorder_wait_s;
          reorder = true;
        }
      }
    }
    const size_t frame_size = basp::kHeaderSize + size_t(h.payload_len);
    const bool collectable = frame_size <= kMaxCollected;
    if (drop) {
      action_ = Action::Drop;
      ++stats_.frames_dropped;
    } else {
      // An eligible frame after one held for reordering goes ahead of it.
      if (eligible && !reorder_held_.empty()) {
        cur_partner_ = true;
        reorder = false;
      }
      if (dup && collectable) {
        action_ = Action::Duplicate;
      } else if (reorder && collectable) {
        action_ = Action::Reorder;
      }
    }
    if (action_ == Action::Stream) {
      emit_(hdr_, basp::kHeaderSize);
      ++stats_.frames_forwarded;
    } else if (action_ != Action::Drop) {
      collect_.reserve(frame_size);
      collect_.assign(hdr_, hdr_ + basp::kHeaderSize);
    }
  } else {
    ++stats_.frames_forwarded;  // already passed on as it came
  }
  hdr_have_ = 0;
  holding_header_ = false;
  if (payload_left_ == 0) frame_complete();
}

void BaspFrameTracker::frame_complete() {
  switch (action_) {
    case Action::Stream:
    case Action::Drop:
      break;
    case Action::Duplicate:
      emit_frame(collect_);
      emit_frame(collect_);
      stats_.frames_forwarded += 2;
      ++stats_.frames_duplicated;
      collect_.clear();
      break;
    case Action::Reorder:
      reorder_held_ = std::move(collect_);
      collect_.clear();
      reorder_since_ = now_;
      reorder_wait_ = cur_reorder_wait_;
      break;
  }
  if (cur_partner_ && !reorder_held_.empty()) {
    flush_reorder_held();
    ++stats_.frames_reordered;
  }
  cur_partner_ = false;
  action_ = Action::Stream;
  state_ = State::Header;
}

std::optional<double> BaspFrameTracker::poll(double now_s) {
  if (reorder_held_.empty()) return std::nullopt;
  const double due = reorder_since_ + reorder_wait_;
  if (now_s < due) return due;
  if (at_boundary()) {
    flush_reorder_held();  // no partner came: sent anyway, not counted as reordered
    return std::nullopt;
  }
  return now_s + 0.02;  // mid-frame: once the frame in flight is through
}

void BaspFrameTracker::finish() {
  if (state_ == State::Raw) return;
  if (!at_boundary()) return;  // a frame cut short: what follows would not parse anyway
  flush_reorder_held();
  if (holding_header_ && hdr_have_ > 0) emit_(hdr_, hdr_have_);
  hdr_have_ = 0;
  holding_header_ = false;
  if (!collect_.empty()) emit_(collect_.data(), collect_.size());
  collect_.clear();
}

// ---- LinkProxy -------------------------------------------------------------

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kReadSize = 64 * 1024;
constexpr size_t kMaxWrite = 256 * 1024;

int dir_index(LinkDirection d) {
  return d == LinkDirection::ToClient ? 1 : 0;
}

Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The faults in force in one direction, as the I/O thread sees them.
struct DirectionFaults {
  double delay_s = 0;
  double bytes_per_s = 0;  // 0: unlimited
  bool cut = false;
  std::vector<BaspFrameTracker::FrameFault> frame;
};

struct AtomicCounters {
  std::atomic<uint64_t> bytes_forwarded{0}, frames_forwarded{0}, frames_dropped{0},
      frames_duplicated{0}, frames_reordered{0}, chunks_delayed{0}, bytes_throttled{0},
      bytes_held_while_cut{0}, streams_not_basp{0}, streams_refused{0};
};

}  // namespace

struct LinkProxy::Impl {
  struct Connection;

  Impl(std::string up_host, uint16_t up_port, bool guard_intake)
      : upstream_host(std::move(up_host)), upstream_port(up_port), guard(guard_intake) {}

  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work{ioc.get_executor()};
  tcp::acceptor acceptor{ioc};
  std::string upstream_host;
  uint16_t upstream_port;
  bool guard;
  uint16_t port = 0;
  std::thread thread;
  const Clock::time_point t0 = Clock::now();

  // Faults as added (under mu), and how long each direction has been cut.
  mutable std::mutex mu;
  std::map<int, LinkFault> faults;
  int next_id = 1;
  std::array<bool, 2> cut_now{false, false};
  std::array<Clock::time_point, 2> cut_since{};
  std::array<uint64_t, 2> cut_us{0, 0};

  // I/O thread only.
  std::array<DirectionFaults, 2> view;
  std::set<std::shared_ptr<Connection>> conns;
  uint64_t next_conn_id = 1;
  bool stopping = false;

  std::array<AtomicCounters, 2> dir_counters;
  std::atomic<uint64_t> connections{0}, connect_failures{0}, connections_reset{0},
      open_connections{0};

  double now_s() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  void start_accept();
  std::array<DirectionFaults, 2> compute_view_locked();
  void update_cut_time_locked();
  void apply(const std::array<DirectionFaults, 2>& v);
  // Runs fn on the I/O thread and waits for it. Called with mu held, so that
  // views are applied in the order they were computed.
  std::future<void> post_locked(std::function<void()> fn);
  void change(const std::function<void()>& edit);
};

// One accepted connection: the client's socket, the upstream socket, and a
// pipe for each direction.
struct LinkProxy::Impl::Connection : std::enable_shared_from_this<Connection> {
  struct Chunk {
    std::vector<uint8_t> data;
    size_t off = 0;
    Clock::time_point ready;
  };

  struct Pipe {
    Pipe(Connection& c, int d, tcp::socket& s, tcp::socket& t)
        : conn(c),
          dir(d),
          src(s),
          dst(t),
          tracker(d == 1 ? LinkDirection::ToClient : LinkDirection::ToUpstream,
                  [this](const uint8_t* p, size_t n) { enqueue(p, n); }),
          write_timer(c.impl.ioc),
          reorder_timer(c.impl.ioc) {}

    Connection& conn;
    int dir;
    tcp::socket& src;
    tcp::socket& dst;
    BaspFrameTracker tracker;
    basp::Intake intake;  // with a guard, of the client's stream
    std::deque<Chunk> queue;
    size_t queued_bytes = 0;
    BaspFrameTracker::Stats reported;  // tracker stats already added to the counters
    bool waiting_read = false;
    bool src_eof = false;
    bool dst_shut = false;
    bool writing = false;
    bool logged_not_basp = false;
    asio::steady_timer write_timer;
    bool write_timer_armed = false;
    Clock::time_point write_timer_at;
    asio::steady_timer reorder_timer;
    bool reorder_timer_armed = false;
    double tokens = 0;
    double rate = 0;
    Clock::time_point refilled;

    const DirectionFaults& faults() const { return conn.impl.view[size_t(dir)]; }
    AtomicCounters& counters() const { return conn.impl.dir_counters[size_t(dir)]; }
    size_t held() const { return queued_bytes + tracker.held_bytes(); }
    static double burst(double rate) { return std::clamp(rate / 20, 1.0, 65536.0); }

    void enqueue(const uint8_t* p, size_t n) {
      if (n == 0) return;
      // Nothing queued or in flight and no fault in force (the node port's
      // guard, a proxy between faults): written at once (the socket is
      // non-blocking), saving a turn of the I/O loop per chunk; what the
      // socket does not take yet is queued. With faults, the queue's path
      // keeps the counters ahead of the bytes they count.
      if (queue.empty() && !writing && conn.connected && !conn.closed && faults().delay_s <= 0 &&
          rate <= 0 && !faults().cut && !tracker.frame_faults_active()) {
        boost::system::error_code ec;
        const size_t done = dst.write_some(asio::buffer(p, n), ec);
        if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
          conn.close(false);
          return;
        }
        if (!ec) {
          counters().bytes_forwarded.fetch_add(done, std::memory_order_relaxed);
          p += done;
          n -= done;
          if (n == 0) return;
        }
      }
      Chunk c;
      c.data.assign(p, p + n);
      const double d = faults().delay_s;
      c.ready = Clock::now() + to_duration(d);
      if (d > 0) counters().chunks_delayed.fetch_add(1, std::memory_order_relaxed);
      queued_bytes += n;
      queue.push_back(std::move(c));
    }

    void report_tracker() {
      const auto& s = tracker.stats();
      auto& c = counters();
      c.frames_forwarded.fetch_add(s.frames_forwarded - reported.frames_forwarded);
      c.frames_dropped.fetch_add(s.frames_dropped - reported.frames_dropped);
      c.frames_duplicated.fetch_add(s.frames_duplicated - reported.frames_duplicated);
      c.frames_reordered.fetch_add(s.frames_reordered - reported.frames_reordered);
      reported = s;
      if (tracker.take_parse_failure()) {
        c.streams_not_basp.fetch_add(1);
        if (tracker.frame_faults_active()) {
          log_not_basp();
        } else {
          spdlog::debug("link proxy: connection {} {}: the stream is not BASP; passing it on",
                        conn.id, to_string(tracker_direction()));
        }
      }
      if (!tracker.parses() && tracker.frame_faults_active() && !logged_not_basp) log_not_basp();
    }

    LinkDirection tracker_direction() const {
      return dir == 1 ? LinkDirection::ToClient : LinkDirection::ToUpstream;
    }

    void log_not_basp() {
      logged_not_basp = true;
      spdlog::warn(
          "link proxy: connection {} {}: the stream does not parse as BASP; frame faults "
          "(drop, duplicate, reorder) do not apply to it, its bytes pass on unchanged",
          conn.id, to_string(tracker_direction()));
    }

    void arm_read() {
      if (conn.closed || src_eof || waiting_read || !conn.connected) return;
      if (faults().cut || held() >= kMaxHeldBytes) return;  // resumed by apply() / a write
      waiting_read = true;
      src.async_wait(tcp::socket::wait_read,
                     [self = conn.shared_from_this(), this](const boost::system::error_code& ec) {
                       waiting_read = false;
                       if (conn.closed) return;
                       if (ec) return conn.close(false);
                       read_some();
                     });
    }

    void read_some() {
      if (faults().cut || held() >= kMaxHeldBytes) return;
      std::array<uint8_t, kReadSize> buf;  // NOLINT: filled by read_some
      boost::system::error_code ec;
      const size_t n = src.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) return arm_read();
      if (ec == asio::error::eof) {
        src_eof = true;
        tracker.finish();
        report_tracker();
        reorder_timer.cancel();
        kick_write();
        return;
      }
      if (ec) return conn.close(false);
      if (dir == 0 && conn.impl.guard && !intake.admit(buf.data(), n)) return conn.refuse(intake);
      tracker.feed(buf.data(), n, conn.impl.now_s());
      report_tracker();
      schedule_reorder_poll();
      kick_write();
      arm_read();
    }

    void schedule_reorder_poll() {
      auto due = tracker.poll(conn.impl.now_s());
      report_tracker();
      if (!due || reorder_timer_armed) return;
      reorder_timer_armed = true;
      reorder_timer.expires_at(conn.impl.t0 + to_duration(*due));
      reorder_timer.async_wait(
          [self = conn.shared_from_this(), this](const boost::system::error_code& ec) {
            reorder_timer_armed = false;
            if (ec || conn.closed || src_eof) return;
            schedule_reorder_poll();
            kick_write();
            arm_read();
          });
    }

    void arm_write_timer(Clock::time_point at) {
      if (write_timer_armed && write_timer_at <= at) return;
      write_timer_armed = true;
      write_timer_at = at;
      write_timer.expires_at(at);
      write_timer.async_wait(
          [self = conn.shared_from_this(), this, at](const boost::system::error_code& ec) {
            if (ec == asio::error::operation_aborted || conn.closed) return;
            if (write_timer_at == at) write_timer_armed = false;
            kick_write();
          });
    }

    void set_rate(double r) {
      if (r > 0 && rate <= 0) {
        tokens = burst(r);
        refilled = Clock::now();
      }
      rate = r;
      if (rate > 0) tokens = std::min(tokens, burst(rate));
    }

    void kick_write() {
      if (conn.closed || writing || faults().cut) return;
      if (queue.empty()) {
        if (src_eof && !dst_shut) {
          dst_shut = true;
          boost::system::error_code ec;
          dst.shutdown(tcp::socket::shutdown_send, ec);
          conn.maybe_done();
        }
        return;
      }
      Chunk& c = queue.front();
      const auto now = Clock::now();
      if (c.ready > now) return arm_write_timer(c.ready);
      size_t piece = std::min(c.data.size() - c.off, kMaxWrite);
      const bool throttled = rate > 0;
      if (throttled) {
        tokens = std::min(burst(rate),
                          tokens + std::chrono::duration<double>(now - refilled).count() * rate);
        refilled = now;
        piece = std::min(piece, std::max<size_t>(1, size_t(burst(rate))));
        if (tokens < double(piece))
          return arm_write_timer(now + to_duration((double(piece) - tokens) / rate));
        tokens -= double(piece);
      }
      writing = true;
      asio::async_write(dst, asio::buffer(c.data.data() + c.off, piece),
                        [self = conn.shared_from_this(), this, throttled](
                            const boost::system::error_code& ec, size_t n) {
                          writing = false;
                          if (conn.closed) return;
                          if (ec) return conn.close(false);
                          counters().bytes_forwarded.fetch_add(n, std::memory_order_relaxed);
                          if (throttled)
                            counters().bytes_throttled.fetch_add(n, std::memory_order_relaxed);
                          Chunk& front = queue.front();
                          front.off += n;
                          queued_bytes -= n;
                          if (front.off == front.data.size()) queue.pop_front();
                          kick_write();
                          arm_read();
                        });
    }

    void cut_ended() {
      boost::system::error_code ec;
      const size_t waiting = src.available(ec);
      counters().bytes_held_while_cut.fetch_add((ec ? 0 : waiting) + queued_bytes);
    }

    void close() {
      write_timer.cancel();
      reorder_timer.cancel();
      queue.clear();
      queued_bytes = 0;
    }
  };

  Connection(Impl& i, tcp::socket s, uint64_t connection_id)
      : impl(i),
        id(connection_id),
        client(std::move(s)),
        upstream(i.ioc),
        resolver(i.ioc),
        to_upstream(*this, 0, client, upstream),
        to_client(*this, 1, upstream, client) {}

  Impl& impl;
  uint64_t id;
  tcp::socket client;
  tcp::socket upstream;
  tcp::resolver resolver;
  Pipe to_upstream;                                      // client -> upstream
  Pipe to_client;                                        // upstream -> client
  std::array<Pipe*, 2> pipes{&to_upstream, &to_client};  // by direction index
  bool connected = false;
  bool closed = false;

  void start() {
    resolver.async_resolve(
        impl.upstream_host, std::to_string(impl.upstream_port),
        [self = shared_from_this()](const boost::system::error_code& ec,
                                    tcp::resolver::results_type results) {
          if (self->closed) return;
          if (ec) return self->connect_failed(ec);
          asio::async_connect(self->upstream, results,
                              [self](const boost::system::error_code& ec2, const tcp::endpoint&) {
                                if (self->closed) return;
                                if (ec2) return self->connect_failed(ec2);
                                self->on_connected();
                              });
        });
  }

  void connect_failed(const boost::system::error_code& ec) {
    impl.connect_failures.fetch_add(1);
    spdlog::warn("link proxy: cannot connect to upstream {}:{}: {}", impl.upstream_host,
                 impl.upstream_port, ec.message());
    close(false);
  }

  void on_connected() {
    boost::system::error_code ec;
    for (tcp::socket* s : {&client, &upstream}) {
      s->set_option(tcp::no_delay(true), ec);
      s->non_blocking(true, ec);
    }
    connected = true;
    for (size_t d = 0; d < 2; ++d) {
      pipes[d]->tracker.set_faults(impl.view[d].frame);
      pipes[d]->set_rate(impl.view[d].bytes_per_s);
      pipes[d]->arm_read();
    }
  }

  void refresh(const std::array<DirectionFaults, 2>& old) {
    if (closed) return;
    for (size_t d = 0; d < 2; ++d) {
      Pipe& p = *pipes[d];
      p.tracker.set_faults(impl.view[d].frame);
      p.report_tracker();
      p.set_rate(impl.view[d].bytes_per_s);
      if (old[d].cut && !impl.view[d].cut && connected) p.cut_ended();
      if (!connected) continue;
      p.schedule_reorder_poll();
      p.kick_write();
      p.arm_read();
    }
  }

  void maybe_done() {
    if (to_upstream.dst_shut && to_client.dst_shut) close(false);
  }

  // What the guard's intake refused: the client is reset, the acceptor sees
  // its connection end (with a header at most partly sent).
  void refuse(const basp::Intake& intake) {
    boost::system::error_code ec;
    const auto peer = client.remote_endpoint(ec);
    spdlog::warn("node port: connection from {} reset: {} (not a node speaking CAF's BASP)",
                 ec ? std::string("an unknown address") : peer.address().to_string(),
                 intake.problem());
    impl.dir_counters[0].streams_refused.fetch_add(1);
    close(true);
  }

  // rst: abort with a TCP reset (SO_LINGER 0) rather than a FIN.
  void close(bool rst) {
    if (closed) return;
    closed = true;
    boost::system::error_code ec;
    resolver.cancel();
    for (Pipe* p : pipes) p->close();
    for (tcp::socket* s : {&client, &upstream}) {
      if (!s->is_open()) continue;
      if (rst) s->set_option(asio::socket_base::linger(true, 0), ec);
      s->close(ec);
    }
    impl.open_connections.fetch_sub(1);
    // Last: may drop the set's reference to this object (handlers hold others).
    impl.conns.erase(shared_from_this());
  }
};

void LinkProxy::Impl::start_accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
    if (stopping || !acceptor.is_open()) return;
    if (!ec) {
      connections.fetch_add(1);
      open_connections.fetch_add(1);
      auto c = std::make_shared<Connection>(*this, std::move(s), next_conn_id++);
      conns.insert(c);
      c->start();
    } else {
      spdlog::warn("link proxy: accept failed: {}", ec.message());
    }
    start_accept();
  });
}

std::array<DirectionFaults, 2> LinkProxy::Impl::compute_view_locked() {
  std::array<DirectionFaults, 2> v;
  for (const auto& [id, f] : faults) {
    for (int d = 0; d < 2; ++d) {
      if (f.direction != LinkDirection::Both && dir_index(f.direction) != d) continue;
      DirectionFaults& x = v[size_t(d)];
      switch (f.kind) {
        case LinkFault::Kind::Delay:
          x.delay_s += f.delay_s;
          break;
        case LinkFault::Kind::Bandwidth:
          x.bytes_per_s =
              x.bytes_per_s > 0 ? std::min(x.bytes_per_s, f.bytes_per_s) : f.bytes_per_s;
          break;
        case LinkFault::Kind::Cut:
          x.cut = true;
          break;
        case LinkFault::Kind::Drop:
        case LinkFault::Kind::Duplicate:
        case LinkFault::Kind::Reorder:
          x.frame.push_back({id, f.kind, f.probability, f.seed, f.frame_ops, f.reorder_wait_s});
          break;
      }
    }
  }
  return v;
}

void LinkProxy::Impl::update_cut_time_locked() {
  const auto now = Clock::now();
  std::array<bool, 2> cut{false, false};
  for (const auto& [id, f] : faults)
    if (f.kind == LinkFault::Kind::Cut)
      for (int d = 0; d < 2; ++d)
        if (f.direction == LinkDirection::Both || dir_index(f.direction) == d)
          cut[size_t(d)] = true;
  for (size_t d = 0; d < 2; ++d) {
    if (cut[d] && !cut_now[d]) cut_since[d] = now;
    if (!cut[d] && cut_now[d])
      cut_us[d] += uint64_t(
          std::chrono::duration_cast<std::chrono::microseconds>(now - cut_since[d]).count());
    cut_now[d] = cut[d];
  }
}

void LinkProxy::Impl::apply(const std::array<DirectionFaults, 2>& v) {
  const auto old = view;
  view = v;
  // refresh() may close a connection, which erases it from the set.
  std::vector<std::shared_ptr<Connection>> all(conns.begin(), conns.end());
  for (auto& c : all) c->refresh(old);
}

std::future<void> LinkProxy::Impl::post_locked(std::function<void()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  if (ioc.get_executor().running_in_this_thread()) {
    fn();
    done->set_value();
    return fut;
  }
  asio::post(ioc, [fn = std::move(fn), done] {
    fn();
    done->set_value();
  });
  return fut;
}

void LinkProxy::Impl::change(const std::function<void()>& edit) {
  std::future<void> fut;
  {
    std::lock_guard lk(mu);
    edit();
    update_cut_time_locked();
    fut = post_locked([this, v = compute_view_locked()] { apply(v); });
  }
  fut.wait();
}

LinkProxy::LinkProxy(std::string upstream_host, uint16_t upstream_port, std::string listen_host,
                     uint16_t listen_port, bool guard)
    : impl_(std::make_unique<Impl>(std::move(upstream_host), upstream_port, guard)) {
  Impl& m = *impl_;
  const std::string where = listen_host + ":" + std::to_string(listen_port);
  boost::system::error_code ec;
  tcp::resolver resolver(m.ioc);
  auto results = resolver.resolve(listen_host, std::to_string(listen_port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    throw std::runtime_error("link proxy: cannot listen on " + where + ": " +
                             (ec ? ec.message() : std::string("no address")));
  const tcp::endpoint ep = results.begin()->endpoint();
  if (!ec) m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("link proxy: cannot listen on " + where + ": " + ec.message());
  m.port = m.acceptor.local_endpoint().port();
  m.start_accept();
  m.thread = std::thread([&m] {
    for (;;) {
      try {
        m.ioc.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("link proxy: {}", e.what());
      }
    }
  });
}

LinkProxy::~LinkProxy() {
  Impl& m = *impl_;
  asio::post(m.ioc, [&m] {
    m.stopping = true;
    boost::system::error_code ec;
    m.acceptor.close(ec);
    std::vector<std::shared_ptr<Impl::Connection>> all(m.conns.begin(), m.conns.end());
    for (auto& c : all) c->close(false);
    m.conns.clear();
    m.work.reset();
    m.ioc.stop();
  });
  m.thread.join();
}

uint16_t LinkProxy::port() const {
  return impl_->port;
}

int LinkProxy::add(const LinkFault& f) {
  if (!(f.probability >= 0 && f.probability <= 1))
    throw std::invalid_argument("link fault: probability must be in [0, 1]");
  if (!(f.delay_s >= 0)) throw std::invalid_argument("link fault: delay_s must be >= 0");
  if (!(f.reorder_wait_s >= 0))
    throw std::invalid_argument("link fault: reorder_wait_s must be >= 0");
  if (f.kind == LinkFault::Kind::Bandwidth && !(f.bytes_per_s > 0))
    throw std::invalid_argument("link fault: a Bandwidth fault needs bytes_per_s > 0");
  int id = 0;
  impl_->change([&] {
    id = impl_->next_id++;
    impl_->faults[id] = f;
  });
  return id;
}

void LinkProxy::remove(int id) {
  impl_->change([&] { impl_->faults.erase(id); });
}

void LinkProxy::clear() {
  impl_->change([&] { impl_->faults.clear(); });
}

void LinkProxy::reset_connections() {
  Impl& m = *impl_;
  std::future<void> fut;
  {
    std::lock_guard lk(m.mu);
    fut = m.post_locked([&m] {
      std::vector<std::shared_ptr<Impl::Connection>> all(m.conns.begin(), m.conns.end());
      for (auto& c : all) {
        m.connections_reset.fetch_add(1);
        c->close(true);
      }
    });
  }
  fut.wait();
}

LinkCounters LinkProxy::counters() const {
  const Impl& m = *impl_;
  LinkCounters c;
  c.connections = m.connections.load();
  c.connect_failures = m.connect_failures.load();
  c.connections_reset = m.connections_reset.load();
  c.open_connections = m.open_connections.load();
  std::array<uint64_t, 2> cut_us{};
  {
    std::lock_guard lk(m.mu);
    const auto now = Clock::now();
    for (size_t d = 0; d < 2; ++d) {
      cut_us[d] = m.cut_us[d];
      if (m.cut_now[d])
        cut_us[d] += uint64_t(
            std::chrono::duration_cast<std::chrono::microseconds>(now - m.cut_since[d]).count());
    }
  }
  for (size_t d = 0; d < 2; ++d) {
    const AtomicCounters& a = m.dir_counters[d];
    LinkDirectionCounters& o = d == 0 ? c.to_upstream : c.to_client;
    o.bytes_forwarded = a.bytes_forwarded.load();
    o.frames_forwarded = a.frames_forwarded.load();
    o.frames_dropped = a.frames_dropped.load();
    o.frames_duplicated = a.frames_duplicated.load();
    o.frames_reordered = a.frames_reordered.load();
    o.chunks_delayed = a.chunks_delayed.load();
    o.bytes_throttled = a.bytes_throttled.load();
    o.bytes_held_while_cut = a.bytes_held_while_cut.load();
    o.cut_us = cut_us[d];
    o.streams_not_basp = a.streams_not_basp.load();
    o.streams_refused = a.streams_refused.load();
  }
  return c;
}

}  // namespace troupe
