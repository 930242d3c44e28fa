#pragma once
// Prefix-aware routing: a request goes where a prompt starting like it went
// before, so that the replica's prefix cache (kv_cache.prefix_caching) holds
// its start, as SGLang's cache-aware router and vLLM's production stack route.
//
// The router does not ask the replicas what they cache: it remembers which
// replicas it sent each prompt chunk of kChunkTokens to (a hash chained over
// the chunks before, as a replica's blocks are; the last kHolders replicas
// per chunk, kCapacity chunks in all, the least recently used forgotten
// first). Two holders keep a prefix on few replicas, whose caches then hold
// fewer prefixes each, while load can still move between them. A request follows the deepest chunk
// it remembers, to the least loaded of the replicas that got it: a prefix every replica has (one
// system prompt for all) leaves the choice to load, one only a replica has (the earlier turns of a
// conversation) decides it. Affinity yields to balance: when that replica has more outstanding
// requests than the least loaded one by more than max(2, a quarter of its batch), or holds more
// prompt tokens waiting for prefill than the least loaded by more than the prefix it holds (the
// prefill its cache would save), the least loaded one takes it, as it does a prompt whose start
// went nowhere. A replica's cache may have evicted what the router remembers; the request then
// computes its prompt, as it would elsewhere.
#include <array>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "scheduler/routing_policy.h"

namespace troupe {

class PrefixAffinityPolicy : public RoutingPolicy {
 public:
  static constexpr int kChunkTokens = 16;  // kv_cache.block_tokens' default
  static constexpr int kMaxChunks = 512;
  static constexpr int kHolders = 2;
  static constexpr size_t kCapacity = size_t(1) << 18;

  std::string_view name() const override { return "prefix_affinity"; }
  bool reads_prompt() const override { return true; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo& req,
                               double now_s) override;
  void on_dispatch(size_t replica, const RequestInfo& req, double now_s) override;

  // The replicas the prompt's deepest remembered chunk went to, most
  // recent first (empty: none).
  std::vector<size_t> remembered(const std::vector<int>& prompt) const;
  size_t chunks_remembered() const { return chunks_.size(); }

 private:
  struct Chunk {
    std::array<uint32_t, kHolders> holders{};  // most recent first
    int count = 0;
    std::list<uint64_t>::iterator age;  // in lru_
  };

  // Chain hashes of the prompt's full chunks, into keys_ (kept while the
  // calls are about the same `request`; none: always hashed).
  void hash_chunks(const std::vector<int>& prompt, std::optional<uint64_t> request) const;

  LeastOutstandingPolicy least_;
  std::unordered_map<uint64_t, Chunk> chunks_;
  std::list<uint64_t> lru_;  // chunks_'s keys, least recently used first
  mutable std::vector<uint64_t> keys_;
  mutable std::optional<uint64_t> hashed_for_;  // the request keys_ are of
  std::vector<const ReplicaLoad*> live_;        // choose()'s live replicas by index
};

}  // namespace troupe
