#pragma once
// One sequence's part of an engine step: what the replica's scheduler plans
// and every engine (one device, a parallel layout, a GPU) runs. The scheduler
// keeps the only book of KV blocks, so an item carries the sequence's block
// table and position: an engine holds no per-sequence KV state of its own.
#include <cstdint>
#include <vector>

#include "service/request.h"

namespace troupe {

struct StepItem {
  uint64_t seq = 0;
  std::vector<int> tokens;  // written to the KV cache at positions position, position + 1, ...
  int position = 0;         // tokens of the sequence already in the KV cache
  std::vector<int> blocks;  // the sequence's block table; covers position + tokens.size()
  bool sample = false;      // sample a token from the last one's logits
  SamplingParams sampling;  // used when the sequence's sampler is created
  int generated = 0;        // tokens already generated: a new sampler skips that many draws
};

}  // namespace troupe
