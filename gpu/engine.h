#pragma once
// One device's worth of serving compute: the model, its paged KV cache, a
// thread pool and, per sequence, its cache table and sampler. Synchronous:
// the worker actor that owns it calls step() off the actor scheduler.
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

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

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, EngineOptions options);

  // Runs one batched step; returns one id per item (-1 where sample is false).
  std::vector<int> step(const std::vector<EngineItem>& items);
  // Frees a sequence's blocks and sampler; unknown ids are ignored.
  void release(uint64_t seq);

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
