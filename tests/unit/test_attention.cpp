// Paged attention (kernels::attend_head, kernels::attend_tile) against a
// scalar emulation of its one summation order, bit for bit, on every ISA and
// for every cache element type (a 16-bit cache as the f32 values it holds);
// against a double-precision softmax within rounding; and the property the
// engine leans on: a query's output does not depend on the tile it is in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gpu/cpu/gemm.h"
#include "gpu/cpu/kernels.h"
#include "gpu/dtype.h"
#include "gpu/kv_cache.h"
#include "tests/support/isa_support.h"

namespace troupe {
namespace {

using test::IsaGuard;
using test::vector_isas;

using kernels::HeadTile;
using kernels::kTileQueries;
using kernels::PagedKv;

// A cache of `positions` rows of `kv_heads` heads, in blocks that are not in
// order (block b of the sequence is storage block blocks[b]), stored as
// `dtype`; `keys` and `values` hold the f32 numbers it stores.
struct Cache {
  int hd, kv_heads, block_tokens, positions;
  DType dtype;
  std::vector<float> keys, values;
  std::vector<char> key_bytes, value_bytes;
  std::vector<int> blocks;

  Cache(int hd_, int kv_heads_, int block_tokens_, int positions_, uint32_t seed,
        DType dtype_ = DType::F32)
      : hd(hd_),
        kv_heads(kv_heads_),
        block_tokens(block_tokens_),
        positions(positions_),
        dtype(dtype_) {
    const int n_blocks = (positions + block_tokens - 1) / block_tokens;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1.5f, 1.5f);
    // One spare block, so that storage block ids are not 0..n-1.
    keys.resize(size_t(n_blocks + 1) * size_t(block_tokens) * size_t(kv_heads * hd));
    values.resize(keys.size());
    for (auto& v : keys) v = d(rng);
    for (auto& v : values) v = d(rng);
    for (auto [f, bytes] : {std::pair{&keys, &key_bytes}, std::pair{&values, &value_bytes}}) {
      bytes->resize(f->size() * dtype_size(dtype));
      convert_from_f32(f->data(), dtype, bytes->data(), f->size());
      convert_to_f32(bytes->data(), dtype, f->data(), f->size());
    }
    blocks.resize(size_t(n_blocks));
    for (int b = 0; b < n_blocks; ++b) blocks[size_t(b)] = n_blocks - b;
  }
  PagedKv paged() const {
    const kernels::KvType type = kv_type(dtype);
    return {key_bytes.data(),
            value_bytes.data(),
            blocks.data(),
            block_tokens,
            size_t(block_tokens) * size_t(kv_heads * hd),
            size_t(kv_heads * hd),
            type};
  }
  const float* key(int j, size_t off) const { return row(keys, j, off); }
  const float* value(int j, size_t off) const { return row(values, j, off); }

 private:
  const float* row(const std::vector<float>& v, int j, size_t off) const {
    return v.data() +
           (size_t(blocks[size_t(j / block_tokens)]) * size_t(block_tokens) +
            size_t(j % block_tokens)) *
               size_t(kv_heads * hd) +
           off;
  }
};

// The documented order of a score (attention_kernel.inl), one lane at a time.
float emulated_score(const float* q, const float* k, int hd, bool as_dot) {
  const int h8 = hd / 8 * 8;
  float lane[8] = {};
  float s;
  if (!as_dot) {
    for (int i = 0; i < h8; ++i) lane[i % 8] = std::fma(q[i], k[i], lane[i % 8]);
    s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  } else {
    // kernels::dot: two accumulators over 16 values, one over a last 8, then
    // a horizontal sum of their sum.
    float a0[8] = {}, a1[8] = {};
    int i = 0;
    for (; i + 16 <= hd; i += 16)
      for (int l = 0; l < 8; ++l) {
        a0[l] = std::fma(q[i + l], k[i + l], a0[l]);
        a1[l] = std::fma(q[i + 8 + l], k[i + 8 + l], a1[l]);
      }
    for (; i + 8 <= hd; i += 8)
      for (int l = 0; l < 8; ++l) a0[l] = std::fma(q[i + l], k[i + l], a0[l]);
    for (int l = 0; l < 8; ++l) lane[l] = a0[l] + a1[l];
    s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  }
  for (int i = h8; i < hd; ++i) s = std::fma(q[i], k[i], s);
  return s;
}

std::vector<float> emulated_attention(const Cache& c, const float* q, int n, size_t off,
                                      float scale) {
  std::vector<float> scores(static_cast<size_t>(n));
  for (int j0 = 0; j0 < n; j0 += c.block_tokens) {
    const int end = std::min(n - j0, c.block_tokens);
    for (int o = 0; o < end; ++o)
      scores[size_t(j0 + o)] = emulated_score(q, c.key(j0 + o, off), c.hd, o >= (end & ~3)) * scale;
  }
  kernels::softmax(scores.data(), n);
  std::vector<float> out(static_cast<size_t>(c.hd));
  for (int d = 0; d < c.hd; ++d) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc = std::fma(scores[size_t(j)], c.value(j, off)[d], acc);
    out[size_t(d)] = acc;
  }
  return out;
}

// Over positions [from, n): a sliding window's layers see only those.
std::vector<double> exact_attention(const Cache& c, const float* q, int n, size_t off, double scale,
                                    int from = 0) {
  std::vector<double> s(static_cast<size_t>(n));
  double mx = -1e300;
  for (int j = 0; j < from; ++j) s[size_t(j)] = -1e300;
  for (int j = from; j < n; ++j) {
    double acc = 0;
    for (int i = 0; i < c.hd; ++i) acc += double(q[i]) * c.key(j, off)[i];
    s[size_t(j)] = acc * scale;
    mx = std::max(mx, s[size_t(j)]);
  }
  double sum = 0;
  for (auto& v : s) sum += (v = std::exp(v - mx));
  std::vector<double> out(static_cast<size_t>(c.hd), 0.0);
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < c.hd; ++d) out[size_t(d)] += s[size_t(j)] / sum * c.value(j, off)[d];
  return out;
}

struct Shape {
  int hd, block_tokens;
};

class AttentionTest : public ::testing::TestWithParam<std::tuple<Shape, DType>> {};

TEST_P(AttentionTest, TilesMatchTheEmulatedOrderOnEveryIsaAndTheExactSoftmax) {
  const auto [shape, dtype] = GetParam();
  const auto [hd, bt] = shape;
  const int positions = 75, kv_heads = 2;
  const Cache cache(hd, kv_heads, bt, positions, 11, dtype);
  const size_t off = size_t(hd);  // kv head 1
  const float scale = 1.0f / std::sqrt(float(hd));
  std::mt19937 rng(uint32_t(hd * 100 + bt));
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<float> q(size_t(kTileQueries) * size_t(hd));
  for (auto& v : q) v = d(rng);

  // Tiles as the model builds them (consecutive tokens, latest first; heads
  // of a group at one position) and as they could be (any lengths).
  std::vector<std::vector<int>> lengths;
  for (int count = 1; count <= kTileQueries; ++count) {
    std::vector<int> consecutive, same, any;
    for (int i = 0; i < count; ++i) {
      consecutive.push_back(positions - i);
      same.push_back(37);
      any.push_back(1 + int(rng() % unsigned(positions)));
    }
    lengths.push_back(consecutive);
    lengths.push_back(same);
    lengths.push_back(any);
  }
  IsaGuard guard;
  std::vector<float> scores(size_t(kTileQueries) * size_t(positions));
  std::vector<float> scratch(kernels::tile_scratch_floats(hd));
  std::vector<float> out(size_t(kTileQueries) * size_t(hd));
  for (const auto& n : lengths) {
    std::vector<std::vector<float>> want;
    for (size_t i = 0; i < n.size(); ++i) {
      want.push_back(emulated_attention(cache, &q[i * size_t(hd)], n[i], off, scale));
      const auto exact = exact_attention(cache, &q[i * size_t(hd)], n[i], off, double(scale));
      for (int e = 0; e < hd; ++e)
        ASSERT_NEAR(want.back()[size_t(e)], exact[size_t(e)], 2e-5) << "element " << e;
    }
    for (Isa isa : vector_isas()) {
      force_isa(isa);
      HeadTile tile;
      tile.count = int(n.size());
      for (int i = 0; i < tile.count; ++i) {
        tile.q[i] = &q[size_t(i) * size_t(hd)];
        tile.n[i] = n[size_t(i)];
        tile.scores[i] = &scores[size_t(i) * size_t(positions)];
        tile.out[i] = &out[size_t(i) * size_t(hd)];
      }
      std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
      kernels::attend_tile(tile, hd, scale, cache.paged(), off, scratch.data());
      for (int i = 0; i < tile.count; ++i)
        for (int e = 0; e < hd; ++e)
          ASSERT_EQ(out[size_t(i) * size_t(hd) + size_t(e)], want[size_t(i)][size_t(e)])
              << isa_name(isa) << " " << dtype_name(dtype) << " hd " << hd << " block " << bt
              << " tile of " << tile.count << ", query " << i << " (n " << n[size_t(i)]
              << ") element " << e;
      // Alone, each query gives the same values.
      std::vector<float> one(size_t(hd), std::numeric_limits<float>::quiet_NaN());
      kernels::attend_head(tile.q[0], hd, scale, cache.paged(), off, n[0], scores.data(),
                           one.data());
      for (int e = 0; e < hd; ++e) ASSERT_EQ(one[size_t(e)], want[0][size_t(e)]) << isa_name(isa);
    }
  }
}

// A sliding window's layer: each query sees its last `window` positions;
// the earlier ones weigh nothing, and the tile's queries keep their own
// windows.
TEST(Attention, ASlidingWindowSeesOnlyItsLastPositions) {
  const int hd = 64, positions = 75, window = 16;
  const Cache cache(hd, 1, 16, positions, 5, DType::F32);
  const float scale = 0.125f;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<float> q(size_t(kTileQueries) * size_t(hd));
  for (auto& v : q) v = d(rng);
  std::vector<float> scores(size_t(kTileQueries) * size_t(positions));
  std::vector<float> scratch(kernels::tile_scratch_floats(hd));
  std::vector<float> out(size_t(kTileQueries) * size_t(hd));
  IsaGuard guard;
  for (Isa isa : vector_isas()) {
    force_isa(isa);
    HeadTile tile;
    tile.count = kTileQueries;
    for (int i = 0; i < tile.count; ++i) {
      tile.q[i] = &q[size_t(i) * size_t(hd)];
      tile.n[i] = positions - 3 * i;  // 75 .. 54, and one inside the window
      if (i == kTileQueries - 1) tile.n[i] = 10;
      tile.from[i] = std::max(0, tile.n[i] - window);
      tile.scores[i] = &scores[size_t(i) * size_t(positions)];
      tile.out[i] = &out[size_t(i) * size_t(hd)];
    }
    kernels::attend_tile(tile, hd, scale, cache.paged(), 0, scratch.data());
    for (int i = 0; i < tile.count; ++i) {
      const auto exact = exact_attention(cache, tile.q[i], tile.n[i], 0, scale, tile.from[i]);
      const auto all = exact_attention(cache, tile.q[i], tile.n[i], 0, scale);
      double apart = 0;
      for (int e = 0; e < hd; ++e) {
        ASSERT_NEAR(out[size_t(i) * size_t(hd) + size_t(e)], exact[size_t(e)], 2e-5)
            << isa_name(isa) << " query " << i << " element " << e;
        apart = std::max(apart, std::abs(exact[size_t(e)] - all[size_t(e)]));
      }
      if (tile.from[i] > 0) {
        EXPECT_GT(apart, 1e-3) << "the window changed nothing: query " << i;
      }
    }
  }
}

// Head sizes below, at and past each vector width, with remainders of 8 and
// of 16; blocks that are and are not multiples of four keys.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Combine(::testing::Values(Shape{8, 16}, Shape{32, 16}, Shape{64, 16}, Shape{128, 16},
                                         Shape{72, 16}, Shape{36, 16}, Shape{6, 16}, Shape{64, 6},
                                         Shape{40, 1}, Shape{24, 3}, Shape{80, 32}),
                       ::testing::Values(DType::F32, DType::F16, DType::BF16)));

}  // namespace
}  // namespace troupe
