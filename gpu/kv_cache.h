#pragma once
// Paged KV cache storage: one pre-allocated pool of blocks of `block_tokens`
// positions for every layer. Which blocks a sequence holds is decided by the
// replica's scheduler (scheduler/block_allocator.h, the one book of blocks);
// a step brings each sequence's block table. Nothing is allocated while
// decoding.
#include <cstddef>
#include <vector>

#include "gpu/cpu/kernels.h"
#include "gpu/model_config.h"
#include "gpu/tensor.h"

namespace troupe {

// A sequence as one step sees it: its block table and how many positions
// are already filled.
struct SequenceCache {
  std::vector<int> blocks;  // block ids, in position order
  int length = 0;           // positions filled
};

// Block ids first, first + 1, ...: for drivers that place sequences in fixed
// ranges themselves (one-sequence generation, benchmarks, profiling).
std::vector<int> contiguous_blocks(int first, int count);

class KvCache {
 public:
  // kv_heads/head_dim describe what this cache stores (a shard may hold a
  // subset of the model's kv heads).
  KvCache(int n_layers, int kv_dim, int block_tokens, int num_blocks);
  static KvCache for_model(const ModelConfig& c, int block_tokens, int num_blocks) {
    return KvCache(c.n_layers, c.kv_dim(), block_tokens, num_blocks);
  }
  // Blocks that fit in `bytes` for this model.
  static int blocks_for_bytes(const ModelConfig& c, int block_tokens, size_t bytes);

  int block_tokens() const { return block_tokens_; }
  int num_blocks() const { return num_blocks_; }
  int kv_dim() const { return kv_dim_; }
  size_t bytes_per_token() const { return kv_bytes_per_token(n_layers_, kv_dim_); }
  size_t total_bytes() const { return storage_.nbytes(); }

  // Throws std::invalid_argument unless seq's block table holds `tokens`
  // positions with valid block ids.
  void check_covers(const SequenceCache& seq, int tokens) const;

  // Layer `layer` of `seq` as the attention kernel reads it.
  kernels::PagedKv paged(int layer, const SequenceCache& seq) {
    const size_t per_block = size_t(block_tokens_) * size_t(kv_dim_);
    return kernels::PagedKv{
        slot(layer, 0, 0, 0), slot(layer, 1, 0, 0), seq.blocks.data(), block_tokens_, per_block,
        size_t(kv_dim_)};
  }

  // Row of position `pos` of `seq` in layer `layer`: kv_dim floats.
  float* key(int layer, const SequenceCache& seq, int pos) {
    return slot(layer, 0, seq.blocks[size_t(pos / block_tokens_)], pos % block_tokens_);
  }
  float* value(int layer, const SequenceCache& seq, int pos) {
    return slot(layer, 1, seq.blocks[size_t(pos / block_tokens_)], pos % block_tokens_);
  }

 private:
  float* slot(int layer, int kv, int block, int offset) {
    const size_t per_block = size_t(block_tokens_) * size_t(kv_dim_);
    const size_t index =
        ((size_t(layer) * 2 + size_t(kv)) * size_t(num_blocks_) + size_t(block)) * per_block +
        size_t(offset) * size_t(kv_dim_);
    return storage_.data_mut<float>() + index;
  }

  int n_layers_, kv_dim_, block_tokens_, num_blocks_;
  Tensor storage_;
};

}  // namespace troupe
