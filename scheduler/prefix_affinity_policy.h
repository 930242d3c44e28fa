#pragma once
// Prefix-aware routing: a request goes where a prompt starting like it went
// before, so that the replica's prefix cache (kv_cache.prefix_caching) holds
// its start, as SGLang's cache-aware router and vLLM's production stack route.
// Affinity yields to balance: when that replica has more outstanding requests
// than the least loaded one by more than max(2, a quarter of its batch), or
// when no replica saw the prompt's start, the least loaded one takes it.
//
// The router does not ask the replicas what they cache: it remembers where it
// sent each prompt's chunks of kChunkTokens (a hash chained over the chunks
// before, as a replica's blocks are), up to kMaxChunks per prompt and
// kCapacity chunks in all, forgetting the oldest first. A replica's cache may
// have evicted what the router remembers; the request then computes its
// prompt, as it would elsewhere.
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "scheduler/routing_policy.h"

namespace troupe {

class PrefixAffinityPolicy : public RoutingPolicy {
 public:
  static constexpr int kChunkTokens = 16;  // kv_cache.block_tokens' default
  static constexpr int kMaxChunks = 512;
  static constexpr size_t kCapacity = size_t(1) << 20;

  std::string_view name() const override { return "prefix_affinity"; }
  bool reads_prompt() const override { return true; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo& req,
                               double now_s) override;
  void on_dispatch(size_t replica, const RequestInfo& req, double now_s) override;

  // The replica the prompt's longest remembered start went to, if any.
  std::optional<size_t> remembered(const std::vector<int>& prompt) const;
  size_t chunks_remembered() const { return where_.size(); }

 private:
  // Chain hashes of the prompt's full chunks, into keys_.
  void hash_chunks(const std::vector<int>& prompt) const;

  LeastOutstandingPolicy least_;
  std::unordered_map<uint64_t, size_t> where_;  // chunk chain hash -> replica
  std::deque<uint64_t> order_;                  // where_'s keys, oldest first
  mutable std::vector<uint64_t> keys_;
  std::vector<const ReplicaLoad*> live_;  // choose()'s live replicas by index
};

}  // namespace troupe
