#pragma once
// One device's worth of serving compute: the model, its paged KV cache, a
// thread pool and, per sequence, its cache table and sampler. Synchronous:
// the worker actor that owns it calls step() off the actor scheduler.
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "gpu/device_queue.h"
#include "gpu/model.h"
#include "gpu/sampler.h"

namespace troupe {

struct EngineOptions {
  int threads = 1;
  int block_tokens = 16;
  int blocks = 4096;
};

struct EngineItem {
  uint64_t seq = 0;
  std::vector<int> tokens;  // appended to the sequence's cache
  bool sample = false;      // sample a token from the last one's logits
  SamplingParams sampling;  // used when the sequence's sampler is created
  int generated = 0;        // tokens already generated: the sampler skips that many draws
};

// What a device worker drives: one batched step at a time.
class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // Runs one batched step; returns one id per item (-1 where sample is false).
  virtual std::vector<int> step(const std::vector<EngineItem>& items) = 0;
  // Frees a sequence's blocks and sampler; unknown ids are ignored.
  virtual void release(uint64_t seq) = 0;
};

// Builds a replica's engine on the thread that will use it; a multi-device
// engine starts its devices' runners with the launcher (empty: threads).
using EngineFactory = std::function<std::unique_ptr<StepEngine>(const DeviceLauncher& launcher)>;

// One device holding the whole model.
class Engine : public StepEngine {
 public:
  Engine(std::shared_ptr<const Model> model, EngineOptions options);

  std::vector<int> step(const std::vector<EngineItem>& items) override;
  void release(uint64_t seq) override;

  const Model& model() const { return *model_; }
  const KvCache& cache() const { return cache_; }
  size_t live_sequences() const { return seqs_.size(); }

 private:
  struct Seq {
    SequenceCache cache;
    std::unique_ptr<Sampler> sampler;
  };
  std::shared_ptr<const Model> model_;
  KvCache cache_;
  ThreadPool pool_;
  Workspace ws_;
  std::unordered_map<uint64_t, Seq> seqs_;
  std::vector<float> logits_;
};

}  // namespace troupe
