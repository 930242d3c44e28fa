#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "gpu/kv_cache.h"

namespace troupe {
namespace {

TEST(KvCacheTest, BytesPerTokenAndSizing) {
  ModelConfig c;
  c.n_layers = 5;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  KvCache cache = KvCache::for_model(c, 16, 10);
  EXPECT_EQ(cache.bytes_per_token(), size_t(5 * 2 * 64 * 4));
  EXPECT_EQ(cache.total_bytes(), cache.bytes_per_token() * 160);
  EXPECT_EQ(KvCache::blocks_for_bytes(c, 16, cache.bytes_per_token() * 16 * 7 + 5), 7);
}

TEST(KvCacheTest, BlockTablesMustCoverTheStep) {
  KvCache cache(2, 8, 16, 4);
  SequenceCache s;
  s.blocks = contiguous_blocks(1, 2);
  EXPECT_EQ(s.blocks, (std::vector<int>{1, 2}));
  EXPECT_NO_THROW(cache.check_covers(s, 32));
  try {
    cache.check_covers(s, 33);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds 32 positions; the step needs 33"),
              std::string::npos);
  }
  s.blocks = {0, 4};
  EXPECT_THROW(cache.check_covers(s, 1), std::invalid_argument);
  EXPECT_THROW(KvCache(2, 8, 16, 0), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
