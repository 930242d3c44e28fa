// The replica's book of KV blocks with prefix caching: holds, the index of
// full blocks by their tokens and the block before them, and eviction.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "scheduler/block_book.h"

namespace troupe {
namespace {

// The chain keys of the full blocks of `tokens`, as a sequence computes them.
std::vector<uint64_t> keys_of(const BlockBook& book, const std::vector<int>& tokens) {
  std::vector<uint64_t> keys;
  const size_t b = size_t(book.block_tokens());
  for (size_t i = 0; (i + 1) * b <= tokens.size(); ++i)
    keys.push_back(
        book.chain_key(keys.empty() ? BlockBook::kRootKey : keys.back(), tokens.data() + i * b));
  return keys;
}

int match(const BlockBook& book, const std::vector<int>& tokens, int max_blocks,
          std::vector<int>& out) {
  const std::vector<uint64_t> keys = keys_of(book, tokens);
  return book.match(keys.data(), tokens.data(), max_blocks, out);
}

// Indexes block i of a sequence holding `tokens`.
bool index(BlockBook& book, int block, int parent, const std::vector<int>& tokens, int i) {
  const std::vector<uint64_t> keys = keys_of(book, tokens);
  return book.index(block, parent, keys[size_t(i)],
                    tokens.data() + size_t(i) * size_t(book.block_tokens()));
}

// A sequence holding `tokens` in fresh blocks, indexed as it would be once
// they are computed.
std::vector<int> filled(BlockBook& book, const std::vector<int>& tokens) {
  std::vector<int> blocks;
  const int n = int(tokens.size()) / book.block_tokens();
  book.allocate(n, blocks);
  for (int i = 0; i < n; ++i)
    index(book, blocks[size_t(i)], i == 0 ? -1 : blocks[size_t(i - 1)], tokens, i);
  return blocks;
}

TEST(BlockBook, ReleasedFullBlocksStayCachedAndCountAsFree) {
  BlockBook book(8, 2, true);
  const std::vector<int> t{5, 6, 7, 8, 9, 10};
  const std::vector<int> a = filled(book, t);
  EXPECT_EQ(book.used_count(), 3);
  EXPECT_EQ(book.cached_count(), 3);
  book.release(a);
  EXPECT_EQ(book.used_count(), 0);
  EXPECT_EQ(book.free_count(), 8);
  EXPECT_EQ(book.cached_count(), 3);

  std::vector<int> hit;
  EXPECT_EQ(match(book, t, 3, hit), 3);
  EXPECT_EQ(hit, a);
  hit.clear();
  EXPECT_EQ(match(book, t, 2, hit), 2);  // never past max_blocks
  book.acquire(hit);
  EXPECT_EQ(book.used_count(), 2);
  EXPECT_TRUE(book.held(a[0]));
  EXPECT_FALSE(book.held(a[2]));
  book.acquire(hit);  // a second sequence shares them
  EXPECT_TRUE(book.shared(a[0]));
  EXPECT_EQ(book.used_count(), 2);
  book.release(hit);
  book.release(hit);
  EXPECT_EQ(book.used_count(), 0);
  EXPECT_THROW(book.release(hit), std::logic_error);
}

TEST(BlockBook, AMatchIsExactInTokensAndInTheChainBeforeThem) {
  BlockBook book(16, 2, true);
  book.release(filled(book, {1, 2, 3, 4}));
  std::vector<int> hit;
  const std::vector<int> other_tail{1, 2, 3, 5};
  EXPECT_EQ(match(book, other_tail, 2, hit), 1);
  hit.clear();
  // The second block's tokens alone, without the first before them.
  const std::vector<int> tail_only{3, 4};
  EXPECT_EQ(match(book, tail_only, 1, hit), 0);
  const std::vector<int> other_head{1, 9, 3, 4};
  EXPECT_EQ(match(book, other_head, 2, hit), 0);
}

TEST(BlockBook, TheSamePrefixIsIndexedOnceAndOnlyAfterAnIndexedParent) {
  BlockBook book(16, 2, true);
  const std::vector<int> t{1, 2, 3, 4};
  const std::vector<int> a = filled(book, t);
  std::vector<int> b;
  book.allocate(2, b);
  EXPECT_FALSE(index(book, b[0], -1, t, 0));  // computed twice: a's stays
  EXPECT_FALSE(index(book, b[1], b[0], t, 1));
  EXPECT_TRUE(index(book, a[0], -1, t, 0));   // already, the same
  EXPECT_FALSE(index(book, a[1], -1, t, 1));  // already, after another parent
  EXPECT_EQ(book.cached_count(), 2);
  book.release(b);  // not indexed: back to the pool
  EXPECT_EQ(book.used_count(), 2);
  EXPECT_EQ(book.free_count(), 14);
  BlockBook off(4, 2, false);
  std::vector<int> c;
  off.allocate(1, c);
  EXPECT_FALSE(index(off, c[0], -1, t, 0));
  off.release(c);
  std::vector<int> hit;
  EXPECT_EQ(match(off, t, 1, hit), 0);
  EXPECT_EQ(off.cached_count(), 0);
}

TEST(BlockBook, FreshBlocksEvictTheLeastRecentlyReleasedTailFirst) {
  BlockBook book(6, 2, true);
  const std::vector<int> old{1, 1, 2, 2, 3, 3}, recent{4, 4, 5, 5};
  book.release(filled(book, old));
  book.release(filled(book, recent));
  EXPECT_EQ(book.free_count(), 6);
  std::vector<int> fresh;
  book.allocate(1, fresh);  // the 6th never-used block, nothing evicted
  EXPECT_EQ(book.cached_count(), 5);
  book.allocate(1, fresh);  // evicts old's tail
  EXPECT_EQ(book.cached_count(), 4);
  std::vector<int> hit;
  EXPECT_EQ(match(book, old, 3, hit), 2);
  hit.clear();
  EXPECT_EQ(match(book, recent, 2, hit), 2);
  hit.clear();
  book.allocate(3, fresh);  // old's head goes, and its descendants with it
  EXPECT_EQ(match(book, old, 3, hit), 0);
  EXPECT_EQ(book.cached_count(), 1);
  EXPECT_EQ(match(book, recent, 2, hit), 1);
  EXPECT_THROW(book.allocate(2, fresh), KvCacheFull);
  EXPECT_EQ(fresh.size(), 5u);  // all or nothing
}

TEST(BlockBook, TwoChainsShareTheirHeadUntilItIsEvictedLast) {
  BlockBook book(5, 2, true);
  const std::vector<int> a{1, 1, 2, 2}, b{1, 1, 3, 3};
  std::vector<int> ab = filled(book, a);
  // b shares a's first block and continues it with its own.
  std::vector<int> hit;
  ASSERT_EQ(match(book, b, 2, hit), 1);
  EXPECT_EQ(hit[0], ab[0]);
  book.acquire(hit);
  book.allocate(1, hit);
  EXPECT_TRUE(index(book, hit[1], hit[0], b, 1));
  book.release(hit);
  book.release(ab);
  EXPECT_EQ(book.cached_count(), 3);
  // b's tail (released first) goes first, then a's; the head, released
  // last, stays findable for both.
  std::vector<int> fresh;
  book.allocate(4, fresh);
  EXPECT_EQ(book.cached_count(), 1);
  std::vector<int> found;
  EXPECT_EQ(match(book, b, 2, found), 1);
  found.clear();
  EXPECT_EQ(match(book, a, 2, found), 1);
  found.clear();
  book.allocate(1, fresh);
  EXPECT_EQ(book.cached_count(), 0);
  EXPECT_EQ(match(book, a, 2, found), 0);
  book.release(fresh);
  EXPECT_EQ(book.free_count(), 5);
}

TEST(BlockBook, UnindexedHeldDescendantsReturnWhenReleased) {
  BlockBook book(4, 1, true);
  const std::vector<int> t{7, 8, 9};
  std::vector<int> chain = filled(book, t);
  // The head alone let go and evicted while its descendants are held
  // (a bookkeeping order the scheduler never makes, handled all the same).
  std::vector<int> head{chain[0]}, rest{chain[1], chain[2]};
  book.acquire(rest);
  book.release(chain);
  EXPECT_EQ(book.free_count(), 2);  // the head cached, one never used
  std::vector<int> fresh;
  book.allocate(2, fresh);
  EXPECT_EQ(book.cached_count(), 0);
  book.release(rest);
  EXPECT_EQ(book.free_count(), 2);
  book.release(fresh);
  EXPECT_EQ(book.free_count(), 4);
}

}  // namespace
}  // namespace troupe
