#include "gpu/kv_cache.h"

#include <stdexcept>
#include <string>

namespace troupe {

KvCache::KvCache(int n_layers, int kv_dim, int block_tokens, int num_blocks)
    : n_layers_(n_layers),
      kv_dim_(kv_dim),
      block_tokens_(block_tokens),
      num_blocks_(num_blocks),
      alloc_(num_blocks) {
  if (block_tokens <= 0) throw std::invalid_argument("kv_cache.block_tokens must be positive");
  if (n_layers <= 0 || kv_dim <= 0) throw std::invalid_argument("KV cache needs layers and heads");
  storage_ = Tensor::zeros({int64_t(n_layers) * 2 * num_blocks * block_tokens, int64_t(kv_dim)},
                           DType::F32);
}

int KvCache::blocks_for_bytes(const ModelConfig& c, int block_tokens, size_t bytes) {
  const size_t per_block =
      size_t(c.n_layers) * 2 * size_t(c.kv_dim()) * sizeof(float) * size_t(block_tokens);
  return int(bytes / per_block);
}

int KvCache::blocks_needed(const SequenceCache& seq, int tokens) const {
  const int want = (tokens + block_tokens_ - 1) / block_tokens_;
  return want > int(seq.blocks.size()) ? want - int(seq.blocks.size()) : 0;
}

void KvCache::reserve(SequenceCache& seq, int tokens) {
  alloc_.allocate(blocks_needed(seq, tokens), seq.blocks);
}

void KvCache::release(SequenceCache& seq) {
  alloc_.release(seq.blocks);
  seq.blocks.clear();
  seq.length = 0;
}

}  // namespace troupe
