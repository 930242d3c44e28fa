#pragma once
// The Communicator for ranks that are threads of one process: data moves
// directly between the ranks' own buffers.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu/comm/communicator.h"

namespace troupe {

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
  // One pass like all_reduce_sum's (each rank sums a slice of every rank's
  // pieces in order and writes it to all), not a chain of sends.
  void sum_in_piece_order(float* data, const float* pieces, int count, size_t n) override;
  void send(const float* data, size_t n, int peer) override;
  void recv(float* data, size_t n, int peer) override;
  void barrier() override;
  // Aborts the whole group (InProcessGroup::abort).
  void abort(const std::string& reason) override;

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
// The same, as Communicators (what layouts hold).
std::vector<std::unique_ptr<Communicator>> make_in_process_communicators(int size);

}  // namespace troupe
