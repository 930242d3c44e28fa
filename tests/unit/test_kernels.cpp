// Each decoder kernel against a plain reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu/block_allocator.h"
#include "gpu/cpu/kernels.h"
#include "gpu/dtype.h"
#include "gpu/kv_cache.h"

namespace troupe {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Kernels, DotAndAxpy) {
  for (int n : {1, 7, 8, 15, 16, 17, 64, 131}) {
    auto a = random_vec(size_t(n), 1), b = random_vec(size_t(n), 2);
    double ref = 0;
    for (int i = 0; i < n; ++i) ref += double(a[size_t(i)]) * b[size_t(i)];
    EXPECT_NEAR(kernels::dot(a.data(), b.data(), n), ref, 1e-4) << n;
    auto y = b;
    kernels::axpy(0.5f, a.data(), y.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(y[size_t(i)], b[size_t(i)] + 0.5f * a[size_t(i)], 1e-6);
  }
}

TEST(Kernels, RmsNorm) {
  const int n = 37;
  auto x = random_vec(n, 3), w = random_vec(n, 4);
  std::vector<float> out(n);
  kernels::rmsnorm(x.data(), w.data(), out.data(), n, 1e-5f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(out[size_t(i)], w[size_t(i)] * x[size_t(i)] * inv, 1e-5);
}

TEST(Kernels, SoftmaxSumsToOneAndIsStableForLargeInputs) {
  std::vector<float> x{1000.0f, 1001.0f, 999.0f, -50.0f};
  kernels::softmax(x.data(), 4);
  double sum = 0;
  for (float v : x) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  const double e0 = std::exp(-1.0), e2 = std::exp(-2.0);
  EXPECT_NEAR(x[1], 1.0 / (1.0 + e0 + e2), 1e-6);
  EXPECT_NEAR(x[0], e0 / (1.0 + e0 + e2), 1e-6);
}

TEST(Kernels, SiluMul) {
  auto g = random_vec(20, 5), u = random_vec(20, 6);
  std::vector<float> out(20);
  kernels::silu_mul(g.data(), u.data(), out.data(), 20);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_NEAR(out[i], g[i] / (1.0 + std::exp(-double(g[i]))) * u[i], 1e-5);
}

TEST(Kernels, RopeLayoutsRotateTheirPairs) {
  const int hd = 8, heads = 2, pos = 5;
  kernels::RopeTable table(16, hd, 10000.0f);
  auto v = random_vec(size_t(hd * heads), 7);
  auto inter = v, half = v;
  kernels::rope(inter.data(), heads, hd, pos, table, RopeLayout::Interleaved);
  kernels::rope(half.data(), heads, hd, pos, table, RopeLayout::RotateHalf);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      const double f = pos * std::pow(10000.0, -2.0 * i / hd);
      const double c = std::cos(f), s = std::sin(f);
      const float* x = v.data() + h * hd;
      // interleaved: (2i, 2i+1)
      EXPECT_NEAR(inter[size_t(h * hd + 2 * i)], x[2 * i] * c - x[2 * i + 1] * s, 1e-5);
      EXPECT_NEAR(inter[size_t(h * hd + 2 * i + 1)], x[2 * i] * s + x[2 * i + 1] * c, 1e-5);
      // rotate-half: (i, i + hd/2)
      EXPECT_NEAR(half[size_t(h * hd + i)], x[i] * c - x[i + hd / 2] * s, 1e-5);
      EXPECT_NEAR(half[size_t(h * hd + i + hd / 2)], x[i] * s + x[i + hd / 2] * c, 1e-5);
    }
  // Position 0 is the identity.
  auto z = v;
  kernels::rope(z.data(), heads, hd, 0, table, RopeLayout::Interleaved);
  EXPECT_EQ(z, v);
}

TEST(DTypes, ConversionsRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035e-05f, 5.96e-08f, 3.14159f}) {
    EXPECT_NEAR(f16_to_f32(f32_to_f16(f)), f, std::fabs(f) * 1e-3 + 6e-8) << f;
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(f)), f, std::fabs(f) * 8e-3) << f;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  // Every f16 bit pattern survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  // bf16 rounds to nearest even.
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // tie -> even (up)
}

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

TEST(BlockAllocator, NoLeakAfterManySequences) {
  KvCache cache(2, 8, 16, 64);
  std::mt19937 rng(9);
  std::vector<SequenceCache> live(8);
  for (int round = 0; round < 2000; ++round) {
    auto& s = live[rng() % live.size()];
    if (rng() % 3 == 0) {
      cache.release(s);
    } else {
      const int grow = s.length + int(rng() % 40);
      try {
        cache.reserve(s, grow);
        s.length = grow;
      } catch (const KvCacheFull&) {
        // all-or-nothing: the sequence keeps exactly what it had
        EXPECT_EQ(int(s.blocks.size()), (s.length + 15) / 16);
      }
    }
    int held = 0;
    for (auto& q : live) held += int(q.blocks.size());
    ASSERT_EQ(held, cache.allocator().used_count());
  }
  for (auto& s : live) cache.release(s);
  EXPECT_EQ(cache.allocator().free_count(), 64);
}

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

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {
TEST(Kernels, ExpApproxIsAccurate) {
  for (float x = -87.0f; x < 88.0f; x += 0.37f) {
    const double want = std::exp(double(x));
    EXPECT_NEAR(kernels::exp_approx(x) / want, 1.0, 3e-7) << x;
  }
  EXPECT_EQ(kernels::exp_approx(0.0f), 1.0f);
  EXPECT_LT(kernels::exp_approx(-1000.0f), 1e-37f);
}
}  // namespace
}  // namespace troupe
