#include "scheduler/batch_policy.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

ContinuousBatchPolicy::ContinuousBatchPolicy(BatchLimits limits, int block_tokens)
    : limits_(limits), block_tokens_(block_tokens) {
  auto positive = [](const char* name, int v) {
    if (v < 1)
      throw std::invalid_argument(std::string(name) + " must be at least 1, got " +
                                  std::to_string(v));
  };
  positive("batching.max_batch_sequences", limits.max_batch_sequences);
  positive("batching.max_batch_tokens", limits.max_batch_tokens);
  positive("batching.prefill_chunk_tokens", limits.prefill_chunk_tokens);
  positive("kv_cache.block_tokens", block_tokens);
}

BatchPlan ContinuousBatchPolicy::plan(const std::vector<SeqView>& running,
                                      const std::vector<SeqView>& waiting, int free_blocks,
                                      int max_sequences, int busy_sequences) const {
  BatchPlan out;
  plan(running, waiting, free_blocks, max_sequences, busy_sequences, out);
  return out;
}

void ContinuousBatchPolicy::plan(const std::vector<SeqView>& running,
                                 const std::vector<SeqView>& waiting, int free_blocks,
                                 int max_sequences, int busy_sequences, BatchPlan& plan) const {
  const int cap = max_sequences > 0 ? std::min(max_sequences, limits_.max_batch_sequences)
                                    : limits_.max_batch_sequences;
  plan.admitted.clear();
  plan.preempted.clear();
  // running[0, live) are still admitted; evictions shrink it from the back.
  size_t live = running.size();
  for (;;) {
    plan.entries.clear();
    plan.tokens = 0;
    int free = free_blocks;
    int budget = limits_.max_batch_tokens;
    auto try_add = [&](const SeqView& s, int held) {
      if (int(plan.entries.size()) >= cap || budget <= 0) return false;
      const int n = std::min({s.pending, limits_.prefill_chunk_tokens, budget});
      if (n <= 0) return false;
      const int need = std::max(0, blocks_for(s.cached + n) - held);
      if (need > free) return false;
      free -= need;
      budget -= n;
      plan.tokens += n;
      plan.entries.push_back({s.id, n});
      return true;
    };
    // Decoding sequences first (one token each, latency matters most), then
    // prefill chunks of running sequences, in admission order.
    for (size_t i = 0; i < live; ++i)
      if (running[i].pending == 1) try_add(running[i], running[i].blocks_held);
    for (size_t i = 0; i < live; ++i)
      if (running[i].pending > 1) try_add(running[i], running[i].blocks_held);
    if (plan.entries.empty() && live > 0) {
      // Nothing fits: evict the newest sequence and plan again without it.
      const SeqView& victim = running[--live];
      free_blocks += victim.blocks_held - victim.blocks_shared;
      plan.preempted.push_back(victim.id);
      continue;
    }
    // Admit waiting sequences in order while their first chunk fits and one
    // block per running sequence stays free for its next decode step.
    const int watermark = int(live) + busy_sequences;
    for (const auto& s : waiting) {
      if (int(plan.entries.size()) >= cap || budget <= 0) break;
      const int n = std::min({s.pending, limits_.prefill_chunk_tokens, budget});
      // The blocks it would share are free of charge, unless a sequence was
      // preempted: one the victim held is counted as freed already.
      const int shares = plan.preempted.empty() ? s.blocks_held : 0;
      if (blocks_for(s.cached + n) - shares > free - watermark &&
          !(live == 0 && plan.entries.empty() && busy_sequences == 0))
        break;
      if (!try_add(s, shares)) break;
      plan.admitted.push_back(s.id);
    }
    return;
  }
}

}  // namespace troupe
