#include "scheduler/block_book.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "util/rng.h"

namespace troupe {

BlockBook::BlockBook(int num_blocks, int block_tokens, bool prefix_caching)
    : alloc_(num_blocks), block_tokens_(block_tokens), prefix_caching_(prefix_caching) {
  if (block_tokens < 1)
    throw std::invalid_argument("kv_cache.block_tokens must be at least 1, got " +
                                std::to_string(block_tokens));
  if (prefix_caching_) {
    meta_.resize(size_t(num_blocks));
    tokens_.resize(size_t(num_blocks) * size_t(block_tokens));
  }
}

uint64_t BlockBook::chain_key(uint64_t parent_key, const int* tokens) const {
  uint64_t h = parent_key;
  for (int i = 0; i < block_tokens_; ++i) {
    uint64_t state = h ^ uint64_t(uint32_t(tokens[i]));
    h = splitmix64(state);
  }
  return h;
}

bool BlockBook::same_tokens(int block, const int* tokens) const {
  const int* mine = tokens_.data() + size_t(block) * size_t(block_tokens_);
  return std::equal(mine, mine + block_tokens_, tokens);
}

void BlockBook::unlink(int block) {
  Meta& m = meta_[size_t(block)];
  (m.prev >= 0 ? meta_[size_t(m.prev)].next : head_) = m.next;
  (m.next >= 0 ? meta_[size_t(m.next)].prev : tail_) = m.prev;
  m.prev = m.next = -1;
  --evictable_;
}

void BlockBook::push_evictable(int block) {
  Meta& m = meta_[size_t(block)];
  m.prev = tail_;
  m.next = -1;
  (tail_ >= 0 ? meta_[size_t(tail_)].next : head_) = block;
  tail_ = block;
  ++evictable_;
}

void BlockBook::unindex(int block) {
  Meta& m = meta_[size_t(block)];
  if (!m.indexed) return;
  // Children first: they continue what this block holds, which it will not
  // once it is reused (a match checks a block's parent id too, so they
  // could not be found wrongly; they are let go rather than kept unfindable).
  while (m.first_child >= 0) unindex(m.first_child);
  m.indexed = false;
  --indexed_;
  index_.erase(m.key);
  if (m.parent >= 0) {
    int* link = &meta_[size_t(m.parent)].first_child;
    while (*link != block) link = &meta_[size_t(*link)].next_sibling;
    *link = m.next_sibling;
  }
  m.parent = -1;
  m.next_sibling = -1;
  if (m.holds == 0) {
    unlink(block);
    scratch_.assign(1, block);
    alloc_.release(scratch_);
  }
}

void BlockBook::evict_one() {
  if (head_ < 0) throw std::logic_error("evict_one: no cached block nobody holds");
  unindex(head_);
}

void BlockBook::allocate(int n, std::vector<int>& out) {
  if (n < 0) throw std::invalid_argument("negative block count");
  if (n > free_count()) throw KvCacheFull(n, free_count(), total());
  if (!prefix_caching_) return alloc_.allocate(n, out);
  const size_t first = out.size();
  while (int(out.size() - first) < n) {
    const int want = n - int(out.size() - first);
    if (alloc_.free_count() > 0) {
      alloc_.allocate(std::min(want, alloc_.free_count()), out);
      continue;
    }
    // Nothing never used or let go: the least recently released cached
    // block, taken where it lies (the allocator's search of the pool for a
    // better place would find only what eviction frees, one block at a time).
    const int b = head_;
    evict_one();
    alloc_.take(b, out);
  }
  for (size_t i = first; i < out.size(); ++i) meta_[size_t(out[i])].holds = 1;
}

void BlockBook::release(const std::vector<int>& blocks) {
  if (!prefix_caching_) return alloc_.release(blocks);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int b = *it;
    if (b < 0 || b >= total() || meta_[size_t(b)].holds <= 0)
      throw std::logic_error("KV block " + std::to_string(b) + " released but not held");
    Meta& m = meta_[size_t(b)];
    if (--m.holds > 0) continue;
    if (m.indexed) {
      push_evictable(b);
    } else {
      scratch_.assign(1, b);
      alloc_.release(scratch_);
    }
  }
}

int BlockBook::match(const uint64_t* keys, const int* tokens, int max_blocks,
                     std::vector<int>& out) const {
  if (!prefix_caching_ || index_.empty()) return 0;
  int parent = -1, k = 0;
  for (; k < max_blocks; ++k) {
    const int* t = tokens + size_t(k) * size_t(block_tokens_);
    auto it = index_.find(keys[k]);
    if (it == index_.end()) break;
    const int b = it->second;
    if (meta_[size_t(b)].parent != parent || !same_tokens(b, t)) break;
    out.push_back(b);
    parent = b;
  }
  return k;
}

void BlockBook::acquire(const std::vector<int>& blocks) {
  if (!prefix_caching_ && !blocks.empty())
    throw std::logic_error("KV blocks taken by prefix with prefix caching off");
  for (int b : blocks) {
    Meta& m = meta_[size_t(b)];
    if (!m.indexed && m.holds == 0)
      throw std::logic_error("KV block " + std::to_string(b) +
                             " taken but neither held nor cached");
    if (m.holds++ == 0) unlink(b);
  }
}

bool BlockBook::index(int block, int parent, uint64_t key, const int* tokens) {
  if (!prefix_caching_) return false;
  Meta& m = meta_[size_t(block)];
  if (m.holds <= 0)
    throw std::logic_error("KV block " + std::to_string(block) + " indexed but not held");
  if (m.indexed) return m.parent == parent && same_tokens(block, tokens);
  if (parent >= 0 && !meta_[size_t(parent)].indexed) return false;
  // Taken: the same prefix computed twice (or, as rarely as 2^-64, another
  // one with the same key); this block stays the sequence's own.
  if (!index_.emplace(key, block).second) return false;
  m.indexed = true;
  m.parent = parent;
  m.key = key;
  std::copy(tokens, tokens + block_tokens_, tokens_.begin() + ptrdiff_t(block) * block_tokens_);
  if (parent >= 0) {
    Meta& p = meta_[size_t(parent)];
    m.next_sibling = p.first_child;
    p.first_child = block;
  }
  ++indexed_;
  return true;
}

}  // namespace troupe
