#pragma once
// A replica's one book of KV blocks: which are free, which sequences hold
// which, and, with prefix caching, which full blocks are kept after their
// sequences let them go, to be found again by the tokens they hold.
//
// Prefix caching (as vLLM's automatic prefix caching): a block all of whose
// positions are computed is indexed by its tokens and by the block before
// it, so a chain of indexed blocks stands for a prefix. A new sequence takes
// the longest indexed chain its tokens start with instead of computing it
// again, sharing those blocks (read only: a sequence writes only positions
// past what it holds, so never into a full block). Blocks nobody holds stay
// indexed and count as free: taking a fresh block evicts the least recently
// released of them first.
//
// The answer is the same as without it: a position's keys and values depend
// only on the tokens up to it, and the engines compute them alike whatever
// the batch or the chunk (the batch-invariance the layouts already rely
// on), so a shared block holds exactly what the sequence would have written.
// Blocks are found by a hash of their tokens chained over the blocks before
// them (chain_key, which a sequence computes once for its prompt), and
// matches are exact: tokens are compared, never only hashed, and the block
// a chain continues from is named by its id, kept valid by un-indexing a
// block's descendants when it is evicted.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "scheduler/block_allocator.h"

namespace troupe {

class BlockBook {
 public:
  // Throws std::invalid_argument for no blocks or block_tokens < 1.
  BlockBook(int num_blocks, int block_tokens, bool prefix_caching);

  bool prefix_caching() const { return prefix_caching_; }
  int block_tokens() const { return block_tokens_; }
  int total() const { return alloc_.total(); }
  // Blocks a sequence can be given: never used, or indexed and held by none.
  int free_count() const { return alloc_.free_count() + evictable_; }
  int used_count() const { return total() - free_count(); }
  // Indexed blocks, held or not.
  int cached_count() const { return indexed_; }

  // Appends n blocks (held once) to `out`, evicting indexed blocks nobody
  // holds, least recently released first, when too few were never used.
  // All or nothing; throws KvCacheFull.
  void allocate(int n, std::vector<int>& out);
  // Lets go of one hold of each block. One nobody holds any more returns to
  // the pool, or, if indexed, stays cached; the blocks of one sequence are
  // taken in reverse, so that a prefix's tail is evicted before its head.
  // A block not held throws std::logic_error (a bookkeeping bug).
  void release(const std::vector<int>& blocks);
  // The key of a block holding `tokens` (block_tokens of them) after the
  // chain whose last block's key is `parent_key` (kRootKey: none before it).
  static constexpr uint64_t kRootKey = 0x6a09e667f3bcc908ull;
  uint64_t chain_key(uint64_t parent_key, const int* tokens) const;
  // The longest chain of indexed blocks holding tokens[0, k * block_tokens)
  // with k <= max_blocks, appended to `out`; returns k. keys[i] is block
  // i's chain_key. Takes no hold.
  int match(const uint64_t* keys, const int* tokens, int max_blocks, std::vector<int>& out) const;
  // Takes one hold of each block (found by match, in the same step).
  void acquire(const std::vector<int>& blocks);
  // Held by a sequence (a cached block nobody holds is not).
  bool held(int block) const {
    return prefix_caching_ ? meta_[size_t(block)].holds > 0 : alloc_.in_use(block);
  }
  // Held by more than one sequence: releasing it frees nothing.
  bool shared(int block) const { return prefix_caching_ && meta_[size_t(block)].holds > 1; }
  // `block`, held, now holds `tokens` (block_tokens of them, whose
  // chain_key is `key`), computed after the chain ending in `parent` (-1:
  // it is a sequence's first block). Indexes it, unless prefix caching is
  // off, `parent` is not indexed, or the same tokens after the same parent
  // are indexed already (a sequence that computed a prefix another one did
  // too): returns whether it is.
  bool index(int block, int parent, uint64_t key, const int* tokens);

 private:
  // Kept only with prefix caching: without it a block is held by one
  // sequence or free, which the allocator alone says.
  struct Meta {
    uint64_t key = 0;
    int holds = 0;
    int parent = -1;
    int prev = -1, next = -1;  // the evictable list, while indexed and not held
    // Indexed blocks continuing its chain: the first, then each one's next.
    int first_child = -1, next_sibling = -1;
    bool indexed = false;
  };

  bool same_tokens(int block, const int* tokens) const;
  void unlink(int block);
  void push_evictable(int block);
  // Evicts the least recently released cached block (and its descendants).
  void evict_one();
  // Removes `block` and its descendants from the index; those nobody holds
  // return to the pool.
  void unindex(int block);

  BlockAllocator alloc_;
  int block_tokens_;
  bool prefix_caching_;
  std::vector<Meta> meta_;
  std::vector<int> tokens_;  // block b's tokens at [b * block_tokens, ...), while indexed
  std::unordered_map<uint64_t, int> index_;
  int head_ = -1, tail_ = -1;  // evictable: least recently released first
  int evictable_ = 0;
  int indexed_ = 0;
  std::vector<int> scratch_;
};

}  // namespace troupe
