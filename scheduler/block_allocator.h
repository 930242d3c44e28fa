#pragma once
// Hands out fixed-size KV-cache blocks from a pool of known size. Plain
// bookkeeping, no memory: the cache owns the storage.
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace troupe {

// The pool cannot satisfy a request. Recoverable: nothing was allocated.
class KvCacheFull : public std::runtime_error {
 public:
  KvCacheFull(int wanted, int free_blocks, int total);
  int wanted() const { return wanted_; }
  int free_blocks() const { return free_; }

 private:
  int wanted_, free_;
};

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  int total() const { return total_; }
  int free_count() const { return int(free_.size()); }
  int used_count() const { return total_ - free_count(); }
  // Appends n block ids to `out`, all or nothing; throws KvCacheFull.
  void allocate(int n, std::vector<int>& out);
  // Returns blocks to the pool; a block freed twice or unknown throws
  // std::logic_error (a bookkeeping bug, not a user error).
  void release(const std::vector<int>& blocks);

 private:
  int total_;
  std::vector<int> free_;
  std::vector<uint8_t> in_use_;
};

}  // namespace troupe
