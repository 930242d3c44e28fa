#include "gpu/comm/gloo_communicator.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace troupe {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Buffer = gloo::transport::UnboundBuffer;

// Message tags (Gloo's "slots"): kind | byte count | sequence number. A
// receive matches only a send with the same tag, so a message of another
// collective or of another size stays unmatched (the call times out) instead
// of reaching a buffer of the wrong size, which Gloo checks with an assertion
// on its I/O thread that would terminate the process.
enum class Kind : uint64_t {
  kAllReduceScatter = 1,
  kAllReduceGather,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kBarrier,
  kPointToPoint,
  kNote,
  kHello,
};
constexpr int kSeqBits = 24;
constexpr int kBytesBits = 36;
constexpr uint64_t kMaxMessageBytes = (uint64_t(1) << kBytesBits) - 1;

uint64_t tag(Kind kind, uint32_t seq, size_t bytes) {
  return (uint64_t(kind) << (kSeqBits + kBytesBits)) | (uint64_t(bytes) << kSeqBits) |
         (seq & ((uint32_t(1) << kSeqBits) - 1));
}

// A failing rank's note to its peers; longer reasons are cut.
constexpr size_t kNoteBytes = 512;
// Notes normally leave at once; one queued behind a transfer to a stopped
// peer would wait forever, and the connections close after this.
constexpr milliseconds kNoteFlush{50};
// A broken connection fails both the call's wait and that connection's
// monitor; the call waits this long for the monitor, which knows the peer.
constexpr milliseconds kAttributionGrace{100};
// For waits that must not time out: a Gloo wait that times out closes every
// connection of the context.
constexpr milliseconds kForever = std::chrono::hours(24 * 365);

// Floats summed per block, as in the in-process communicator: the partial
// sums stay in L1 while every rank's contribution is added.
constexpr size_t kBlock = 1024;

void add_into(float* __restrict acc, const float* __restrict x, size_t len) {
  for (size_t k = 0; k < len; ++k) acc[k] += x[k];
}

// out[i] = (..((parts[0][i] + parts[1][i]) + parts[2][i]) ..) + parts[p-1][i],
// the contract's rank order. out may be one of the parts.
void sum_in_rank_order(const float* const* parts, int p, size_t n, float* out) {
  float acc[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    const size_t len = std::min(kBlock, n - off);
    std::memcpy(acc, parts[0] + off, len * sizeof(float));
    for (int r = 1; r < p; ++r) add_into(acc, parts[r] + off, len);
    std::memcpy(out + off, acc, len * sizeof(float));
  }
}

uint64_t floats_bytes(size_t n) {
  return uint64_t(n) * sizeof(float);
}

// Gloo's messages start with "[file.cc:123] "; the rest says what happened.
std::string gloo_message(const std::exception& e) {
  std::string s = e.what();
  if (!s.empty() && s[0] == '[') {
    const auto end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  return s;
}

// Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer
// that has closed its end (routine when a group fails or is torn down) would
// kill the process with SIGPIPE. Ignoring it makes the write fail with EPIPE,
// which Gloo reports as an error. Process-wide, unless the process has a
// handler of its own.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

// One message: to or from `peer`, `bytes` at `offset` of its batch's buffer.
struct Leg {
  int peer;
  size_t offset;
  size_t bytes;
};

// Where a message sits in its batch's buffer, and how long it is, in floats.
struct Span {
  size_t offset;
  size_t n;
};

// Messages posted together on one buffer: all receives or all sends.
struct Batch {
  Buffer* buf = nullptr;
  bool recv = false;
  std::vector<int> peers;
};

}  // namespace

// ------------------------------------------------------------------- Impl

struct GlooCommunicator::Impl {
  Impl(int rank, int size, RendezvousStore& store, GlooOptions options);
  ~Impl();

  const int rank;
  const int size;
  const GlooOptions opt;

  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> ctx;

  // Failure state: set once, never cleared.
  mutable std::mutex mu;
  std::condition_variable failed_cv;
  std::atomic<bool> failed{false};
  std::string reason;           // guarded by mu
  std::vector<Buffer*> active;  // the buffers the call in progress waits on; mu

  // Control slot: a receive from every peer stays posted, waited on by that
  // peer's monitor thread; the outbox carries this rank's note when it fails.
  std::vector<std::array<char, kNoteBytes>> inbox;  // [peer]
  std::vector<std::unique_ptr<Buffer>> inbox_bufs;  // [peer]
  std::array<char, kNoteBytes> outbox{};
  std::unique_ptr<Buffer> outbox_buf;
  std::vector<std::thread> monitors;

  // The watchdog reads what the call in progress is and since when.
  std::thread watchdog;
  std::mutex wd_mu;
  std::condition_variable wd_cv;
  bool stopping = false;           // guarded by wd_mu
  std::atomic<uint64_t> epoch{0};  // odd while a call runs
  std::atomic<int64_t> call_start_ns{0};
  std::atomic<const char*> call_op{""};
  std::atomic<size_t> call_n{0};
  // Per peer, the messages of the batch being awaited that are not done: a
  // batch's completions are taken in arrival order, so while the rank waits
  // these are exactly the missing ones.
  std::unique_ptr<std::atomic<int>[]> pending;  // [peer]

  // Used by the rank's own thread only.
  uint32_t coll_seq = 0;
  std::vector<uint32_t> send_seq, recv_seq;  // [peer], point to point
  std::vector<float> scratch;
  std::vector<const float*> parts;
  std::vector<Leg> legs;                              // of the next batch
  std::vector<std::unique_ptr<Buffer>> call_buffers;  // the call's, all in `active`
  bool probing = false;  // the call was interrupted: take completions without waiting
  float token = 0;
  std::vector<float> tokens;

  std::string who(int r) const {
    std::string s = "rank " + std::to_string(r);
    if (!opt.peer_names.empty() && !opt.peer_names[size_t(r)].empty()) {
      s += " (" + opt.peer_names[size_t(r)] + ")";
    }
    return s;
  }
  std::string prefix() const { return "gloo group '" + opt.group + "', " + who(rank) + ": "; }
  std::string failure_reason() const {
    std::lock_guard<std::mutex> lock(mu);
    return reason;
  }
  CommError failure() const { return CommError(failure_reason()); }
  void check_live() const {
    if (failed.load(std::memory_order_acquire)) throw failure();
  }

  // Set-up.
  void connect(RendezvousStore& store);
  void open_control();
  void greet_peers();
  void monitor(int peer);
  void watch();

  // Failing.
  bool fail(const std::string& why, const std::string& note);
  bool fail_here(const std::string& what) {
    return fail(prefix() + what, who(rank) + " failed: " + what);
  }
  void tell_peers(const std::string& note);
  [[noreturn]] void bad_argument(const std::string& what) {
    fail_here(what);
    throw std::invalid_argument(what);
  }
  void check_buffer(const void* p, size_t n, const char* op) {
    if (p == nullptr && n != 0) {
      bad_argument(std::string(op) + ": null buffer for " + std::to_string(n) + " floats");
    }
  }
  void check_peer(int peer, const char* op) {
    if (peer < 0 || peer >= size || peer == rank) {
      bad_argument(std::string(op) + ": " + who(rank) + " cannot exchange with rank " +
                   std::to_string(peer) + " in a group of " + std::to_string(size));
    }
  }
  std::string pending_ranks() const;
  CommError transport_error(const std::exception& e);

  // Data movement.
  float* scratch_for(size_t n) {
    if (scratch.size() < n) scratch.resize(n);
    return scratch.data();
  }
  // Adds a message of n floats at offset (in floats) to the next batch.
  void leg(int peer, size_t offset, size_t n) {
    if (n) legs.push_back({peer, floats_bytes(offset), floats_bytes(n)});
  }
  // A message to or from every peer j: span(j) = {offset, n} in floats.
  template <class Span>
  void leg_each_peer(Span span) {
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      const auto [offset, n] = span(j);
      leg(j, offset, n);
    }
  }
  Batch post(Kind kind, uint32_t seq, bool recv, const void* base, size_t bytes);
  void await(const Batch& b);
};

namespace {

// Gloo's view of a RendezvousStore: its keys go under "<group>/", and a key
// that never comes names the rank that did not join (Gloo's keys are ranks).
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore& store, const GlooCommunicator::Impl& g)
      : store_(store), g_(g), prefix_(g.opt.group + "/") {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, data);
  }
  std::vector<char> get(const std::string& key) override {
    try {
      return store_.get(prefix_ + key, g_.opt.timeout);
    } catch (const RendezvousTimeout&) {
      throw not_joined({key});
    }
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, g_.opt.timeout); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    try {
      store_.wait(full, std::min(timeout, g_.opt.timeout));
    } catch (const RendezvousTimeout&) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        try {
          store_.get(prefix_ + k, milliseconds(0));
        } catch (const RendezvousTimeout&) {
          missing.push_back(k);
        }
      }
      throw not_joined(missing);
    }
  }

 private:
  CommError not_joined(const std::vector<std::string>& keys) const {
    std::ostringstream os;
    const char* sep = "";
    for (const auto& k : keys) {
      os << sep;
      sep = ", ";
      try {
        const int r = std::stoi(k);
        if (r >= 0 && r < g_.size && std::to_string(r) == k) {
          os << g_.who(r);
          continue;
        }
      } catch (const std::exception&) {
      }
      os << "key '" << prefix_ << k << '\'';
    }
    os << " did not join within " << double(g_.opt.timeout.count()) / 1000 << " s";
    return CommError(os.str());
  }

  RendezvousStore& store_;
  const GlooCommunicator::Impl& g_;
  const std::string prefix_;
};

}  // namespace

GlooCommunicator::Impl::Impl(int r, int p, RendezvousStore& store, GlooOptions options)
    : rank(r), size(p), opt(std::move(options)) {
  if (size < 1) throw std::invalid_argument("gloo group: size must be >= 1");
  if (rank < 0 || rank >= size) {
    throw std::invalid_argument("gloo group: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(size) + ")");
  }
  if (opt.timeout.count() <= 0) throw std::invalid_argument("gloo group: timeout must be > 0");
  if (opt.group.empty()) throw std::invalid_argument("gloo group: the group name is empty");
  if (!opt.peer_names.empty() && opt.peer_names.size() != size_t(size)) {
    throw std::invalid_argument("gloo group: " + std::to_string(opt.peer_names.size()) +
                                " peer names for " + std::to_string(size) + " ranks");
  }
  pending.reset(new std::atomic<int>[size_t(size)]);
  for (int j = 0; j < size; ++j) pending[j].store(0);
  send_seq.assign(size_t(size), 0);
  recv_seq.assign(size_t(size), 0);
  parts.resize(size_t(size));
  tokens.resize(size_t(size));
  if (size == 1) return;  // nothing to connect to
  connect(store);
  open_control();
  // Last: nothing may throw once threads run (the destructor would not).
  for (int j = 0; j < size; ++j) {
    if (j != rank) monitors.emplace_back([this, j] { monitor(j); });
  }
  watchdog = std::thread([this] { watch(); });
}

void GlooCommunicator::Impl::connect(RendezvousStore& store) {
  ignore_sigpipe();
  gloo::transport::tcp::attr attr;
  attr.hostname = opt.bind_address;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(prefix() + "cannot use address '" + opt.bind_address + "': " + gloo_message(e));
  }
  ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(opt.timeout);
  StoreAdapter adapter(store, *this);
  try {
    ctx->connectFullMesh(adapter, device);
  } catch (const CommError& e) {
    throw CommError(prefix() + e.what());
  } catch (const std::exception& e) {
    throw CommError(prefix() + "could not connect: " + gloo_message(e));
  }
}

void GlooCommunicator::Impl::open_control() {
  inbox.resize(size_t(size));
  inbox_bufs.resize(size_t(size));
  try {
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      inbox_bufs[j] = ctx->createUnboundBuffer(inbox[j].data(), kNoteBytes);
      inbox_bufs[j]->recv(j, tag(Kind::kNote, 0, kNoteBytes), 0, kNoteBytes);
    }
    outbox_buf = ctx->createUnboundBuffer(outbox.data(), kNoteBytes);
  } catch (const std::exception& e) {
    throw CommError(prefix() + "could not connect: " + gloo_message(e));
  }
  greet_peers();
}

// Gloo sends into a peer's unbound buffer only once the peer's "ready to
// receive" message has arrived; until then a send waits in a queue. A rank
// that fails right after joining could so miss its note's flush deadline,
// and its peers would see the connection close without the reason. Each
// peer's hello travels after its inbox's ready message on the same
// connection, so once every hello is in, a note leaves at once.
void GlooCommunicator::Impl::greet_peers() {
  char hello = 1;
  std::vector<char> hellos(static_cast<size_t>(size));
  try {
    auto out = ctx->createUnboundBuffer(&hello, 1);
    auto in = ctx->createUnboundBuffer(hellos.data(), hellos.size());
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      in->recv(j, tag(Kind::kHello, 0, 1), size_t(j), 1);
      out->send(j, tag(Kind::kHello, 0, 1), 0, 1);
    }
    const auto deadline = Clock::now() + opt.timeout;
    for (int i = 1; i < size; ++i) {
      in->waitRecv(deadline);
      out->waitSend(deadline);
    }
  } catch (const std::exception& e) {
    throw CommError(prefix() + "could not connect: no hello from every peer: " + gloo_message(e));
  }
}

GlooCommunicator::Impl::~Impl() {
  if (size == 1) return;
  fail(prefix() + "communicator destroyed",
       who(rank) + " left the group (its communicator was destroyed)");
  {
    std::lock_guard<std::mutex> lock(wd_mu);
    stopping = true;
  }
  wd_cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  for (auto& b : inbox_bufs) {
    if (b) b->abortWaitRecv();
  }
  for (auto& t : monitors) t.join();
}

// Waits for peer's note or for its connection to break, whichever first.
void GlooCommunicator::Impl::monitor(int peer) {
  try {
    if (!inbox_bufs[peer]->waitRecv(nullptr, kForever)) return;  // shutting down
    inbox[peer].back() = '\0';
    const std::string note = inbox[peer].data();
    fail(prefix() + note, who(rank) + " failed: " + note);
  } catch (const std::exception& e) {
    try {
      fail_here("lost " + who(peer) + ": " + gloo_message(e));
    } catch (...) {
    }
  } catch (...) {
  }
}

void GlooCommunicator::Impl::watch() {
  // A call that starts while the watchdog sleeps idle is seen this late.
  const auto idle = std::clamp(opt.timeout / 10, milliseconds(1), milliseconds(100));
  std::unique_lock<std::mutex> lock(wd_mu);
  while (!stopping && !failed.load()) {
    const uint64_t e = epoch.load(std::memory_order_acquire);
    if (!(e & 1)) {
      wd_cv.wait_for(lock, idle);
      continue;
    }
    const auto start = Clock::time_point(std::chrono::nanoseconds(call_start_ns.load()));
    const auto deadline = start + opt.timeout;
    if (Clock::now() < deadline) {
      wd_cv.wait_until(lock, deadline);
      continue;
    }
    if (epoch.load(std::memory_order_acquire) != e) continue;  // that call ended
    lock.unlock();
    std::ostringstream os;
    os << "timed out after " << std::chrono::duration<double>(Clock::now() - start).count()
       << " s in " << call_op.load() << "(n=" << call_n.load() << ") waiting for "
       << pending_ranks();
    try {
      fail_here(os.str());
    } catch (...) {
    }
    return;
  }
}

std::string GlooCommunicator::Impl::pending_ranks() const {
  std::string s;
  for (int j = 0; j < size; ++j) {
    if (j == rank || pending[j].load(std::memory_order_relaxed) <= 0) continue;
    s += (s.empty() ? "" : ", ") + who(j);
  }
  return s.empty() ? "its peers" : s;
}

// The first failure wins: it records the reason, tells the peers, interrupts
// the call in progress and closes the connections. Returns false when the
// group had failed already.
bool GlooCommunicator::Impl::fail(const std::string& why, const std::string& note) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.load()) return false;
    reason = why;
    failed.store(true, std::memory_order_release);
  }
  failed_cv.notify_all();
  wd_cv.notify_all();
  if (size == 1) return true;
  // The note goes out before the close on the same connection, so peers read
  // it before they see the connection break.
  tell_peers(note);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (Buffer* b : active) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }
  // Also stops Gloo's I/O thread from writing into buffers of an interrupted
  // call, which the caller may free once the call throws.
  try {
    ctx->closeConnections();
  } catch (const std::exception&) {
  }
  return true;
}

void GlooCommunicator::Impl::tell_peers(const std::string& note) {
  outbox.fill('\0');
  std::memcpy(outbox.data(), note.data(), std::min(note.size(), kNoteBytes - 1));
  int posted = 0;
  for (int j = 0; j < size; ++j) {
    if (j == rank) continue;
    try {
      outbox_buf->send(j, tag(Kind::kNote, 0, kNoteBytes), 0, kNoteBytes);
      ++posted;
    } catch (const std::exception&) {
      // That connection is broken: the peer learns from that.
    }
  }
  const auto deadline = Clock::now() + kNoteFlush;
  try {
    for (int i = 0; i < posted; ++i) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (!outbox_buf->waitSend(nullptr, std::max(left, milliseconds(0)))) break;
    }
  } catch (const std::exception&) {
    // Not written in time (Gloo closed the connections) or a broken
    // connection: those peers see the connection close instead.
  }
}

CommError GlooCommunicator::Impl::transport_error(const std::exception& e) {
  {
    std::unique_lock<std::mutex> lock(mu);
    failed_cv.wait_for(lock, kAttributionGrace, [&] { return failed.load(); });
  }
  fail_here("transport error while waiting for " + pending_ranks() + ": " + gloo_message(e));
  return failure();
}

namespace {

// One call: tells the watchdog that it runs, and which; owns the buffers
// of its batches, which it unregisters (so that a failure can no longer
// interrupt them) before destroying them.
class CallScope {
 public:
  CallScope(GlooCommunicator::Impl& g, const char* op, size_t n) : g_(g) {
    g_.probing = false;
    g_.call_op.store(op, std::memory_order_relaxed);
    g_.call_n.store(n, std::memory_order_relaxed);
    g_.call_start_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    g_.epoch.fetch_add(1, std::memory_order_release);
  }
  ~CallScope() {
    {
      std::lock_guard<std::mutex> lock(g_.mu);
      g_.active.clear();
    }
    g_.call_buffers.clear();
    g_.legs.clear();
    g_.epoch.fetch_add(1, std::memory_order_release);
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  GlooCommunicator::Impl& g_;
};

}  // namespace

// Posts the legs as receives into, or sends from, [base, base + bytes) and
// clears them. The buffer lives until the call ends.
Batch GlooCommunicator::Impl::post(Kind kind, uint32_t seq, bool recv, const void* base,
                                   size_t bytes) {
  Batch b;
  b.recv = recv;
  if (legs.empty()) return b;
  for (const Leg& l : legs) {
    if (l.bytes > kMaxMessageBytes) {
      bad_argument("a message of " + std::to_string(l.bytes) + " bytes exceeds the limit of " +
                   std::to_string(kMaxMessageBytes));
    }
  }
  // Gloo only reads a buffer it sends from.
  auto buf = ctx->createUnboundBuffer(const_cast<void*>(base), bytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.load()) throw CommError(reason);
    active.push_back(buf.get());
  }
  b.buf = buf.get();
  call_buffers.push_back(std::move(buf));
  for (const Leg& l : legs) {
    try {
      if (recv) {
        b.buf->recv(l.peer, tag(kind, seq, l.bytes), l.offset, l.bytes);
      } else {
        b.buf->send(l.peer, tag(kind, seq, l.bytes), l.offset, l.bytes);
      }
    } catch (const std::exception& e) {
      fail_here("lost " + who(l.peer) + ": " + gloo_message(e));
      throw failure();
    }
    b.peers.push_back(l.peer);
  }
  legs.clear();
  return b;
}

// Waits until every message of b is done. A wait that a failure interrupted
// is retried without waiting: when the data had all arrived the call
// succeeds after all (the next one throws); otherwise this one throws.
void GlooCommunicator::Impl::await(const Batch& b) {
  if (!b.buf) return;
  for (int j = 0; j < size; ++j) pending[j].store(0, std::memory_order_relaxed);
  for (int peer : b.peers) pending[peer].fetch_add(1, std::memory_order_relaxed);
  // Beyond the watchdog's deadline: Gloo's own timeout is a backstop only.
  const milliseconds backstop = 2 * opt.timeout + milliseconds(1000);
  int interrupted = 0;
  for (size_t done = 0; done < b.peers.size();) {
    int peer = -1;
    bool completed = false;
    try {
      const milliseconds wait = probing ? milliseconds(0) : backstop;
      completed = b.recv ? b.buf->waitRecv(&peer, wait) : b.buf->waitSend(&peer, wait);
    } catch (const std::exception& e) {
      if (probing || failed.load()) throw failure();
      throw transport_error(e);
    }
    if (!completed) {
      // abortWait*() interrupts one wait per buffer; look again, not waiting.
      if (++interrupted > 1) throw failure();
      probing = true;
      continue;
    }
    if (peer >= 0 && peer < size) pending[peer].fetch_sub(1, std::memory_order_relaxed);
    ++done;
  }
}

// ------------------------------------------------------- GlooCommunicator

GlooCommunicator::GlooCommunicator(int rank, int size, RendezvousStore& store, GlooOptions options)
    : impl_(std::make_unique<Impl>(rank, size, store, std::move(options))) {}

GlooCommunicator::~GlooCommunicator() = default;

int GlooCommunicator::rank() const {
  return impl_->rank;
}
int GlooCommunicator::size() const {
  return impl_->size;
}

void GlooCommunicator::abort(const std::string& reason) {
  impl_->fail(reason, impl_->who(impl_->rank) + " aborted: " + reason);
}
bool GlooCommunicator::failed() const {
  return impl_->failed.load();
}
std::string GlooCommunicator::failure_reason() const {
  return impl_->failure_reason();
}

template <class Body>
void GlooCommunicator::timed(uint64_t bytes, Body&& body) {
  const auto t0 = Clock::now();
  try {
    body();
  } catch (...) {
    record(0, Clock::now() - t0);
    throw;
  }
  record(bytes, Clock::now() - t0);
}

void GlooCommunicator::all_reduce_sum(float* data, size_t n) {
  Impl& g = *impl_;
  const int p = g.size;
  const int r = g.rank;
  timed(2 * uint64_t(p - 1) * floats_bytes(n) / uint64_t(p), [&] {
    g.check_buffer(data, n, "all_reduce_sum");
    g.check_live();
    if (p == 1) return;
    CallScope call(g, "all_reduce_sum", n);
    const size_t chunk = (n + size_t(p) - 1) / size_t(p);
    auto lo = [&](int c) { return std::min(n, size_t(c) * chunk); };
    auto len = [&](int c) { return std::min(n, lo(c) + chunk) - lo(c); };
    const uint32_t scatter = g.coll_seq++, gather = g.coll_seq++;
    // The gather round's receives go first, so that a peer that finishes its
    // sum early finds this rank ready. They land in the chunks this rank
    // sends in the scatter round, but only after the peer has received them.
    g.leg_each_peer([&](int j) { return Span{lo(j), len(j)}; });
    const Batch gathered = g.post(Kind::kAllReduceGather, gather, true, data, floats_bytes(n));
    // Scatter round: every peer's copy of chunk r, peer j's at j * len(r).
    float* copies = g.scratch_for(size_t(p) * len(r));
    g.leg_each_peer([&](int j) { return Span{size_t(j) * len(r), len(r)}; });
    const Batch scattered =
        g.post(Kind::kAllReduceScatter, scatter, true, copies, floats_bytes(size_t(p) * len(r)));
    g.leg_each_peer([&](int j) { return Span{lo(j), len(j)}; });
    const Batch sent = g.post(Kind::kAllReduceScatter, scatter, false, data, floats_bytes(n));
    g.await(scattered);
    for (int j = 0; j < p; ++j) g.parts[j] = j == r ? data + lo(r) : copies + size_t(j) * len(r);
    sum_in_rank_order(g.parts.data(), p, len(r), data + lo(r));
    g.leg_each_peer([&](int) { return Span{lo(r), len(r)}; });
    const Batch shared = g.post(Kind::kAllReduceGather, gather, false, data, floats_bytes(n));
    g.await(gathered);
    g.await(sent);
    g.await(shared);
  });
}

void GlooCommunicator::all_gather(const float* send, size_t n_per_rank, float* recv) {
  Impl& g = *impl_;
  const int p = g.size;
  const int r = g.rank;
  timed(uint64_t(p - 1) * floats_bytes(n_per_rank), [&] {
    g.check_buffer(send, n_per_rank, "all_gather");
    g.check_buffer(recv, n_per_rank, "all_gather");
    g.check_live();
    float* own = recv + size_t(r) * n_per_rank;
    if (send != own && n_per_rank) std::memcpy(own, send, floats_bytes(n_per_rank));
    if (p == 1) return;
    CallScope call(g, "all_gather", n_per_rank);
    const uint32_t seq = g.coll_seq++;
    g.leg_each_peer([&](int j) { return Span{size_t(j) * n_per_rank, n_per_rank}; });
    const Batch in =
        g.post(Kind::kAllGather, seq, true, recv, floats_bytes(size_t(p) * n_per_rank));
    g.leg_each_peer([&](int) { return Span{0, n_per_rank}; });
    const Batch out = g.post(Kind::kAllGather, seq, false, send, floats_bytes(n_per_rank));
    g.await(in);
    g.await(out);
  });
}

void GlooCommunicator::reduce_scatter_sum(const float* send, size_t n_per_rank, float* recv) {
  Impl& g = *impl_;
  const int p = g.size;
  const int r = g.rank;
  timed(uint64_t(p - 1) * floats_bytes(n_per_rank), [&] {
    g.check_buffer(send, n_per_rank, "reduce_scatter_sum");
    g.check_buffer(recv, n_per_rank, "reduce_scatter_sum");
    g.check_live();
    if (p == 1) {
      if (send != recv && n_per_rank) std::memcpy(recv, send, floats_bytes(n_per_rank));
      return;
    }
    CallScope call(g, "reduce_scatter_sum", n_per_rank);
    const uint32_t seq = g.coll_seq++;
    const size_t all = size_t(p) * n_per_rank;
    float* copies = g.scratch_for(all);
    auto block = [&](int j) { return Span{size_t(j) * n_per_rank, n_per_rank}; };
    g.leg_each_peer(block);
    const Batch in = g.post(Kind::kReduceScatter, seq, true, copies, floats_bytes(all));
    g.leg_each_peer(block);
    const Batch out = g.post(Kind::kReduceScatter, seq, false, send, floats_bytes(all));
    g.await(in);
    for (int j = 0; j < p; ++j) {
      g.parts[j] = j == r ? send + size_t(r) * n_per_rank : copies + size_t(j) * n_per_rank;
    }
    sum_in_rank_order(g.parts.data(), p, n_per_rank, recv);
    g.await(out);
  });
}

void GlooCommunicator::broadcast(float* data, size_t n, int root) {
  Impl& g = *impl_;
  const int p = g.size;
  const int r = g.rank;
  timed(p > 1 ? floats_bytes(n) : 0, [&] {
    g.check_buffer(data, n, "broadcast");
    if (root < 0 || root >= p) {
      g.bad_argument("broadcast: root " + std::to_string(root) + " is not a rank");
    }
    g.check_live();
    if (p == 1) return;
    CallScope call(g, "broadcast", n);
    const uint32_t seq = g.coll_seq++;
    if (r == root) {
      g.leg_each_peer([&](int) { return Span{0, n}; });
    } else {
      g.leg(root, 0, n);
    }
    g.await(g.post(Kind::kBroadcast, seq, r != root, data, floats_bytes(n)));
  });
}

void GlooCommunicator::barrier() {
  Impl& g = *impl_;
  const int p = g.size;
  timed(0, [&] {
    g.check_live();
    if (p == 1) return;
    CallScope call(g, "barrier", 0);
    const uint32_t seq = g.coll_seq++;
    // A token of one float each way: a message carries at least a byte.
    g.leg_each_peer([&](int j) { return Span{size_t(j), 1}; });
    const Batch in = g.post(Kind::kBarrier, seq, true, g.tokens.data(), floats_bytes(size_t(p)));
    g.leg_each_peer([&](int) { return Span{0, 1}; });
    const Batch out = g.post(Kind::kBarrier, seq, false, &g.token, floats_bytes(1));
    g.await(in);
    g.await(out);
  });
}

void GlooCommunicator::send(const float* data, size_t n, int peer) {
  Impl& g = *impl_;
  timed(floats_bytes(n), [&] {
    g.check_peer(peer, "send");
    g.check_buffer(data, n, "send");
    g.check_live();
    CallScope call(g, "send", n);
    g.leg(peer, 0, n);
    g.await(g.post(Kind::kPointToPoint, g.send_seq[peer]++, false, data, floats_bytes(n)));
  });
}

void GlooCommunicator::recv(float* data, size_t n, int peer) {
  Impl& g = *impl_;
  timed(floats_bytes(n), [&] {
    g.check_peer(peer, "recv");
    g.check_buffer(data, n, "recv");
    g.check_live();
    CallScope call(g, "recv", n);
    g.leg(peer, 0, n);
    g.await(g.post(Kind::kPointToPoint, g.recv_seq[peer]++, true, data, floats_bytes(n)));
  });
}

}  // namespace troupe
