#pragma once
// Collectives over a group of ranks (tensor-parallel shards, pipeline stages).
// One Communicator object per rank; every rank of the group calls the same
// collectives in the same order with the same sizes. Implementations: InProcessCommunicator
// (gpu/comm/in_process_communicator.h) for ranks that are threads of one
// process; Gloo across processes and NCCL between GPUs plug in here too.
//
// Failure model: a collective never hangs forever on a dead or misbehaving
// peer when the group can be told about it. abort() on any rank's handle
// (called by whoever notices a crashed shard), a size mismatch between ranks,
// a bad argument on one rank, or the group's optional timeout each abort the
// whole group: every rank waiting in it, and every later call, throws
// CommError. An aborted group stays aborted; recovery builds a new group.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
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
  // Whether the pointers given to collectives are device (GPU) memory, as
  // NCCL's are; a GPU shard stages its buffers through the host otherwise.
  virtual bool device_pointers() const { return false; }

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
  // Point to point. send returns once the peer has posted the matching recv
  // (in-process: once the peer has copied the data; across processes: once
  // the data is written to the connection): synchronous, like MPI_Ssend, with
  // no hidden buffering of unmatched sends, so two ranks that send to each
  // other at the same time deadlock; order exchanges (e.g. even ranks first).
  virtual void send(const float* data, size_t n, int peer) = 0;
  virtual void recv(float* data, size_t n, int peer) = 0;
  virtual void barrier() = 0;
  // Any thread: fails the group as described above, so that no rank waits
  // for a peer that will not come; the first reason wins. How an engine
  // holding communicators of several kinds stops them all alike.
  virtual void abort(const std::string& reason) = 0;

  // The in-order sum of every rank's pieces (ranks in order, each rank's
  // pieces in order), on every rank: rank 0 passes the in-order sum of its own
  // pieces in `data`; every other rank passes its `count` pieces of n floats
  // (pieces + i * n) and gets the total in `data`. Unlike all_reduce_sum's,
  // the result equals adding all the pieces one after the other on one
  // device, whatever the number of ranks. Default: each rank adds its pieces
  // onto the sum of the ranks before it (a chain of sends), and the last
  // broadcasts.
  virtual void sum_in_piece_order(float* data, const float* pieces, int count, size_t n);

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

// Runs make(rank) for every rank at once, each on its own thread, and
// returns the communicators in the order of `ranks`: joining a group (a
// rendezvous, NCCL's init) returns only once every rank has joined. The
// first rank's exception, if any, is rethrown once all have finished.
std::vector<std::unique_ptr<Communicator>> join_at_once(
    const std::vector<int>& ranks, const std::function<std::unique_ptr<Communicator>(int)>& make);

}  // namespace troupe
