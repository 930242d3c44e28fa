#include "scheduler/prefix_affinity_policy.h"

#include <algorithm>

#include "util/rng.h"

namespace troupe {

void PrefixAffinityPolicy::hash_chunks(const std::vector<int>& prompt,
                                       std::optional<uint64_t> request) const {
  // choose() and on_dispatch() see the same request in turn.
  if (request && hashed_for_ == request) return;
  hashed_for_ = request;
  keys_.clear();
  const size_t chunks = std::min(prompt.size() / kChunkTokens, size_t(kMaxChunks));
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t c = 0; c < chunks; ++c) {
    for (size_t i = 0; i < size_t(kChunkTokens); ++i) {
      uint64_t state = h ^ uint64_t(uint32_t(prompt[c * kChunkTokens + i]));
      h = splitmix64(state);
    }
    keys_.push_back(h);
  }
}

std::vector<size_t> PrefixAffinityPolicy::remembered(const std::vector<int>& prompt) const {
  hash_chunks(prompt, std::nullopt);
  const Chunk* deepest = nullptr;
  for (uint64_t k : keys_) {
    auto it = chunks_.find(k);
    if (it == chunks_.end()) break;
    deepest = &it->second;
  }
  std::vector<size_t> out;
  if (deepest)
    for (int i = 0; i < deepest->count; ++i) out.push_back(deepest->holders[size_t(i)]);
  return out;
}

std::optional<size_t> PrefixAffinityPolicy::choose(const std::vector<ReplicaLoad>& replicas,
                                                   const RequestInfo& req, double now_s) {
  const std::optional<size_t> balanced = least_.choose(replicas, req, now_s);
  if (!balanced || req.prompt == nullptr) return balanced;
  live_.clear();
  for (const ReplicaLoad& r : replicas)
    if (r.live) {
      if (r.index >= live_.size()) live_.resize(r.index + 1, nullptr);
      live_[r.index] = &r;
    }
  const ReplicaLoad* least = live_[*balanced];
  // The least loaded live holder of the deepest remembered chunk that one
  // holds.
  hash_chunks(*req.prompt, req.id);
  const ReplicaLoad* affine = nullptr;
  size_t matched = 0;  // tokens of the chunks it holds: the prefill its cache saves
  for (size_t depth = 0; depth < keys_.size(); ++depth) {
    const uint64_t k = keys_[depth];
    auto it = chunks_.find(k);
    if (it == chunks_.end()) break;
    const ReplicaLoad* best = nullptr;
    for (int i = 0; i < it->second.count; ++i) {
      const size_t r = it->second.holders[size_t(i)];
      const ReplicaLoad* load = r < live_.size() ? live_[r] : nullptr;
      if (load && (best == nullptr || less_loaded(*load, *best))) best = load;
    }
    if (best) {
      affine = best;
      matched = (depth + 1) * kChunkTokens;
    }
  }
  if (affine == nullptr) return least->index;
  const size_t slack = std::max<size_t>(2, affine->max_batch_sequences / 4);
  const bool outstanding_ok = affine->outstanding <= least->outstanding + slack;
  const bool prefill_ok = affine->queued_tokens <= least->queued_tokens + matched;
  return outstanding_ok && prefill_ok ? affine->index : least->index;
}

void PrefixAffinityPolicy::on_dispatch(size_t replica, const RequestInfo& req, double /*now_s*/) {
  if (req.prompt == nullptr) return;
  hash_chunks(*req.prompt, req.id);
  for (uint64_t k : keys_) {
    auto [it, fresh] = chunks_.try_emplace(k);
    Chunk& c = it->second;
    if (fresh) {
      c.age = lru_.insert(lru_.end(), k);
    } else {
      lru_.splice(lru_.end(), lru_, c.age);
    }
    // `replica` first, the others after it in their order, the oldest
    // dropped when there are more than kHolders.
    auto at = std::find(c.holders.begin(), c.holders.begin() + c.count, uint32_t(replica));
    if (at == c.holders.begin() + c.count) {
      if (c.count < kHolders) ++c.count;
      at = c.holders.begin() + (c.count - 1);
    }
    std::rotate(c.holders.begin(), at, at + 1);
    *c.holders.begin() = uint32_t(replica);
  }
  while (chunks_.size() > kCapacity) {
    chunks_.erase(lru_.front());
    lru_.pop_front();
  }
}

}  // namespace troupe
