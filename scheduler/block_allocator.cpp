#include "scheduler/block_allocator.h"

#include <string>

namespace troupe {

KvCacheFull::KvCacheFull(int wanted, int free_blocks, int total)
    : std::runtime_error("KV cache full: need " + std::to_string(wanted) + " more blocks, " +
                         std::to_string(free_blocks) + " of " + std::to_string(total) + " free"),
      wanted_(wanted),
      free_(free_blocks) {}

BlockAllocator::BlockAllocator(int num_blocks) : total_(num_blocks) {
  if (num_blocks <= 0) throw std::invalid_argument("KV cache needs at least one block");
  free_.reserve(size_t(num_blocks));
  // Lowest ids come out first, which keeps a fresh cache's accesses local.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  in_use_.assign(size_t(num_blocks), 0);
}

void BlockAllocator::allocate(int n, std::vector<int>& out) {
  if (n < 0) throw std::invalid_argument("negative block count");
  if (n > free_count()) throw KvCacheFull(n, free_count(), total_);
  for (int i = 0; i < n; ++i) {
    const int b = free_.back();
    free_.pop_back();
    in_use_[size_t(b)] = 1;
    out.push_back(b);
  }
}

void BlockAllocator::release(const std::vector<int>& blocks) {
  // Last first, so that the next allocation takes them in their order: a
  // sequence's blocks in ascending ids are one stream for the attention
  // kernels (gpu/kv_cache.h).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int b = *it;
    if (b < 0 || b >= total_ || !in_use_[size_t(b)])
      throw std::logic_error("KV block " + std::to_string(b) + " released but not in use");
    in_use_[size_t(b)] = 0;
    free_.push_back(b);
  }
}

}  // namespace troupe
