#include "gpu/comm/in_process_communicator.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <mutex>
#include <sstream>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace troupe {

// -------------------------------------------------------------- InProcessGroup

namespace {

// About 50-100 us of spinning, as in ThreadPool: collectives of one decode
// step come a few microseconds apart, and a futex round trip costs more.
constexpr int kSpinIterations = 1 << 10;

// Floats summed per block: the partial sums stay in L1 while every rank's
// contribution is added, and the loops vectorize.
constexpr size_t kBlock = 1024;

// Slices of an all-reduce start on 64-byte multiples, so that two ranks never
// write the same cache line of a buffer.
constexpr size_t kSliceAlign = 16;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// A futex word. std::atomic::wait cannot time out, and the group needs both a
// timeout and a way to wake every waiter on abort, so this talks to the
// futex directly; `sleepers` lets the common, spinning case skip the syscall.
struct alignas(64) WaitWord {
  std::atomic<uint32_t> value{0};
  std::atomic<int> sleepers{0};

  static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);
  uint32_t* addr() { return reinterpret_cast<uint32_t*>(&value); }

  // seq_cst on both sides (here and in sleep()): either this sees the
  // sleeper, or the sleeper sees the new value and does not sleep.
  void bump() {
    value.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) wake_all();
  }
  void wake_all() { syscall(SYS_futex, addr(), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0); }
  void sleep(uint32_t seen, const timespec* timeout) {
    syscall(SYS_futex, addr(), FUTEX_WAIT_PRIVATE, seen, timeout, nullptr, 0);
  }
};

// Wrap-safe "counter has reached target".
inline bool reached(uint32_t counter, uint32_t target) {
  return int32_t(counter - target) >= 0;
}

enum class Op : uint8_t { kBarrier, kAllReduce, kAllGather, kReduceScatter, kBroadcast, kPieceSum };

const char* op_name(Op op) {
  switch (op) {
    case Op::kBarrier:
      return "barrier";
    case Op::kAllReduce:
      return "all_reduce_sum";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter_sum";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kPieceSum:
      return "sum_in_piece_order";
  }
  return "?";
}

// What a rank published for a collective: written before it arrives at the
// collective's first round, read by its peers until the last round.
struct Slot {
  Op op = Op::kBarrier;
  size_t n = 0;
  int root = 0;
  const float* src = nullptr;
  float* dst = nullptr;
  int blocks = 1;  // sum_in_piece_order: the n-float blocks at src
};
struct alignas(64) PaddedSlot {
  Slot s;
};

struct alignas(64) RankState {
  std::atomic<uint64_t> rounds{0};  // rounds this rank has arrived at (timeout messages)
  bool claimed = false;             // a live handle exists (guarded by Impl::mu)
};

// Rendezvous from one rank to another: the receiver copies straight out of
// the sender's buffer, so a message is copied once.
struct Channel {
  WaitWord posted;  // sends published
  WaitWord taken;   // sends copied out by the receiver
  const float* data = nullptr;
  size_t n = 0;
};

void add_into(float* __restrict acc, const float* __restrict x, size_t len) {
  for (size_t k = 0; k < len; ++k) acc[k] += x[k];
}

double seconds_of(std::chrono::nanoseconds d) {
  return double(d.count()) * 1e-9;
}

}  // namespace

struct InProcessGroup::Impl {
  Impl(int n, InProcessGroupOptions options)
      : size(n),
        timeout(options.timeout),
        ranks(new RankState[size_t(n)]),
        channels(new Channel[size_t(n) * size_t(n)]) {
    for (auto& s : slots) s.resize(size_t(n));
  }

  const int size;
  const std::chrono::nanoseconds timeout;

  std::atomic<bool> aborted{false};
  mutable std::mutex mu;  // guards reason and RankState::claimed
  std::string reason;

  alignas(64) std::atomic<int> arrived{0};
  // Ranks copying out of peers' buffers right now. A rank leaves a call on
  // abort only when this is 0, so nobody reads a buffer whose owner has
  // already unwound (and maybe freed) it.
  alignas(64) std::atomic<int> in_data_phase{0};
  WaitWord generation;
  // Indexed by the parity of the round's generation: a rank that races ahead
  // into the next collective writes the other set, never the one its slower
  // peers are still reading.
  std::vector<PaddedSlot> slots[2];
  std::unique_ptr<RankState[]> ranks;
  std::unique_ptr<Channel[]> channels;  // [src * size + dst]

  Channel& channel(int src, int dst) { return channels[size_t(src) * size_t(size) + size_t(dst)]; }
  const Slot& slot(uint32_t parity, int rank) const { return slots[parity][size_t(rank)].s; }

  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (aborted.load(std::memory_order_relaxed)) return;
      reason = why;
      aborted.store(true, std::memory_order_seq_cst);
    }
    // Waiters sleep on a value; changing every word makes a waiter that is
    // about to sleep see a change, and the wake gets those already asleep.
    auto shake = [](WaitWord& w) {
      w.value.fetch_add(1, std::memory_order_seq_cst);
      w.wake_all();
    };
    shake(generation);
    for (size_t i = 0; i < size_t(size) * size_t(size); ++i) {
      shake(channels[i].posted);
      shake(channels[i].taken);
    }
  }

  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(mu);
    return reason;
  }

  // Leaves the current call of an aborted group: waits until no rank is
  // copying from buffers, then throws.
  [[noreturn]] void fail() {
    (void)aborted.load(std::memory_order_seq_cst);
    while (in_data_phase.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    throw CommError(abort_reason());
  }

  void throw_if_aborted() {
    if (aborted.load(std::memory_order_acquire)) fail();
  }

  // A bad argument on one rank would leave its peers waiting for it: take the
  // group down with the same message.
  [[noreturn]] void bad_argument(const std::string& what) {
    abort(what);
    throw std::invalid_argument(what);
  }

  // Returns once done(word) holds. Throws CommError when the group aborts
  // (also while waiting) or, after aborting it, when the timeout passes.
  template <class Done, class Describe>
  void wait(WaitWord& w, Done done, Describe describe) {
    bool finished = false;
    for (int i = 0; i < kSpinIterations; ++i) {
      if (done(w.value.load(std::memory_order_acquire))) {
        finished = true;
        break;
      }
      if (aborted.load(std::memory_order_relaxed)) fail();
      cpu_relax();
    }
    const auto start = std::chrono::steady_clock::now();
    while (!finished) {
      const uint32_t seen = w.value.load(std::memory_order_acquire);
      if (done(seen)) break;
      if (aborted.load(std::memory_order_acquire)) fail();
      timespec ts{};
      const timespec* tsp = nullptr;
      if (timeout.count() > 0) {
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited >= timeout) {
          abort(describe(seconds_of(waited)));
          fail();
        }
        const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout - waited);
        ts.tv_sec = time_t(left.count() / 1000000000);
        ts.tv_nsec = long(left.count() % 1000000000);
        tsp = &ts;
      }
      w.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (w.value.load(std::memory_order_seq_cst) == seen &&
          !aborted.load(std::memory_order_seq_cst)) {
        w.sleep(seen, tsp);
      }
      w.sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
    // abort() bumps every word, which looks like progress: check again.
    if (aborted.load(std::memory_order_seq_cst)) fail();
  }

  // One generation of the barrier. Publishes `publish` (when given) for this
  // round and returns the parity of the round's slots.
  uint32_t round(int rank, const Slot* publish, Op op) {
    const uint32_t gen = generation.value.load(std::memory_order_acquire);
    // Checked after reading the generation: abort() bumps it, and a bumped
    // value could name the slot set that a slower peer is still reading. The
    // acquire load that sees the bump also sees the abort.
    throw_if_aborted();
    if (publish) slots[gen & 1][size_t(rank)].s = *publish;
    const uint64_t my_round = ranks[rank].rounds.fetch_add(1, std::memory_order_relaxed) + 1;
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == size - 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.bump();
      throw_if_aborted();
    } else {
      wait(
          generation, [gen](uint32_t v) { return v != gen; },
          [&](double waited) { return describe_missing(rank, op, my_round, waited); });
    }
    return gen & 1;
  }

  std::string describe_missing(int rank, Op op, uint64_t my_round, double waited) const {
    std::ostringstream os;
    os << "in-process group of " << size << ": rank " << rank << " timed out after " << waited
       << " s in " << op_name(op) << " waiting for rank(s)";
    const char* sep = " ";
    for (int r = 0; r < size; ++r) {
      if (ranks[r].rounds.load(std::memory_order_relaxed) < my_round) {
        os << sep << r;
        sep = ", ";
      }
    }
    os << "; group aborted";
    return os.str();
  }

  // Every rank reads the same slots after the round, so every rank reaches
  // the same verdict and all of them throw together.
  void check_same(uint32_t parity) {
    const Slot& first = slot(parity, 0);
    bool same = true;
    for (int r = 1; r < size; ++r) {
      const Slot& s = slot(parity, r);
      same = same && s.op == first.op && s.n == first.n && s.root == first.root;
    }
    if (!same) {
      std::ostringstream os;
      os << "in-process group of " << size << ": ranks called different collectives:";
      for (int r = 0; r < size; ++r) {
        const Slot& s = slot(parity, r);
        os << (r ? ", " : " ") << "rank " << r << ' ' << op_name(s.op) << "(n=" << s.n;
        if (s.op == Op::kBroadcast) os << ", root=" << s.root;
        os << ')';
      }
      abort(os.str());
      fail();
    }
    if (first.op == Op::kBroadcast && (first.root < 0 || first.root >= size)) {
      abort("in-process group of " + std::to_string(size) + ": broadcast root " +
            std::to_string(first.root) + " is not a rank");
      fail();
    }
  }

  void enter_data_phase() {
    in_data_phase.fetch_add(1, std::memory_order_seq_cst);
    if (aborted.load(std::memory_order_seq_cst)) {
      in_data_phase.fetch_sub(1, std::memory_order_seq_cst);
      fail();
    }
  }
  void leave_data_phase() { in_data_phase.fetch_sub(1, std::memory_order_seq_cst); }
};

InProcessGroup::InProcessGroup(int size, InProcessGroupOptions options)
    : impl_(std::make_unique<Impl>(size, options)) {}

InProcessGroup::~InProcessGroup() = default;

std::shared_ptr<InProcessGroup> InProcessGroup::create(int size, InProcessGroupOptions options) {
  if (size < 1) {
    throw std::invalid_argument("in-process group: size must be >= 1, got " + std::to_string(size));
  }
  if (options.timeout.count() < 0) {
    throw std::invalid_argument("in-process group: timeout must be >= 0 (0 = none)");
  }
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(size, options));
}

int InProcessGroup::size() const {
  return impl_->size;
}

std::unique_ptr<InProcessCommunicator> InProcessGroup::communicator(int rank) {
  if (rank < 0 || rank >= impl_->size) {
    throw std::invalid_argument("in-process group: rank " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(impl_->size) + ")");
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->ranks[rank].claimed) {
      throw std::invalid_argument("in-process group: rank " + std::to_string(rank) +
                                  " already has a communicator");
    }
    impl_->ranks[rank].claimed = true;
  }
  return std::unique_ptr<InProcessCommunicator>(
      new InProcessCommunicator(shared_from_this(), rank));
}

void InProcessGroup::abort(const std::string& reason) {
  impl_->abort(reason);
}
bool InProcessGroup::aborted() const {
  return impl_->aborted.load(std::memory_order_acquire);
}
std::string InProcessGroup::abort_reason() const {
  return impl_->abort_reason();
}

std::vector<std::unique_ptr<InProcessCommunicator>> make_in_process_group(
    int size, InProcessGroupOptions options) {
  auto group = InProcessGroup::create(size, options);
  std::vector<std::unique_ptr<InProcessCommunicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(group->communicator(r));
  return comms;
}

// ------------------------------------------------------- InProcessCommunicator

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

void InProcessCommunicator::abort(const std::string& reason) {
  group_->abort(reason);
}

InProcessCommunicator::~InProcessCommunicator() {
  auto& g = impl();
  g.abort("in-process group of " + std::to_string(g.size) + ": rank " + std::to_string(rank_) +
          " left the group (its communicator was destroyed)");
  std::lock_guard<std::mutex> lock(g.mu);
  g.ranks[rank_].claimed = false;
}

int InProcessCommunicator::size() const {
  return impl().size;
}

template <class Body>
void InProcessCommunicator::timed(uint64_t bytes, Body&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    body();
  } catch (...) {
    record(0, std::chrono::steady_clock::now() - t0);
    throw;
  }
  record(bytes, std::chrono::steady_clock::now() - t0);
}

namespace {

uint64_t floats_bytes(size_t n) {
  return uint64_t(n) * sizeof(float);
}

void check_buffer(InProcessGroup::Impl& g, const void* p, size_t n, const char* what, int rank) {
  if (p == nullptr && n != 0) {
    g.bad_argument(std::string(what) + ": rank " + std::to_string(rank) +
                   " passed a null buffer for " + std::to_string(n) + " floats");
  }
}

// Reduce-scatter and all-gather in one pass: rank `rank` owns one slice of
// the n floats, sums it over every rank's blocks in rank order (rank 0's
// first, then each later rank's, block by block) and writes the sum into
// every rank's buffer. The slices are disjoint, so no two ranks touch the
// same element.
void sum_slice_to_all(InProcessGroup::Impl& g, uint32_t parity, int rank, int p, size_t n) {
  const size_t chunk =
      ((n + size_t(p) - 1) / size_t(p) + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  const size_t lo = std::min(n, size_t(rank) * chunk);
  const size_t hi = std::min(n, lo + chunk);
  g.enter_data_phase();
  float acc[kBlock];
  for (size_t off = lo; off < hi; off += kBlock) {
    const size_t len = std::min(kBlock, hi - off);
    std::memcpy(acc, g.slot(parity, 0).src + off, len * sizeof(float));
    for (int r = 1; r < p; ++r) {
      const Slot& s = g.slot(parity, r);
      for (int b = 0; b < s.blocks; ++b) add_into(acc, s.src + size_t(b) * n + off, len);
    }
    for (int r = 0; r < p; ++r) std::memcpy(g.slot(parity, r).dst + off, acc, len * sizeof(float));
  }
  g.leave_data_phase();
}

}  // namespace

void InProcessCommunicator::all_reduce_sum(float* data, size_t n) {
  const int p = size();
  timed(2 * uint64_t(p - 1) * floats_bytes(n) / uint64_t(p), [&] {
    auto& g = impl();
    check_buffer(g, data, n, "all_reduce_sum", rank_);
    if (p == 1) return g.throw_if_aborted();
    const Slot mine{Op::kAllReduce, n, 0, data, data};  // one block each
    const uint32_t parity = g.round(rank_, &mine, Op::kAllReduce);
    g.check_same(parity);
    sum_slice_to_all(g, parity, rank_, p, n);
    g.round(rank_, nullptr, Op::kAllReduce);  // nobody returns while others still write
  });
}

void InProcessCommunicator::sum_in_piece_order(float* data, const float* pieces, int count,
                                               size_t n) {
  const int p = size();
  timed(2 * uint64_t(p - 1) * floats_bytes(n) / uint64_t(p), [&] {
    auto& g = impl();
    check_buffer(g, data, n, "sum_in_piece_order", rank_);
    if (p == 1) return g.throw_if_aborted();
    if (rank_ > 0 && (count < 0 || (count > 0 && !pieces)))
      g.bad_argument("sum_in_piece_order: rank " + std::to_string(rank_) + " passed " +
                     std::to_string(count) + " pieces at " + (pieces ? "a buffer" : "null"));
    // Rank 0 gives its sum so far, every later rank its pieces in order.
    const Slot mine{Op::kPieceSum, n, 0, rank_ == 0 ? data : pieces, data, rank_ == 0 ? 1 : count};
    const uint32_t parity = g.round(rank_, &mine, Op::kPieceSum);
    g.check_same(parity);
    sum_slice_to_all(g, parity, rank_, p, n);
    g.round(rank_, nullptr, Op::kPieceSum);  // nobody returns while others still write
  });
}

void InProcessCommunicator::all_gather(const float* send, size_t n_per_rank, float* recv) {
  const int p = size();
  timed(uint64_t(p - 1) * floats_bytes(n_per_rank), [&] {
    auto& g = impl();
    check_buffer(g, send, n_per_rank, "all_gather", rank_);
    check_buffer(g, recv, n_per_rank, "all_gather", rank_);
    const size_t bytes = n_per_rank * sizeof(float);
    float* own = recv + size_t(rank_) * n_per_rank;
    if (p == 1) {
      g.throw_if_aborted();
      if (send != own && bytes) std::memcpy(own, send, bytes);
      return;
    }
    const Slot mine{Op::kAllGather, n_per_rank, 0, send, recv};
    const uint32_t parity = g.round(rank_, &mine, Op::kAllGather);
    g.check_same(parity);
    // Each rank pulls into its own recv: writes stay local, reads are shared.
    g.enter_data_phase();
    for (int r = 0; r < p && bytes; ++r) {
      const float* from = g.slot(parity, r).src;
      float* to = recv + size_t(r) * n_per_rank;
      if (from != to) std::memcpy(to, from, bytes);
    }
    g.leave_data_phase();
    g.round(rank_, nullptr, Op::kAllGather);  // peers may still read our send
  });
}

void InProcessCommunicator::reduce_scatter_sum(const float* send, size_t n_per_rank, float* recv) {
  const int p = size();
  timed(uint64_t(p - 1) * floats_bytes(n_per_rank), [&] {
    auto& g = impl();
    check_buffer(g, send, n_per_rank, "reduce_scatter_sum", rank_);
    check_buffer(g, recv, n_per_rank, "reduce_scatter_sum", rank_);
    if (p == 1) {
      g.throw_if_aborted();
      if (send != recv && n_per_rank) std::memcpy(recv, send, n_per_rank * sizeof(float));
      return;
    }
    const Slot mine{Op::kReduceScatter, n_per_rank, 0, send, recv};
    const uint32_t parity = g.round(rank_, &mine, Op::kReduceScatter);
    g.check_same(parity);
    const size_t base = size_t(rank_) * n_per_rank;
    g.enter_data_phase();
    float acc[kBlock];
    for (size_t off = 0; off < n_per_rank; off += kBlock) {
      const size_t len = std::min(kBlock, n_per_rank - off);
      std::memcpy(acc, g.slot(parity, 0).src + base + off, len * sizeof(float));
      for (int r = 1; r < p; ++r) add_into(acc, g.slot(parity, r).src + base + off, len);
      std::memcpy(recv + off, acc, len * sizeof(float));
    }
    g.leave_data_phase();
    g.round(rank_, nullptr, Op::kReduceScatter);
  });
}

void InProcessCommunicator::broadcast(float* data, size_t n, int root) {
  const int p = size();
  timed(p > 1 ? floats_bytes(n) : 0, [&] {
    auto& g = impl();
    check_buffer(g, data, n, "broadcast", rank_);
    if (p == 1) {
      if (root != 0) g.bad_argument("broadcast: root " + std::to_string(root) + " is not a rank");
      return g.throw_if_aborted();
    }
    const Slot mine{Op::kBroadcast, n, root, data, data};
    const uint32_t parity = g.round(rank_, &mine, Op::kBroadcast);
    g.check_same(parity);  // also rejects a root outside the group, on every rank
    if (rank_ != root && n) {
      g.enter_data_phase();
      std::memcpy(data, g.slot(parity, root).src, n * sizeof(float));
      g.leave_data_phase();
    }
    g.round(rank_, nullptr, Op::kBroadcast);
  });
}

void InProcessCommunicator::send(const float* data, size_t n, int peer) {
  timed(floats_bytes(n), [&] {
    auto& g = impl();
    if (peer < 0 || peer >= g.size || peer == rank_) {
      g.bad_argument("send: rank " + std::to_string(rank_) + " cannot send to rank " +
                     std::to_string(peer) + " in a group of " + std::to_string(g.size));
    }
    check_buffer(g, data, n, "send", rank_);
    g.throw_if_aborted();
    Channel& ch = g.channel(rank_, peer);
    ch.data = data;
    ch.n = n;
    const uint32_t seq = ch.posted.value.load(std::memory_order_relaxed) + 1;
    ch.posted.bump();
    g.wait(
        ch.taken, [seq](uint32_t v) { return reached(v, seq); },
        [&](double waited) {
          return "in-process group of " + std::to_string(g.size) + ": rank " +
                 std::to_string(rank_) + " timed out after " + std::to_string(waited) +
                 " s in send to rank " + std::to_string(peer) + " waiting for its recv" +
                 "; group aborted";
        });
  });
}

void InProcessCommunicator::recv(float* data, size_t n, int peer) {
  timed(floats_bytes(n), [&] {
    auto& g = impl();
    if (peer < 0 || peer >= g.size || peer == rank_) {
      g.bad_argument("recv: rank " + std::to_string(rank_) + " cannot receive from rank " +
                     std::to_string(peer) + " in a group of " + std::to_string(g.size));
    }
    check_buffer(g, data, n, "recv", rank_);
    g.throw_if_aborted();
    Channel& ch = g.channel(peer, rank_);
    const uint32_t seq = ch.taken.value.load(std::memory_order_relaxed) + 1;
    g.wait(
        ch.posted, [seq](uint32_t v) { return reached(v, seq); },
        [&](double waited) {
          return "in-process group of " + std::to_string(g.size) + ": rank " +
                 std::to_string(rank_) + " timed out after " + std::to_string(waited) +
                 " s in recv from rank " + std::to_string(peer) + " waiting for its send" +
                 "; group aborted";
        });
    if (ch.n != n) {
      g.abort("in-process group of " + std::to_string(g.size) + ": rank " + std::to_string(peer) +
              " sent " + std::to_string(ch.n) + " floats but rank " + std::to_string(rank_) +
              " expected " + std::to_string(n));
      g.fail();
    }
    if (n) {
      g.enter_data_phase();
      std::memcpy(data, ch.data, n * sizeof(float));
      g.leave_data_phase();
    }
    ch.taken.bump();
  });
}

void InProcessCommunicator::barrier() {
  timed(0, [&] {
    auto& g = impl();
    if (size() == 1) return g.throw_if_aborted();
    const Slot mine{Op::kBarrier, 0, 0, nullptr, nullptr};
    g.check_same(g.round(rank_, &mine, Op::kBarrier));
  });
}

std::vector<std::unique_ptr<Communicator>> make_in_process_communicators(int size) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& c : make_in_process_group(size)) out.push_back(std::move(c));
  return out;
}

}  // namespace troupe
