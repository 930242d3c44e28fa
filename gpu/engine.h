#pragma once
// What a replica's worker drives: a StepEngine runs batched steps of
// StepItems on one device (Engine, here) or on a parallel layout of devices
// (ParallelEngine), and a GPU backend implements the same interface. The
// replica's scheduler owns the KV-block book and sends every item with its
// block table and position; an engine keeps only per-sequence samplers.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpu/cpu/thread_choice.h"
#include "gpu/cpu/thread_pool.h"
#include "gpu/model.h"
#include "gpu/sampler.h"
#include "service/step_item.h"

namespace troupe {

// Busy and communication time of one pipeline stage (rank 0 of its group).
struct StageStats {
  double busy_s = 0;  // computing (collectives included)
  double comm_s = 0;  // inside collectives
  uint64_t comm_bytes = 0;
};

// Counters since the engine started. Subtract two snapshots (since()) for
// the figures of an interval.
struct EngineStats {
  uint64_t steps = 0;
  double wall_s = 0;                   // time with at least one step in flight
  std::vector<StageStats> stages;      // per pipeline stage
  std::vector<size_t> weight_bytes;    // per device
  std::vector<size_t> streamed_bytes;  // per device: weights one decode step reads
  std::vector<int> max_in_flight;      // per stage boundary: most micro-batches buffered

  // Idle share of the wall time of one stage: the pipeline bubble.
  double bubble_fraction(int stage) const;
  // Time in collectives over busy time, all stages together.
  double comm_share() const;
  uint64_t comm_bytes() const;
  // The counters of the interval between `before` and this snapshot.
  EngineStats since(const EngineStats& before) const;
};

// How long one stage took for one micro-batch: what a micro-batch tuner
// learns from.
struct StageSample {
  int stage = 0;
  size_t tokens = 0;
  double seconds = 0;
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;

  virtual const ModelConfig& config() const = 0;
  // KV blocks each device holds, and positions per block: the size of the
  // book the scheduler keeps for this engine.
  virtual int kv_blocks() const = 0;
  virtual int block_tokens() const = 0;
  // Pipeline stages: how many steps can usefully be in flight at once.
  virtual int stages() const { return 1; }

  // Starts a step and returns its ticket. Steps launched back to back may
  // overlap (on a pipeline each device takes its jobs in launch order);
  // steps in flight must hold different sequences. `on_done` (optional) is
  // called, possibly before launch returns and possibly from a device
  // thread, once the step's compute is over; finish() then returns at once.
  // Throws at once when the engine cannot take a step (a dead device).
  virtual uint64_t launch(std::vector<StepItem> items, std::function<void()> on_done = {}) = 0;
  // The sampled ids of a launched step, one per item (-1 where sample is
  // false), waiting for it if needed. Throws the step's error.
  virtual std::vector<int> finish(uint64_t ticket) = 0;
  // launch + finish.
  std::vector<int> step(std::vector<StepItem> items);
  // A replica spanning processes runs each step on every part, cut into the
  // same micro-batches: the part that samples says how many
  // (microbatches_for) and every part launches with that count.
  virtual int microbatches_for(size_t /*items*/) const { return 1; }
  virtual uint64_t launch_split(std::vector<StepItem> items, int /*microbatches*/,
                                std::function<void()> on_done = {}) {
    return launch(std::move(items), std::move(on_done));
  }
  // Forgets a sequence's sampler; unknown ids are ignored.
  virtual void release(uint64_t seq) = 0;
  // A part of a replica spanning processes going away tells the other parts
  // why: their collectives fail with `why`. Engines with no peers ignore it.
  virtual void abort_peers(const std::string& /*why*/) {}
  // The model's tokens as text, which sequences with a grammar (structured
  // output) are sampled by; called before the first step. Engines that
  // sample on a device ignore it: the front end refuses grammars for them.
  virtual void set_vocabulary(VocabularySource /*source*/) {}

  // Micro-batches per step from now on (0: the engine's default); only
  // pipelines have a use for it.
  virtual void set_microbatches(int /*m*/) {}
  // The last finished step's per-stage, per-micro-batch times.
  virtual std::vector<StageSample> last_samples() const = 0;
  virtual EngineStats stats() const = 0;

  // Tests comparing layouts: keep every sampled item's full-vocabulary
  // logits (in item order) for last_logits(). Off by default: it copies a
  // vocabulary per item per step.
  void keep_logits(bool on) { keep_logits_ = on; }
  const std::vector<float>& last_logits() const { return last_logits_; }

  // The last finish()'s log-probabilities, one per item: set where the item
  // sampled and its sampling asks for them (SamplingParams::logprobs).
  const std::vector<std::optional<TokenLogprobs>>& last_logprobs() const { return last_logprobs_; }
  // The last finish()'s prompt log-probabilities, one list per item: those
  // of the prompt tokens its rows predict where it wants them
  // (StepItem::wants_prompt_logprobs), else empty.
  const std::vector<std::vector<TokenLogprobs>>& last_prompt_logprobs() const {
    return last_prompt_logprobs_;
  }

 protected:
  bool keep_logits_ = false;
  std::vector<float> last_logits_;
  std::vector<std::optional<TokenLogprobs>> last_logprobs_;
  std::vector<std::vector<TokenLogprobs>> last_prompt_logprobs_;
};

struct EngineOptions {
  int threads = 1;
  int block_tokens = 16;
  int blocks = 4096;
  DType kv_dtype = DType::F32;  // the KV cache's elements (gpu/kv_cache.h)
};

// One device holding the whole model. Steps run synchronously inside
// launch(), on the caller's thread and the engine's thread pool, or on the
// caller's thread alone where that measures faster (gpu/cpu/thread_choice.h:
// `threads` is the most a step uses).
class Engine : public StepEngine {
 public:
  Engine(std::shared_ptr<const Model> model, EngineOptions options);

  const ModelConfig& config() const override { return model_->config(); }
  int kv_blocks() const override { return options_.blocks; }
  int block_tokens() const override { return options_.block_tokens; }
  uint64_t launch(std::vector<StepItem> items, std::function<void()> on_done = {}) override;
  std::vector<int> finish(uint64_t ticket) override;
  void release(uint64_t seq) override { samplers_.release(seq); }
  void set_vocabulary(VocabularySource source) override {
    samplers_.set_vocabulary(std::move(source));
  }
  std::vector<StageSample> last_samples() const override { return last_samples_; }
  EngineStats stats() const override;

  const Model& model() const { return *model_; }

 private:
  struct Result;
  std::vector<int> run(const std::vector<StepItem>& items, int tokens, Result& r);

  std::shared_ptr<const Model> model_;
  EngineOptions options_;
  KvCache cache_;
  ThreadPool pool_;
  ThreadPool serial_{1};
  ThreadChoice choice_;
  Workspace ws_;
  SequenceSamplers samplers_;
  std::vector<float> logits_, row_logits_;
  std::vector<StageSample> last_samples_;
  // Finished steps not yet collected: their ids, or the error they threw.
  struct Result {
    std::vector<int> ids;
    std::vector<std::optional<TokenLogprobs>> logprobs;
    std::vector<std::vector<TokenLogprobs>> prompt_logprobs;
    std::exception_ptr error;
  };
  std::map<uint64_t, Result> results_;
  uint64_t next_ticket_ = 1;
  uint64_t steps_ = 0;
  double busy_s_ = 0;
};

// Runs a step's items as StepInputs over `caches`, one SequenceCache per
// item built from the item's block table and position.
std::vector<StepInput> step_inputs(std::span<const StepItem> items,
                                   std::vector<SequenceCache>& caches);

}  // namespace troupe
