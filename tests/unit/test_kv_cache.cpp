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

TEST(KvCacheTest, SixteenBitCachesTakeHalfTheBytesAndRoundWhatTheyStore) {
  ModelConfig c;
  c.n_layers = 3;
  c.n_kv_heads = 2;
  c.head_dim = 12;
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    KvCache cache = KvCache::for_model(c, 4, 5, dt);
    EXPECT_EQ(cache.dtype(), dt);
    EXPECT_EQ(cache.bytes_per_token(), size_t(3 * 2 * 24) * dtype_size(dt));
    EXPECT_EQ(cache.total_bytes(), cache.bytes_per_token() * 20);
    EXPECT_EQ(KvCache::blocks_for_bytes(c, 4, cache.bytes_per_token() * 4 * 3, dt), 3);
    SequenceCache s;
    s.blocks = {3, 1};
    std::vector<float> k(24), v(24), k_back(24), v_back(24);
    for (int pos : {0, 5, 7})
      for (int layer = 0; layer < 3; ++layer) {
        for (int i = 0; i < 24; ++i) {
          k[size_t(i)] = 0.1f * float(i + 1) + float(layer) + 0.01f * float(pos);
          v[size_t(i)] = -k[size_t(i)] / 3.0f;
        }
        cache.store(layer, s, pos, k.data(), v.data());
        cache.load(layer, s, pos, k_back.data(), v_back.data());
        for (int i = 0; i < 24; ++i) {
          // What the cache holds is the value rounded to its type, once.
          auto rounded = [dt](float x) {
            return dt == DType::F16    ? f16_to_f32(f32_to_f16(x))
                   : dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(x))
                                       : x;
          };
          ASSERT_EQ(k_back[size_t(i)], rounded(k[size_t(i)])) << layer << " " << pos << " " << i;
          ASSERT_EQ(v_back[size_t(i)], rounded(v[size_t(i)])) << layer << " " << pos << " " << i;
        }
      }
    // Layer 0 at position 0 was not overwritten by the later writes.
    cache.load(0, s, 0, k_back.data(), v_back.data());
    EXPECT_NEAR(k_back[0], 0.1f, 1e-3f);
    // The attention kernels are told the element type.
    const kernels::PagedKv kv = cache.paged(1, s);
    EXPECT_EQ(kv.type, dt == DType::F16    ? kernels::KvType::F16
                       : dt == DType::BF16 ? kernels::KvType::BF16
                                           : kernels::KvType::F32);
  }
}

TEST(KvCacheTest, BlockTablesMustCoverTheStep) {
  KvCache cache(2, 2, 4, 16, 4);
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
  EXPECT_THROW(KvCache(2, 1, 8, 16, 0), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
