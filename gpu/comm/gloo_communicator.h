#pragma once
// The Communicator across processes and machines, on Gloo's TCP transport
// (Gloo 0.5, Debian libgloo-dev): the data plane of a replica whose shards or
// stages live in different processes. Each rank is one GlooCommunicator with
// its own Gloo device (an I/O thread) and a full mesh of TCP connections.
//
// Sum order. The contract (communicator.h) sums every element in rank order
// 0..P-1, so that results are bit-identical to InProcessCommunicator in any
// layout. Gloo's ring all-reduce adds in ring order, which depends on where
// the element sits, so none of Gloo's collectives are used; every collective
// is built here from Gloo's point-to-point messages:
//   all_reduce_sum = a reduce-scatter round (rank c receives chunk c of every
//   peer's vector and adds the P copies locally, rank 0's first, in blocks
//   that stay in L1) then an all-gather round (rank c sends its summed chunk
//   to every peer). Each rank moves 2(P-1)/P of the vector, as a ring does,
//   in two rounds of P-1 messages in each direction instead of 2(P-1) steps;
//   the second round's receives are posted with the first's, so a peer that
//   finishes its sum early never waits for this rank to be ready.
//   reduce_scatter_sum is the first round alone; all_gather, broadcast and
//   barrier are one round of direct messages.
//
// Failures. A call fails, and the communicator stays failed (every later
// call throws CommError at once; the group is rebuilt with a new
// GlooOptions::group), when:
//   - a peer's connection breaks (the peer died, or closed its end because it
//     failed): "lost rank 2 (node-c): Connection reset by peer ...". Each
//     rank keeps a receive posted from every peer on a control slot, and one
//     monitor thread per peer waits on it; a broken connection fails that
//     receive at once, so the loss is noticed even while the rank waits on
//     another peer, or between calls.
//   - a call waits longer than GlooOptions::timeout (a stopped or hung peer):
//     a watchdog thread fails the group naming the ranks the call still
//     waited for. Gloo's own wait timeouts are set far beyond, as a backstop.
//   - abort(reason) from any thread: pending and later calls throw
//     CommError(reason).
//   - a peer reports that it failed (below).
// Whoever fails first sends every peer a short note on the control slot
// ("rank 1 (node-b) failed: lost rank 2 (node-c): ..."), interrupts the waits
// of the call in progress (Gloo's abortWaitRecv/abortWaitSend), then closes
// its connections (which also stops any transfer into the caller's buffers).
// The note travels ahead of the close on the same connection, so a peer
// learns the first cause, not "lost rank 1". A call whose data had all
// arrived when the group failed still returns normally; the next one throws.
// (Waiting in short slices that check an abort flag does not work in Gloo
// 0.5: a wait that times out closes every connection of its context.)
// Measured over loopback on a loaded 2-core machine: abort() to CommError in
// the waiting rank 1.5-10 ms (closing connections waits for a tick of Gloo's
// I/O loop, up to 10 ms); a SIGKILLed peer noticed in about 2 ms; a
// SIGSTOPped one at the timeout plus 10-20 ms.
//
// Mismatched calls (different collectives or sizes on different ranks) cannot
// be matched by Gloo: every message's tag carries its kind, sequence number
// and byte count, so mismatched messages never pair up, and the call times
// out on every rank instead of corrupting memory. A bad argument (a null
// buffer, a peer outside the group) fails the group at once and throws
// std::invalid_argument.
//
// send returns once the peer has posted the matching recv and the data is
// written to the connection (Gloo sends nothing before the receiver is
// ready): the contract's send, so two ranks that send to each other first
// wait for each other (until the timeout); order exchanges. A zero-length
// send or recv moves nothing and does not wait for the peer.
//
// SIGPIPE: Gloo writes without MSG_NOSIGNAL, so the first communicator of a
// process with more than one rank sets SIGPIPE to SIG_IGN (unless the process
// has its own handler); a write to a closed connection then fails as an error.
//
// Stats: every call is recorded (communicator.h's bus-bandwidth bytes), also
// one that throws, which records its time and no bytes, as the in-process
// communicator does.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu/comm/communicator.h"
#include "gpu/comm/rendezvous_store.h"

namespace troupe {

struct GlooOptions {
  // Prefix of this group's rendezvous keys; the same on every rank. A group
  // rebuilt after a failure uses a new one.
  std::string group = "troupe";
  // A call that waits longer than this for its peers fails the group. Also
  // bounds the rendezvous; connecting the mesh may take up to 5x (Gloo's).
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // This host's address: bound for the connections and advertised to peers.
  std::string bind_address = "127.0.0.1";
  // Names of the ranks for messages ("node-b"), rank i at index i; empty
  // for none, else one per rank.
  std::vector<std::string> peer_names;
};

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group as `rank` of `size`: publishes this rank's addresses in
  // `store` (used only while constructing) and connects to every peer.
  // Blocks until all ranks have joined; throws CommError naming the ranks
  // that did not join within the timeout, std::invalid_argument for bad
  // options.
  GlooCommunicator(int rank, int size, RendezvousStore& store, GlooOptions options = {});
  // Tells the peers "rank R left the group" (their later calls throw) unless
  // the group failed already, then closes the connections. No call of this
  // rank may be in progress.
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override;
  int size() const override;

  void all_reduce_sum(float* data, size_t n) override;
  void all_gather(const float* send, size_t n_per_rank, float* recv) override;
  void reduce_scatter_sum(const float* send, size_t n_per_rank, float* recv) override;
  void broadcast(float* data, size_t n, int root) override;
  void send(const float* data, size_t n, int peer) override;
  void recv(float* data, size_t n, int peer) override;
  void barrier() override;

  // Any thread: the call in progress and every later call throw
  // CommError(reason), and the peers are told ("rank R aborted: reason").
  // The first failure's reason wins.
  void abort(const std::string& reason) override;
  bool failed() const;
  std::string failure_reason() const;

  struct Impl;  // gloo_communicator.cpp

 private:
  template <class Body>
  void timed(uint64_t bytes, Body&& body);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
