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

// A sequence's blocks are kept adjacent where the pool allows: decode
// attention over a sequence's blocks in consecutive ids is one stream for the
// memory system, and about twice as fast as over blocks scattered through the
// pool (bench_kernels BM_AttentionDecode). So a sequence grows into the block
// after its last one, and a new sequence starts in the middle of the longest
// free stretch, leaving room to grow to itself and to the sequence before.
class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  int total() const { return total_; }
  int free_count() const { return free_; }
  int used_count() const { return total_ - free_count(); }
  bool in_use(int b) const { return b >= 0 && b < total_ && in_use_[size_t(b)] != 0; }
  // Appends n block ids to `out` (a sequence's blocks so far, which the new
  // ones follow where they can), all or nothing; throws KvCacheFull.
  void allocate(int n, std::vector<int>& out);
  // Appends block b, which must be free (std::logic_error otherwise).
  void take(int b, std::vector<int>& out);
  // Returns blocks to the pool; a block freed twice or unknown throws
  // std::logic_error (a bookkeeping bug, not a user error).
  void release(const std::vector<int>& blocks);

 private:
  // Where a new run of blocks starts: the middle of the longest free stretch
  // (its start when nothing precedes it, since only the blocks before a
  // stretch grow into it). Needs a free block. A scan of the pool's flags
  // (a byte a block), at most once per allocate().
  int fresh_start() const;

  int total_;
  int free_;
  std::vector<uint8_t> in_use_;
};

}  // namespace troupe
