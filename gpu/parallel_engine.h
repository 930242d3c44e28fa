#pragma once
// One replica split over P pipeline stages of T tensor-parallel shards, each
// shard a device (its own thread, thread pool, weights slice and KV cache).
// Each device's jobs run on its own runner: a plain thread by default, a
// shard actor in the serving runtime (see gpu/device_queue.h); a device that
// dies aborts the step, and every later step, with a message naming it.
// A step is cut into micro-batches that flow through the stages so that
// stages work at the same time; a stage may run at most `credits`
// micro-batches ahead of the stage after it (back-pressure, bounded buffers).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/comm/in_process_communicator.h"
#include "gpu/device_queue.h"
#include "gpu/engine.h"

namespace troupe {

struct ParallelLayout {
  int pipeline = 1;
  int tensor = 1;
  std::vector<int> threads{1};                    // per device (stage-major), or one for all
  std::vector<std::pair<int, int>> stage_layers;  // [begin, end) per stage; empty: equal split
  int microbatches = 0;                           // 0: min(pipeline, sequences in the step)
  int credits = 2;
  std::vector<double> stage_delay_s;  // fault injection: extra seconds per micro-batch per stage
  int block_tokens = 16;
  int blocks = 4096;
};

struct StageStats {
  double busy_s = 0;  // computing (collectives included)
  double comm_s = 0;  // inside collectives
  uint64_t comm_bytes = 0;
};

struct ParallelStats {
  uint64_t steps = 0;
  double wall_s = 0;                   // sum of step wall times
  std::vector<StageStats> stages;      // per stage (rank 0 of its group)
  std::vector<size_t> weight_bytes;    // per device
  std::vector<size_t> streamed_bytes;  // per device: weights one step reads (no embedding)
  std::vector<int>
      max_in_flight;  // per stage boundary: most micro-batches produced, not yet consumed
  double bubble_fraction(int stage) const;
  double comm_share() const;  // time in collectives / busy time, all stages
};

class ParallelEngine : public StepEngine {
 public:
  // Builds every device's shard from the checkpoint and starts its runner
  // with `launcher` (empty: plain threads). Throws std::invalid_argument
  // when the layout does not fit the model.
  ParallelEngine(const Checkpoint& ckpt, DType weight_dtype, ParallelLayout layout,
                 DeviceLauncher launcher = {});
  ~ParallelEngine() override;

  std::vector<int> step(const std::vector<EngineItem>& items) override;
  // Frees a sequence on every device after the steps already launched.
  void release(uint64_t seq) override;

  // A step in two halves, for pipelining across steps: launch returns at
  // once, and steps launched back to back overlap across the stages (each
  // device takes its jobs in launch order), so with P groups of sequences
  // in flight no stage waits for another group's tokens. Steps in flight
  // must hold different sequences. on_done (optional) is called from a
  // device thread when the step's compute is over; finish then returns its
  // ids without waiting. launch, finish, step and release are called from
  // one thread.
  uint64_t launch(const std::vector<EngineItem>& items, std::function<void()> on_done = {});
  std::vector<int> finish(uint64_t ticket);

  const ModelConfig& config() const;
  int pipeline() const;
  // Micro-batches per step from now on (0: one per stage); a tuner sets it.
  void set_microbatches(int m);
  // The last step's (stage, tokens, seconds) per micro-batch, rank 0 of
  // each stage: what a micro-batch tuner learns from.
  struct StageSample {
    int stage;
    size_t tokens;
    double seconds;
  };
  const std::vector<StageSample>& last_samples() const { return last_samples_; }
  ParallelStats stats() const;
  // Full-vocabulary logits of the last step's sampled items, in item order
  // (for tests comparing layouts).
  const std::vector<float>& last_logits() const { return last_logits_; }

 private:
  struct Device;
  struct StepState;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<float> last_logits_;
  std::vector<StageSample> last_samples_;
};

}  // namespace troupe
