#pragma once
// The Communicator over NCCL, for ranks that are GPUs (one rank per GPU:
// NCCL refuses two ranks on one device). Pointers given to collectives are
// device pointers on the rank's device; each call queues its NCCL work on the
// communicator's stream and returns once it is done, as the interface says.
//
// Failure model, as the interface's: NCCL has no per-operation timeout, so a
// watchdog thread polls ncclCommGetAsyncError while a call (or the
// non-blocking initialisation) is in flight and calls ncclCommAbort when NCCL
// reports an error or the deadline passes; abort() does the same from any
// thread (supervision tearing a group down). The waiting call, and every
// later one, throws CommError naming the reason. An aborted communicator
// stays aborted; recovery builds a new one with a new unique id.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "gpu/comm/communicator.h"

struct ncclComm;
struct CUstream_st;
struct CUevent_st;

namespace troupe {

// ncclUniqueId's 128 bytes, so that the coordinating actor can create one on
// one rank and hand it to the others without including nccl.h.
using NcclUniqueId = std::array<char, 128>;

// A fresh id (ncclGetUniqueId); throws CommError.
NcclUniqueId make_nccl_unique_id();
// The NCCL library's version at run time (ncclGetVersion), e.g. 22809 for
// 2.28.9; the machine's NCCL may differ from the headers built against.
int nccl_runtime_version();

struct NcclOptions {
  // Longest a call (or the initialisation) may take before the watchdog
  // aborts the communicator.
  std::chrono::milliseconds timeout{60000};
  // all_reduce_sum and reduce_scatter_sum as a gather plus a sum in rank
  // order, which is the interface's contract (bit-identical to the other
  // communicators). false: NCCL's own reductions, faster for large vectors,
  // identical on every rank but summed in NCCL's order.
  bool rank_ordered_sums = true;
  // Floats per rank of the largest sum a step makes (tokens x model width):
  // the rank-ordered sums' scratch is allocated for it at construction, so
  // that no step allocates (cudaFree would synchronise the whole device).
  size_t reserve_floats = 0;
};

class NcclCommunicator : public Communicator {
 public:
  // Joins the group `id` as `rank` of `size` on CUDA device `device`.
  // Throws CommError (initialisation failed or timed out, NCCL older than
  // 2.14 at run time) or std::runtime_error (CUDA).
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, int device,
                   NcclOptions options = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_pointers() const override { return true; }

  void all_reduce_sum(float* data, size_t n) override;
  void all_gather(const float* send, size_t n_per_rank, float* recv) override;
  void reduce_scatter_sum(const float* send, size_t n_per_rank, float* recv) override;
  void broadcast(float* data, size_t n, int root) override;
  void send(const float* data, size_t n, int peer) override;
  void recv(float* data, size_t n, int peer) override;
  void barrier() override;
  // value and index are host values, as in the interface.
  ArgMax all_argmax(float value, int index) override;

  // Aborts the group from any thread: the call in flight and every later
  // one throw CommError(reason). The first reason wins.
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }

 private:
  // Stops the watchdog and frees the communicator, stream and scratch.
  void shutdown();
  // Throws CommError for an aborted communicator or a failed NCCL call;
  // waits out ncclInProgress (non-blocking mode) under the watchdog.
  void check_nccl(int result, const char* what);
  // Queues one NCCL call on comm_ (call(comm) returns its ncclResult_t)
  // while abort() cannot free it, then checks the result.
  template <class Call>
  void enqueue(const char* what, Call&& call);
  // Waits for the work queued on the stream, watched; records the call.
  void finish_call(const char* what, uint64_t bytes, std::chrono::steady_clock::time_point t0);
  void watch(const char* what);
  void unwatch();
  void watchdog_loop();
  float* scratch(size_t floats);

  int rank_, size_, device_;
  NcclOptions options_;
  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  CUevent_st* done_ = nullptr;
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;

  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string reason_;
  const char* watched_ = nullptr;  // the call in flight, or null
  std::chrono::steady_clock::time_point deadline_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace troupe
