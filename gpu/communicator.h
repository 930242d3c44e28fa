#pragma once
// Collectives over a group of ranks (tensor-parallel shards, pipeline stages).
// One Communicator object per rank; every rank of the group calls the same
// collectives in the same order with the same sizes. NCCL implements the same
// interface for CUDA devices; InProcessCommunicator below is the CPU one, for
// ranks that are threads of one process.
//
// Failure model: a collective never hangs forever on a dead or misbehaving
// peer when the group can be told about it. InProcessGroup::abort() (called by
// whoever notices a crashed shard), a size mismatch between ranks, a bad
// argument on one rank, or the group's optional timeout each abort the whole
// group: every rank waiting in it, and every later call, throws CommError.
// An aborted group stays aborted; recovery builds a new group.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

// Thrown by a collective of an aborted group; what() says why it aborted.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Per-rank counters for metrics ("communication share" = seconds / step time).
// bytes follows the bus-bandwidth convention of nccl-tests, so that in-process
// and NCCL figures compare: per rank, all_reduce moves 2(P-1)/P of the
// vector, all_gather and reduce_scatter (P-1)/P of the full vector, broadcast,
// send and recv the whole message; barriers and P = 1 move nothing.
struct CommStats {
  uint64_t calls = 0;  // collectives and point-to-point calls, finished or thrown
  uint64_t bytes = 0;  // see above
  double seconds = 0;  // wall time inside calls, waiting for peers included
};

// The winner of a distributed argmax: the largest value, ties to the lowest
// index; NaN values and negative indices (a rank with no candidate) never win.
struct ArgMax {
  float value = 0;
  int index = -1;  // -1: no rank had a candidate
};

// True when `a` beats `b` under the rule above.
bool argmax_better(const ArgMax& a, const ArgMax& b);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Element-wise sum over ranks, in place. The result is bit-identical on
  // every rank and from run to run: each element is summed in rank order
  // 0..P-1 (float addition is not associative; the order is part of the
  // contract, so that "same answer, any layout" can hold).
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // recv (P * n_per_rank floats) = the ranks' `send` blocks in rank order.
  // send may point into recv at this rank's own block.
  virtual void all_gather(const float* send, size_t n_per_rank, float* recv) = 0;
  // recv (n_per_rank) = sum over ranks, in rank order, of their send block
  // number rank() (send holds P * n_per_rank floats). recv may point into
  // send at this rank's own block.
  virtual void reduce_scatter_sum(const float* send, size_t n_per_rank, float* recv) = 0;
  // Every rank's data (n floats) becomes root's.
  virtual void broadcast(float* data, size_t n, int root) = 0;
  // Point to point. send returns once the peer has the data (synchronous, like
  // MPI_Ssend: no hidden buffering), so two ranks that send to each other at
  // the same time deadlock; order exchanges (e.g. even ranks send first).
  virtual void send(const float* data, size_t n, int peer) = 0;
  virtual void recv(float* data, size_t n, int peer) = 0;
  virtual void barrier() = 0;

  // Each rank passes its local best (value, global index); every rank gets the
  // group's best. Greedy sampling over a vocabulary split across ranks uses it
  // instead of gathering the logits. Default: an all_gather of the pairs.
  virtual ArgMax all_argmax(float value, int index);

  // Thread-safe (a metrics thread may read while the rank runs).
  CommStats stats() const;
  void reset_stats();

 protected:
  // Implementations call this once per call, also when it throws.
  void record(uint64_t bytes, std::chrono::nanoseconds elapsed);

 private:
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> nanos_{0};
};

struct InProcessGroupOptions {
  // A rank that waits longer than this for its peers in one call aborts the
  // group (naming the ranks it waited for). Zero: wait until aborted.
  std::chrono::nanoseconds timeout{0};
};

class InProcessCommunicator;

// The shared state of P ranks that are threads of one process: a
// generation-counted barrier, the buffers each rank published for the current
// collective (data moves directly between the ranks' own buffers; nothing is
// staged), and one rendezvous channel per ordered pair for send/recv.
class InProcessGroup : public std::enable_shared_from_this<InProcessGroup> {
 public:
  static std::shared_ptr<InProcessGroup> create(int size, InProcessGroupOptions options = {});
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;

  // The handle of `rank`; at most one live handle per rank. Destroying a
  // handle aborts the group ("rank R left the group"): a shard that dies
  // unwinds its handle, and its peers must not wait for it.
  std::unique_ptr<InProcessCommunicator> communicator(int rank);

  // Wakes every rank waiting in this group with CommError(reason) and makes
  // every later call throw it. Any thread may call it; the first reason wins.
  void abort(const std::string& reason);
  bool aborted() const;
  std::string abort_reason() const;

  struct Impl;  // defined in communicator.cpp

 private:
  InProcessGroup(int size, InProcessGroupOptions options);
  std::unique_ptr<Impl> impl_;
  friend class InProcessCommunicator;
};

// One rank's handle. Use from one thread at a time; different ranks' handles
// are used concurrently, which is the point.
class InProcessCommunicator : public Communicator {
 public:
  ~InProcessCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override;
  InProcessGroup& group() { return *group_; }

  void all_reduce_sum(float* data, size_t n) override;
  void all_gather(const float* send, size_t n_per_rank, float* recv) override;
  void reduce_scatter_sum(const float* send, size_t n_per_rank, float* recv) override;
  void broadcast(float* data, size_t n, int root) override;
  void send(const float* data, size_t n, int peer) override;
  void recv(float* data, size_t n, int peer) override;
  void barrier() override;

 private:
  friend class InProcessGroup;
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank);
  InProcessGroup::Impl& impl() const { return *group_->impl_; }
  // Runs body and records the call in the counters, also when it throws.
  template <class Body>
  void timed(uint64_t bytes, Body&& body);

  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

// A new group of `size` ranks and its handles, rank i at index i.
std::vector<std::unique_ptr<InProcessCommunicator>> make_in_process_group(
    int size, InProcessGroupOptions options = {});

}  // namespace troupe
