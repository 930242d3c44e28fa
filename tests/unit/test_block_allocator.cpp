#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "scheduler/block_allocator.h"

namespace troupe {
namespace {

TEST(BlockAllocator, AllocatesReleasesAndRefusesWhenFull) {
  BlockAllocator a(10);
  std::vector<int> s1, s2;
  a.allocate(4, s1);
  a.allocate(6, s2);
  EXPECT_EQ(a.free_count(), 0);
  std::vector<int> s3;
  try {
    a.allocate(1, s3);
    FAIL() << "expected KvCacheFull";
  } catch (const KvCacheFull& e) {
    EXPECT_EQ(e.wanted(), 1);
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos);
  }
  EXPECT_TRUE(s3.empty());
  a.release(s1);
  EXPECT_EQ(a.free_count(), 4);
  EXPECT_THROW(a.release(s1), std::logic_error);  // double free is a bug, caught
  a.allocate(3, s3);
  EXPECT_EQ(a.used_count(), 9);
  // All ids distinct.
  std::vector<int> all = s2;
  all.insert(all.end(), s3.begin(), s3.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::unique(all.begin(), all.end()), all.end());
}

// Sequences that grow together, a block at a time, each keep consecutive
// ids (the attention kernels stream them), while the pool has room.
TEST(BlockAllocator, SequencesGrowingTogetherKeepTheirBlocksAdjacent) {
  BlockAllocator a(256);
  std::vector<std::vector<int>> seqs(8);
  for (auto& s : seqs) a.allocate(2, s);  // the prompts
  for (int round = 0; round < 10; ++round)
    for (auto& s : seqs) a.allocate(1, s);
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t j = 1; j < seqs[i].size(); ++j)
      EXPECT_EQ(seqs[i][j], seqs[i][j - 1] + 1) << "sequence " << i << " block " << j;
  // A sequence that ends frees a stretch the next one starts in.
  a.release(seqs[3]);
  std::vector<int> next;
  a.allocate(3, next);
  EXPECT_EQ(next[1], next[0] + 1);
  EXPECT_EQ(next[2], next[1] + 1);
}

// However fragmented, every free block can be had.
TEST(BlockAllocator, AFragmentedPoolHandsOutEveryFreeBlock) {
  BlockAllocator a(64);
  std::vector<int> all;
  a.allocate(64, all);
  std::vector<int> odd;
  for (int b : all)
    if (b % 2) odd.push_back(b);
  a.release(odd);
  std::vector<int> again;
  a.allocate(32, again);
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, odd);
  EXPECT_EQ(a.free_count(), 0);
  EXPECT_THROW(a.allocate(1, again), KvCacheFull);
}

TEST(BlockAllocator, NoLeakAfterManySequences) {
  BlockAllocator a(64);
  std::mt19937 rng(9);
  struct Seq {
    std::vector<int> blocks;
    int length = 0;
  };
  std::vector<Seq> live(8);
  for (int round = 0; round < 2000; ++round) {
    auto& s = live[rng() % live.size()];
    if (rng() % 3 == 0) {
      a.release(s.blocks);
      s.blocks.clear();
      s.length = 0;
    } else {
      const int grow = s.length + int(rng() % 40);
      try {
        a.allocate((grow + 15) / 16 - int(s.blocks.size()), s.blocks);
        s.length = grow;
      } catch (const KvCacheFull&) {
        // all-or-nothing: the sequence keeps exactly what it had
        EXPECT_EQ(int(s.blocks.size()), (s.length + 15) / 16);
      }
    }
    int held = 0;
    for (auto& q : live) held += int(q.blocks.size());
    ASSERT_EQ(held, a.used_count());
  }
  for (auto& s : live) a.release(s.blocks);
  EXPECT_EQ(a.free_count(), 64);
}

}  // namespace
}  // namespace troupe
