#include "gpu/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/kernels.h"

namespace troupe {

namespace {

// ncclCommInitRankConfig and non-blocking communicators came with 2.14.
constexpr int kMinVersion = 21400;

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

using Clock = std::chrono::steady_clock;

}  // namespace

NcclUniqueId make_nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw CommError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  NcclUniqueId out;
  static_assert(sizeof(id.internal) == std::tuple_size_v<NcclUniqueId>);
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

int nccl_runtime_version() {
  int v = 0;
  const ncclResult_t r = ncclGetVersion(&v);
  if (r != ncclSuccess) throw CommError(std::string("ncclGetVersion: ") + ncclGetErrorString(r));
  return v;
}

NcclCommunicator::NcclCommunicator(const NcclUniqueId& id, int rank, int size, int device,
                                   NcclOptions options)
    : rank_(rank), size_(size), device_(device), options_(options) {
  if (size < 1 || rank < 0 || rank >= size)
    throw CommError("NCCL rank " + std::to_string(rank) + " of " + std::to_string(size) +
                    " is out of range");
  const int version = nccl_runtime_version();
  if (version < kMinVersion)
    throw CommError("NCCL " + version_text(version) +
                    " at run time is older than 2.14, which non-blocking initialisation needs");
  cu::check(cudaSetDevice(device), "cudaSetDevice");
  cu::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cu::check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  watchdog_ = std::thread([this] { watchdog_loop(); });
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  try {
    check_nccl(ncclCommInitRankConfig(&comm_, size, nid, rank, &config), "ncclCommInitRankConfig");
    // The rank-ordered sums' gather buffer, before any step.
    if (options_.reserve_floats > 0) scratch(options_.reserve_floats * size_t(size_));
  } catch (...) {
    shutdown();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  shutdown();
}

void NcclCommunicator::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  cudaSetDevice(device_);
  if (comm_) {
    // Abort rather than finalize: a clean finalize waits for peers that may
    // be gone, and the group is never reused.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  if (scratch_) cudaFree(scratch_), scratch_ = nullptr;
  if (done_) cudaEventDestroy(done_), done_ = nullptr;
  if (stream_) cudaStreamDestroy(stream_), stream_ = nullptr;
}

void NcclCommunicator::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.exchange(true)) return;
  reason_ = reason;
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclCommunicator::watch(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_ = what;
  deadline_ = Clock::now() + options_.timeout;
  cv_.notify_all();
}

void NcclCommunicator::unwatch() {
  std::lock_guard<std::mutex> lock(mu_);
  watched_ = nullptr;
}

void NcclCommunicator::watchdog_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!watched_) {
      cv_.wait(lock);
      continue;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(1));
    if (!watched_ || aborted_.load() || !comm_) continue;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    std::string why;
    if (state != ncclSuccess && state != ncclInProgress)
      why = std::string("NCCL reported an error during ") + watched_ + ": " +
            ncclGetErrorString(state);
    else if (Clock::now() > deadline_)
      why = std::string(watched_) + " did not finish within " +
            std::to_string(options_.timeout.count()) + " ms";
    if (why.empty()) continue;
    aborted_ = true;
    reason_ = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + why;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclCommunicator::check_nccl(int result, const char* what) {
  auto fail = [&](const std::string& why) {
    abort(why);
    std::lock_guard<std::mutex> lock(mu_);
    throw CommError(reason_);
  };
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    throw CommError(reason_);
  }
  ncclResult_t r = ncclResult_t(result);
  if (r == ncclInProgress) {
    watch(what);
    while (r == ncclInProgress && !aborted_.load()) {
      std::this_thread::yield();
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_) ncclCommGetAsyncError(comm_, &r);
    }
    unwatch();
    if (aborted_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      throw CommError(reason_);
    }
  }
  if (r != ncclSuccess) fail(std::string(what) + ": " + ncclGetErrorString(r));
}

template <class Call>
void NcclCommunicator::enqueue(const char* what, Call&& call) {
  // The caller may be any thread (a shard's, or supervision's): its current
  // GPU need not be this rank's, and the stream and buffers are on this one.
  cu::check(cudaSetDevice(device_), "cudaSetDevice");
  int result = 0;
  {
    // Under the lock: abort() (any thread, the watchdog) frees comm_.
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.load() || !comm_)
      throw CommError(reason_.empty() ? "NCCL group is gone" : reason_);
    result = call(comm_);
  }
  check_nccl(result, what);
}

void NcclCommunicator::finish_call(const char* what, uint64_t bytes, Clock::time_point t0) {
  cu::check(cudaEventRecord(done_, stream_), "cudaEventRecord");
  watch(what);
  cudaError_t e;
  while ((e = cudaEventQuery(done_)) == cudaErrorNotReady && !aborted_.load())
    std::this_thread::yield();
  unwatch();
  record(bytes, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0));
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    throw CommError(reason_);
  }
  if (e != cudaSuccess) {
    abort(std::string(what) + ": " + cudaGetErrorString(e));
    throw CommError(reason_);
  }
}

float* NcclCommunicator::scratch(size_t floats) {
  cu::check(cudaSetDevice(device_), "cudaSetDevice");  // as in enqueue()
  if (floats <= scratch_floats_) return scratch_;
  // Sized at construction (NcclOptions::reserve_floats) for the largest
  // step; a larger call still works, at the cost of a device-wide
  // synchronisation and an allocation.
  cu::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (scratch_) cudaFree(scratch_);
  scratch_ = nullptr;
  cu::check(cudaMalloc(reinterpret_cast<void**>(&scratch_), floats * sizeof(float)),
            "NCCL scratch");
  scratch_floats_ = floats;
  return scratch_;
}

void NcclCommunicator::all_reduce_sum(float* data, size_t n) {
  const auto t0 = Clock::now();
  const uint64_t bytes = uint64_t(2 * (size_ - 1)) * n * sizeof(float) / uint64_t(size_);
  if (options_.rank_ordered_sums) {
    float* gathered = scratch(n * size_t(size_));
    enqueue("ncclAllGather",
            [&](ncclComm* c) { return ncclAllGather(data, gathered, n, ncclFloat, c, stream_); });
    cu::sum_ranks(gathered, size_, n, data, stream_);
  } else {
    enqueue("ncclAllReduce", [&](ncclComm* c) {
      return ncclAllReduce(data, data, n, ncclFloat, ncclSum, c, stream_);
    });
  }
  finish_call("all_reduce_sum", bytes, t0);
}

void NcclCommunicator::all_gather(const float* send, size_t n, float* recv) {
  const auto t0 = Clock::now();
  enqueue("ncclAllGather",
          [&](ncclComm* c) { return ncclAllGather(send, recv, n, ncclFloat, c, stream_); });
  finish_call("all_gather", uint64_t(size_ - 1) * n * sizeof(float), t0);
}

void NcclCommunicator::reduce_scatter_sum(const float* send, size_t n, float* recv) {
  const auto t0 = Clock::now();
  const uint64_t bytes = uint64_t(size_ - 1) * n * sizeof(float);
  if (!options_.rank_ordered_sums) {
    enqueue("ncclReduceScatter", [&](ncclComm* c) {
      return ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, c, stream_);
    });
    finish_call("reduce_scatter_sum", bytes, t0);
    return;
  }
  // Every rank's block number rank(), side by side, then summed in order.
  float* blocks = scratch(n * size_t(size_));
  cu::check(cudaMemcpyAsync(blocks + size_t(rank_) * n, send + size_t(rank_) * n, n * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream_),
            "copy own block");
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  try {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      enqueue("ncclSend", [&](ncclComm* c) {
        return ncclSend(send + size_t(peer) * n, n, ncclFloat, peer, c, stream_);
      });
      enqueue("ncclRecv", [&](ncclComm* c) {
        return ncclRecv(blocks + size_t(peer) * n, n, ncclFloat, peer, c, stream_);
      });
    }
  } catch (...) {
    // Aborted meanwhile: the group still ends, or every later NCCL call of
    // this thread (a rebuilt communicator's too) would wait for its end.
    ncclGroupEnd();
    throw;
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  cu::sum_ranks(blocks, size_, n, recv, stream_);
  finish_call("reduce_scatter_sum", bytes, t0);
}

void NcclCommunicator::broadcast(float* data, size_t n, int root) {
  const auto t0 = Clock::now();
  enqueue("ncclBroadcast",
          [&](ncclComm* c) { return ncclBroadcast(data, data, n, ncclFloat, root, c, stream_); });
  finish_call("broadcast", size_ > 1 ? n * sizeof(float) : 0, t0);
}

void NcclCommunicator::send(const float* data, size_t n, int peer) {
  const auto t0 = Clock::now();
  enqueue("ncclSend", [&](ncclComm* c) { return ncclSend(data, n, ncclFloat, peer, c, stream_); });
  finish_call("send", n * sizeof(float), t0);
}

void NcclCommunicator::recv(float* data, size_t n, int peer) {
  const auto t0 = Clock::now();
  enqueue("ncclRecv", [&](ncclComm* c) { return ncclRecv(data, n, ncclFloat, peer, c, stream_); });
  finish_call("recv", n * sizeof(float), t0);
}

void NcclCommunicator::barrier() {
  const auto t0 = Clock::now();
  float* one = scratch(1);
  enqueue("ncclAllReduce",
          [&](ncclComm* c) { return ncclAllReduce(one, one, 1, ncclFloat, ncclSum, c, stream_); });
  finish_call("barrier", 0, t0);
}

ArgMax NcclCommunicator::all_argmax(float value, int index) {
  // The pair travels as two floats (the index as its bits), gathered on the
  // device and read back.
  float mine[2];
  mine[0] = value;
  std::memcpy(&mine[1], &index, sizeof index);
  float* buf = scratch(2 + 2 * size_t(size_));
  cu::check(cudaMemcpyAsync(buf, mine, sizeof mine, cudaMemcpyHostToDevice, stream_),
            "copy argmax pair");
  all_gather(buf, 2, buf + 2);
  std::vector<float> all(2 * size_t(size_));
  cu::check(cudaMemcpy(all.data(), buf + 2, all.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "copy argmax pairs");
  ArgMax best;
  best.value = std::nanf("");
  for (int r = 0; r < size_; ++r) {
    ArgMax c;
    c.value = all[2 * size_t(r)];
    std::memcpy(&c.index, &all[2 * size_t(r) + 1], sizeof c.index);
    if (argmax_better(c, best)) best = c;
  }
  return best;
}

}  // namespace troupe
