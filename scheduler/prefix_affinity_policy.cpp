#include "scheduler/prefix_affinity_policy.h"

#include <algorithm>

#include "util/rng.h"

namespace troupe {

void PrefixAffinityPolicy::hash_chunks(const std::vector<int>& prompt) const {
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

std::optional<size_t> PrefixAffinityPolicy::remembered(const std::vector<int>& prompt) const {
  hash_chunks(prompt);
  std::optional<size_t> deepest;
  for (uint64_t k : keys_) {
    auto it = where_.find(k);
    if (it == where_.end()) break;
    deepest = it->second;
  }
  return deepest;
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
  // The deepest remembered chunk whose replica is live now.
  hash_chunks(*req.prompt);
  const ReplicaLoad* affine = nullptr;
  for (uint64_t k : keys_) {
    auto it = where_.find(k);
    if (it == where_.end()) break;
    if (it->second < live_.size() && live_[it->second]) affine = live_[it->second];
  }
  if (affine == nullptr) return least->index;
  const size_t slack = std::max<size_t>(2, affine->max_batch_sequences / 4);
  return affine->outstanding <= least->outstanding + slack ? affine->index : least->index;
}

void PrefixAffinityPolicy::on_dispatch(size_t replica, const RequestInfo& req, double /*now_s*/) {
  if (req.prompt == nullptr) return;
  hash_chunks(*req.prompt);
  for (uint64_t k : keys_) {
    auto [it, fresh] = where_.insert_or_assign(k, replica);
    if (fresh) order_.push_back(k);
  }
  while (where_.size() > kCapacity) {
    where_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace troupe
