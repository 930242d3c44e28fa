#pragma once
// For tests that drive engines directly, in the replica scheduler's place:
// sequence `seq` owns blocks [seq * per_seq, (seq + 1) * per_seq) of the
// engine's cache, and each item handed out continues where the sequence's
// previous one ended.
#include <cstdint>
#include <map>
#include <vector>

#include "gpu/kv_cache.h"
#include "service/step_item.h"

namespace troupe::test {

class SlotBook {
 public:
  explicit SlotBook(int blocks_per_seq) : per_seq_(blocks_per_seq) {}

  // The next item of `seq`: its tokens at the sequence's next positions.
  StepItem next(uint64_t seq, std::vector<int> tokens, bool sample = true, float temperature = 0) {
    StepItem it;
    it.seq = seq;
    it.position = positions_[seq];
    positions_[seq] += int(tokens.size());
    it.tokens = std::move(tokens);
    it.blocks = contiguous_blocks(int(seq) * per_seq_, per_seq_);
    it.sample = sample;
    it.sampling.temperature = temperature;
    return it;
  }
  // The sequence starts over (its engine state was released).
  void reset(uint64_t seq) { positions_.erase(seq); }

 private:
  int per_seq_;
  std::map<uint64_t, int> positions_;
};

}  // namespace troupe::test
