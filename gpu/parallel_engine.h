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
#include "gpu/kv_cache.h"

namespace troupe {

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
};

class ParallelEngine : public StepEngine {
 public:
  // Builds every device's shard from the checkpoint and starts its runner
  // with `launcher` (empty: plain threads). Throws std::invalid_argument
  // when the layout does not fit the model.
  ParallelEngine(const Checkpoint& ckpt, DType weight_dtype, ParallelEngineOptions options,
                 DeviceLauncher launcher = {});
  ~ParallelEngine() override;

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
  std::vector<int> finish(uint64_t ticket) override;
  void release(uint64_t seq) override;
  void set_microbatches(int m) override;
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
