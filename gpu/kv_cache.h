#pragma once
// Paged KV cache storage: one pre-allocated pool of blocks of `block_tokens`
// positions for every layer. Which blocks a sequence holds is decided by the
// replica's scheduler (scheduler/block_allocator.h, the one book of blocks);
// a step brings each sequence's block table. Nothing is allocated while
// decoding.
//
// Rows are stored as f32 or as 16-bit floats (f16, bf16: half the memory
// and half the bytes attention reads per position). A 16-bit row is the f32
// row rounded to nearest even once, when written; every reader widens it
// exactly, so the choice changes the cached numbers, never the order of any
// arithmetic: a sequence still gets the same values in any batch and layout.
//
// Storage is [layer][key, value][kv head][block][position][dim]: attention
// reads one kv head of one sequence at a time, and a sequence's blocks
// (consecutive ids, which the block allocator keeps where the pool allows)
// are then one contiguous stream the hardware prefetches, rather than a
// slice of every position's row.
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

// The attention kernels' name for a cache element type.
kernels::KvType kv_type(DType dtype);

// Block ids first, first + 1, ...: for drivers that place sequences in fixed
// ranges themselves (one-sequence generation, benchmarks, profiling).
std::vector<int> contiguous_blocks(int first, int count);

class KvCache {
 public:
  // kv_heads/head_dim describe what this cache stores (a shard may hold a
  // subset of the model's kv heads).
  KvCache(int n_layers, int kv_heads, int head_dim, int block_tokens, int num_blocks,
          DType dtype = DType::F32);
  static KvCache for_model(const ModelConfig& c, int block_tokens, int num_blocks,
                           DType dtype = DType::F32) {
    return KvCache(c.n_layers, c.n_kv_heads, c.head_dim, block_tokens, num_blocks, dtype);
  }
  // Blocks that fit in `bytes` for this model.
  static int blocks_for_bytes(const ModelConfig& c, int block_tokens, size_t bytes,
                              DType dtype = DType::F32);

  int block_tokens() const { return block_tokens_; }
  int num_blocks() const { return num_blocks_; }
  int kv_dim() const { return kv_heads_ * head_dim_; }
  DType dtype() const { return storage_.dtype(); }
  size_t bytes_per_token() const { return kv_bytes_per_token(n_layers_, kv_dim(), dtype()); }
  size_t total_bytes() const { return storage_.nbytes(); }

  // Throws std::invalid_argument unless seq's block table holds `tokens`
  // positions with valid block ids.
  void check_covers(const SequenceCache& seq, int tokens) const;

  // Layer `layer` of `seq` as the attention kernel reads it; kv head h's
  // blocks start head_offset(h) elements in.
  kernels::PagedKv paged(int layer, const SequenceCache& seq) const {
    return kernels::PagedKv{row(layer, 0, 0, 0, 0), row(layer, 1, 0, 0, 0), seq.blocks.data(),
                            block_tokens_,          block_elements(),       size_t(head_dim_),
                            kv_type(dtype())};
  }
  size_t head_offset(int kv_head) const {
    return size_t(kv_head) * size_t(num_blocks_) * block_elements();
  }

  // Writes position `pos` of `seq` in layer `layer`: kv_dim keys and values,
  // rounded to the cache's type.
  void store(int layer, const SequenceCache& seq, int pos, const float* key, const float* value);
  // Reads them back, widened to f32 (kv_dim floats each).
  void load(int layer, const SequenceCache& seq, int pos, float* key, float* value) const;

 private:
  // One kv head's share of a block.
  size_t block_elements() const { return size_t(block_tokens_) * size_t(head_dim_); }
  // Keys (kv 0) or values (1) of kv head `head` at row `offset` of `block`.
  char* row(int layer, int kv, int block, int head, int offset) const {
    const size_t index = (size_t(layer) * 2 + size_t(kv)) * size_t(kv_heads_) *
                             size_t(num_blocks_) * block_elements() +
                         head_offset(head) + size_t(block) * block_elements() +
                         size_t(offset) * size_t(head_dim_);
    // The cache's storage is its own and writable; const readers only read.
    return static_cast<char*>(const_cast<void*>(storage_.raw())) +
           index * dtype_size(storage_.dtype());
  }
  // f(h * head_dim, head h's row of position `pos` of `seq`) for every kv
  // head h: where a kv_dim-long row's head lives in the block.
  template <class F>
  void each_head(int layer, int kv, const SequenceCache& seq, int pos, F&& f) const {
    const int block = seq.blocks[size_t(pos / block_tokens_)];
    for (int h = 0; h < kv_heads_; ++h)
      f(size_t(h) * size_t(head_dim_), row(layer, kv, block, h, pos % block_tokens_));
  }

  int n_layers_, kv_heads_, head_dim_, block_tokens_, num_blocks_;
  Tensor storage_;
};

}  // namespace troupe
