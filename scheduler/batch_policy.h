#pragma once
// Continuous batching: which sequences run in the next step and how many of
// their pending tokens each feeds. Plain and deterministic: the batcher actor
// passes in what it knows, and applies the plan.
#include <cstdint>
#include <vector>

namespace troupe {

struct BatchLimits {
  int max_batch_sequences = 32;
  int max_batch_tokens = 2048;
  int prefill_chunk_tokens = 512;
};

struct SeqView {
  uint64_t id = 0;
  int pending = 0;  // tokens not yet in the KV cache (prompt left, or 1 to decode)
  int cached = 0;   // tokens in the KV cache
  // KV blocks it holds now; a waiting sequence, those of its cached prefix
  // that others hold, which it will share (prefix caching).
  int blocks_held = 0;
  int blocks_shared = 0;  // of those held, held by other sequences too (prefix caching)
};

struct PlanEntry {
  uint64_t id = 0;
  int tokens = 0;  // how many of its pending tokens to feed this step
};

struct BatchPlan {
  std::vector<PlanEntry> entries;   // running first (in order), then newly admitted
  std::vector<uint64_t> admitted;   // waiting sequences that join now
  std::vector<uint64_t> preempted;  // running sequences evicted to make room (recomputed later)
  int tokens = 0;
};

class ContinuousBatchPolicy {
 public:
  // Throws std::invalid_argument naming a bad limit.
  ContinuousBatchPolicy(BatchLimits limits, int block_tokens);

  // running: admitted sequences in admission order; waiting: candidates in
  // the order they should be admitted. A running sequence that cannot get
  // the blocks it needs waits a step; if nothing at all can run, the most
  // recently admitted running sequence is preempted to free its blocks.
  // max_sequences (0: the limit) caps this step below max_batch_sequences:
  // a pipeline splits its sequences into groups whose steps are in flight at
  // once. busy_sequences run in such other steps (not listed here): each
  // keeps a free block in reserve for its next decode, like running ones.
  BatchPlan plan(const std::vector<SeqView>& running, const std::vector<SeqView>& waiting,
                 int free_blocks, int max_sequences = 0, int busy_sequences = 0) const;
  // The same into `out`, whose buffers are reused: a replica plans a step
  // every few milliseconds, a simulated cluster tens of millions of them.
  void plan(const std::vector<SeqView>& running, const std::vector<SeqView>& waiting,
            int free_blocks, int max_sequences, int busy_sequences, BatchPlan& out) const;

  int blocks_for(int tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }
  const BatchLimits& limits() const { return limits_; }

 private:
  BatchLimits limits_;
  int block_tokens_;
};

}  // namespace troupe
