#include "gpu/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

namespace troupe {

KvCache::KvCache(int n_layers, int kv_heads, int head_dim, int block_tokens, int num_blocks,
                 DType dtype)
    : n_layers_(n_layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      block_tokens_(block_tokens),
      num_blocks_(num_blocks) {
  if (block_tokens <= 0) throw std::invalid_argument("kv_cache.block_tokens must be positive");
  if (n_layers <= 0 || kv_heads <= 0 || head_dim <= 0)
    throw std::invalid_argument("KV cache needs layers and heads");
  if (num_blocks <= 0) throw std::invalid_argument("KV cache needs at least one block");
  storage_ = Tensor::zeros(
      {int64_t(n_layers) * 2 * num_blocks * block_tokens, int64_t(kv_heads) * head_dim}, dtype);
}

kernels::KvType kv_type(DType dtype) {
  switch (dtype) {
    case DType::F16:
      return kernels::KvType::F16;
    case DType::BF16:
      return kernels::KvType::BF16;
    case DType::F32:
      break;
  }
  return kernels::KvType::F32;
}

void KvCache::store(int layer, const SequenceCache& seq, int pos, const float* key,
                    const float* value) {
  const DType dt = dtype();
  const size_t n = size_t(head_dim_);
  each_head(layer, 0, seq, pos,
            [&](size_t at, char* row) { convert_from_f32(key + at, dt, row, n); });
  each_head(layer, 1, seq, pos,
            [&](size_t at, char* row) { convert_from_f32(value + at, dt, row, n); });
}

void KvCache::load(int layer, const SequenceCache& seq, int pos, float* key, float* value) const {
  const DType dt = dtype();
  const size_t n = size_t(head_dim_);
  each_head(layer, 0, seq, pos,
            [&](size_t at, char* row) { convert_to_f32(row, dt, key + at, n); });
  each_head(layer, 1, seq, pos,
            [&](size_t at, char* row) { convert_to_f32(row, dt, value + at, n); });
}

std::vector<int> contiguous_blocks(int first, int count) {
  std::vector<int> out(size_t(std::max(0, count)));
  std::iota(out.begin(), out.end(), first);
  return out;
}

int KvCache::blocks_for_bytes(const ModelConfig& c, int block_tokens, size_t bytes, DType dtype) {
  return int(bytes / (c.kv_bytes_per_token(dtype) * size_t(block_tokens)));
}

void KvCache::check_covers(const SequenceCache& seq, int tokens) const {
  if (int64_t(seq.blocks.size()) * block_tokens_ < tokens)
    throw std::invalid_argument("a sequence's block table holds " +
                                std::to_string(seq.blocks.size() * size_t(block_tokens_)) +
                                " positions; the step needs " + std::to_string(tokens));
  for (int b : seq.blocks)
    if (b < 0 || b >= num_blocks_)
      throw std::invalid_argument("KV block " + std::to_string(b) + " is outside the cache's " +
                                  std::to_string(num_blocks_) + " blocks");
}

}  // namespace troupe
