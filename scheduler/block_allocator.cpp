#include "scheduler/block_allocator.h"

#include <string>

namespace troupe {

KvCacheFull::KvCacheFull(int wanted, int free_blocks, int total)
    : std::runtime_error("KV cache full: need " + std::to_string(wanted) + " more blocks, " +
                         std::to_string(free_blocks) + " of " + std::to_string(total) + " free"),
      wanted_(wanted),
      free_(free_blocks) {}

BlockAllocator::BlockAllocator(int num_blocks) : total_(num_blocks), free_(num_blocks) {
  if (num_blocks <= 0) throw std::invalid_argument("KV cache needs at least one block");
  in_use_.assign(size_t(num_blocks), 0);
}

int BlockAllocator::fresh_start() const {
  int best = -1, best_len = 0;
  for (int b = 0; b < total_;) {
    if (in_use_[size_t(b)]) {
      ++b;
      continue;
    }
    int e = b;
    while (e < total_ && !in_use_[size_t(e)]) ++e;
    if (e - b > best_len) best = b, best_len = e - b;
    b = e;
  }
  if (best < 0) throw std::logic_error("fresh_start: no free KV block");
  return best == 0 ? 0 : best + best_len / 2;
}

void BlockAllocator::allocate(int n, std::vector<int>& out) {
  if (n < 0) throw std::invalid_argument("negative block count");
  if (n > free_) throw KvCacheFull(n, free_, total_);
  // One scan for a fresh start a call at most; past it the next free ids
  // after the last block, so that a long prompt in a fragmented pool costs
  // one more pass over the flags, not one per block.
  bool started = false;
  for (int i = 0; i < n; ++i) {
    int b = out.empty() ? -1 : out.back() + 1;
    if (b < 0 || b >= total_ || in_use_[size_t(b)]) {
      if (!started) {
        b = fresh_start();
        started = true;
      } else {
        b = out.back();
        do b = (b + 1) % total_;
        while (in_use_[size_t(b)]);
      }
    }
    in_use_[size_t(b)] = 1;
    --free_;
    out.push_back(b);
  }
}

void BlockAllocator::take(int b, std::vector<int>& out) {
  if (b < 0 || b >= total_ || in_use_[size_t(b)])
    throw std::logic_error("KV block " + std::to_string(b) + " taken but not free");
  in_use_[size_t(b)] = 1;
  --free_;
  out.push_back(b);
}

void BlockAllocator::release(const std::vector<int>& blocks) {
  for (int b : blocks) {
    if (b < 0 || b >= total_ || !in_use_[size_t(b)])
      throw std::logic_error("KV block " + std::to_string(b) + " released but not in use");
    in_use_[size_t(b)] = 0;
    ++free_;
  }
}

}  // namespace troupe
