#pragma once
// One sequence's part of an engine step: what the replica's scheduler plans
// and every engine (one device, a parallel layout, a GPU) runs. The scheduler
// keeps the only book of KV blocks, so an item carries the sequence's block
// table and position: an engine holds no per-sequence KV state of its own.
#include <cstdint>
#include <vector>

#include "service/request.h"

namespace troupe {

// An item's only token when it is the one its sequence's previous step
// samples: a replica that schedules ahead (ReplicaSchedulerOptions::
// lookahead) plans step N+1 while step N runs, and its worker puts N's
// sampled id in place of this before it launches N+1. Engines never see it.
inline constexpr int kSampledToken = -1;

struct StepItem {
  uint64_t seq = 0;
  std::vector<int> tokens;  // written to the KV cache at positions position, position + 1, ...
                            // (or {kSampledToken}, before the worker launches it)
  int position = 0;         // tokens of the sequence already in the KV cache
  std::vector<int> blocks;  // the sequence's block table; covers position + tokens.size()
  bool sample = false;      // sample a token from the last one's logits
  SamplingParams sampling;  // used when the sequence's sampler is created
  int generated = 0;        // tokens already generated: a new sampler skips that many draws

  // Its token is the one its sequence's previous step samples.
  bool feeds_sampled_token() const { return tokens.size() == 1 && tokens[0] == kSampledToken; }
};

}  // namespace troupe
