#pragma once
// One replica split over P pipeline stages of T tensor-parallel shards, each
// shard a device with its own weights slice and KV cache (gpu/shard.h: a
// CPU thread pool by default, or a GPU given by the options' factory).
// Each device's jobs run on its own runner: a plain thread by default, a
// shard actor in the serving runtime (see gpu/device_queue.h); a device that
// dies aborts the step, and every later step, with a message naming it.
// A step is cut into micro-batches that flow through the stages so that
// stages work at the same time; a stage may run at most `credits`
// micro-batches ahead of the stage after it (back-pressure, bounded buffers).
// The devices may also live in several processes, each running its part of
// the replica (ProcessPlacement below).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/comm/communicator.h"
#include "gpu/device_queue.h"
#include "gpu/engine.h"
#include "gpu/kv_cache.h"
#include "gpu/shard.h"

namespace troupe {

// A replica spanning processes ("hosts", on one machine or several): each
// process runs its part as a ParallelEngine built with the same layout and
// placement but its own this_host, and every part is driven alike. The
// layout includes stage_layers: decide it once (not from each process's own
// layer timings) and give every part the same.
//
// Building: the factories (meant to return GlooCommunicators joined through
// a rendezvous the coordinator serves) are called in one fixed order, the
// same in every process (stage by stage: the ranks of its tensor group held
// here, at once, each on its own thread; then the channels of the boundary
// after it, by host), so that rendezvous which block until every end joins
// never wait on each other.
//
// Driving: every part launches the same items in the same order, with the
// same micro-batch count (the sampling part asks microbatches_for() and the
// others launch_split() with it) and the same keep_logits. The part hosting
// device (P-1, 0) samples: its finish() returns the ids; the others' finish()
// returns once their devices are done with the step, -1 for every item.
//
// Data: a tensor group within this process keeps the in-process
// communicator; one spanning processes uses tensor_group's. A boundary whose
// two sides are here keeps the shared buffers, latches and credits. Across
// processes, (s, 0) sends each micro-batch's output, once computed, to every
// other host of stage s + 1 (by host), where the lowest local rank of s + 1
// receives it before its micro-batch and shares it with the ranks beside it.
// A send returns once the receiver is ready for that micro-batch: back-
// pressure without credits. Nothing deadlocks: every device takes its jobs in
// launch order and its micro-batches in order, the same in every process, so
// both ends of a channel meet its messages in one order; and a send waits
// only for the next stage to finish the previous micro-batch, which waits
// only on stages before it (the last stage waits for no one after it).
// Sampling: when the last stage's group spans processes, each rank outside
// the sampling process sends rank 0, per micro-batch, its best (value, id)
// for every greedy item and its vocabulary slice of every other sampled item
// (of every sampled item with keep_logits), so the sampler picks exactly as
// one process does.
//
// Failures: a cross-process call that fails (a peer lost, a timeout, a
// peer's abort) fails the step here with its CommError, and the device that
// met it dies, so later launches fail naming it. A part whose step fails
// aborts its cross-process communicators: the other parts learn at once,
// not at their timeout. Supervision rebuilds the replica's parts.

// Rank `rank` of stage `stage`'s tensor-parallel group (T ranks).
using TensorGroupFactory = std::function<std::unique_ptr<Communicator>(int stage, int rank)>;
// This process's end of the channel carrying stage `stage`'s activations
// from the process hosting (stage, 0) (rank 0 of the channel) to process
// `to_host` (rank 1); `rank` says which end is asked for.
using BoundaryChannelFactory =
    std::function<std::unique_ptr<Communicator>(int stage, int to_host, int rank)>;

struct ProcessPlacement {
  std::vector<int> host;  // per device (stage-major): its process; empty: all here
  int this_host = 0;
  TensorGroupFactory tensor_group;          // needed by stages whose group spans processes
  BoundaryChannelFactory boundary_channel;  // needed by boundaries between processes
};

// One replica's layout on this process's devices, and how it pipelines.
struct ParallelEngineOptions {
  int pipeline = 1;
  int tensor = 1;
  std::vector<int> threads{1};                    // per device (stage-major), or one for all
  std::vector<std::pair<int, int>> stage_layers;  // [begin, end) per stage; empty: equal split
  int microbatches = 0;                           // 0: min(pipeline, sequences in the step)
  int credits = 2;
  std::vector<double> stage_delay_s;  // fault injection: extra seconds per micro-batch per stage
  int block_tokens = 16;
  int blocks = 4096;
  DType kv_dtype = DType::F32;  // the KV cache's elements (gpu/kv_cache.h)
  ProcessPlacement placement;   // a replica spanning processes; by default all in this one
  // What a device is: empty, a CPU shard with threads[device] threads and
  // `blocks` KV blocks. Called while the engine is built, never after.
  ShardFactory shards;
  // Tensor groups within this process: empty, the in-process communicator.
  LocalGroupFactory local_group;
};

class ParallelEngine : public StepEngine {
 public:
  // Builds the shard of every device placed here from the checkpoint,
  // connects the cross-process communicators, and starts each device's
  // runner with `launcher` (empty: plain threads). Throws
  // std::invalid_argument when the layout does not fit the model or the
  // placement is incomplete, CommError when a rendezvous fails.
  ParallelEngine(const Checkpoint& ckpt, DType weight_dtype, ParallelEngineOptions options,
                 DeviceLauncher launcher = {});
  ~ParallelEngine() override;
  void abort_peers(const std::string& why) override;

  const ModelConfig& config() const override;
  int kv_blocks() const override;
  int block_tokens() const override;
  int stages() const override;
  // Steps launched back to back overlap across the stages (each device
  // takes its jobs in launch order), so with P groups of sequences in
  // flight no stage waits for another group's tokens. on_done is called
  // from a device thread. launch, finish and release are called from one
  // thread.
  uint64_t launch(std::vector<StepItem> items, std::function<void()> on_done = {}) override;
  // launch() cut into exactly `microbatches` micro-batches (at most one per
  // item): how every part of a replica spanning processes cuts a step alike.
  uint64_t launch_split(std::vector<StepItem> items, int microbatches,
                        std::function<void()> on_done = {}) override;
  // The micro-batches launch() cuts a step of `items` items into now.
  int microbatches_for(size_t items) const override;
  // Whether this part samples (hosts device (P-1, 0)); the others' finish()
  // returns -1 for every item.
  bool samples() const;
  std::vector<int> finish(uint64_t ticket) override;
  void release(uint64_t seq) override;
  void set_vocabulary(VocabularySource source) override;
  void set_microbatches(int m) override;
  // A part of a replica spanning processes reports its own devices: a
  // stage's figures are its lowest rank here (zeros where none), its
  // communication the stage's collectives and the activations it sends to
  // other processes (waiting for the previous stage's counts as idle).
  std::vector<StageSample> last_samples() const override { return last_samples_; }
  EngineStats stats() const override;

 private:
  struct Device;
  struct StepState;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<StageSample> last_samples_;
};

}  // namespace troupe
