// Each decoder kernel against a plain reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gpu/cpu/kernels.h"
#include "gpu/dtype.h"
#include "tests/support/isa_support.h"

namespace troupe {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float range = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-range, range);
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

// The values every ISA must give, written from the definitions in
// vec_math.inl with the scalar exp (exp_approx is one lane of the vector
// one): exponentials summed in 8-lane groups in order, the lanes by hsum8's
// tree, then the rest one by one.
std::vector<float> defined_softmax(std::vector<float> x) {
  const size_t n = x.size();
  float mx = x[0];
  for (float v : x) mx = std::max(mx, v);
  float lanes[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t l = 0; l < 8; ++l) lanes[l] += (x[i + l] = kernels::exp_approx(x[i + l] - mx));
  float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
              ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) sum += (x[i] = kernels::exp_approx(x[i] - mx));
  const float inv = 1.0f / sum;
  for (float& v : x) v *= inv;
  return x;
}

TEST(Kernels, SoftmaxAndSiluGiveTheDefinedBitsOnEveryIsa) {
  test::IsaGuard guard;
  // Every tail length, and many rows: a sum's last bit often hides a
  // different order of adding, one row in a few shows it.
  std::vector<int> lengths{1, 3, 8, 9, 15, 16, 17, 24, 31, 32, 33, 100, 1000};
  std::mt19937 rng(9);
  for (int i = 0; i < 400; ++i) lengths.push_back(1 + int(rng() % 300));
  for (size_t r = 0; r < lengths.size(); ++r) {
    const int n = lengths[r];
    const auto x = random_vec(size_t(n), uint32_t(3 * r), 8.0f);
    const auto g = random_vec(size_t(n), uint32_t(3 * r + 1), 12.0f);
    const auto u = random_vec(size_t(n), uint32_t(3 * r + 2));
    const auto want = defined_softmax(x);
    std::vector<float> silu_want(static_cast<size_t>(n));
    for (size_t i = 0; i < size_t(n); ++i)
      silu_want[i] = g[i] / (1.0f + kernels::exp_approx(-g[i])) * u[i];
    for (Isa isa : test::vector_isas()) {
      force_isa(isa);
      auto y = x;
      kernels::softmax(y.data(), n);
      std::vector<float> s(static_cast<size_t>(n), std::nanf(""));
      kernels::silu_mul(g.data(), u.data(), s.data(), n);
      for (size_t i = 0; i < size_t(n); ++i) {
        ASSERT_EQ(y[i], want[i]) << isa_name(isa) << " softmax n " << n << " element " << i;
        ASSERT_EQ(s[i], silu_want[i]) << isa_name(isa) << " silu n " << n << " element " << i;
      }
    }
  }
}

TEST(Kernels, SiluMul) {
  auto g = random_vec(20, 5), u = random_vec(20, 6);
  std::vector<float> out(20);
  kernels::silu_mul(g.data(), u.data(), out.data(), 20);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_NEAR(out[i], g[i] / (1.0 + std::exp(-double(g[i]))) * u[i], 1e-5);
}

// GELU's tanh form (gelu_pytorch_tanh) times up, near the formula in double,
// and the same bits on every ISA and at every tail length.
TEST(Kernels, GeluTanhMul) {
  test::IsaGuard guard;
  for (int n : {1, 7, 8, 9, 16, 17, 37, 100}) {
    auto g = random_vec(size_t(n), uint32_t(20 + n), 6.0f), u = random_vec(size_t(n), 21);
    g[0] = -12.0f;  // far out on both sides: 0 and g * up
    if (n > 1) g[1] = 12.0f;
    std::vector<float> first;
    for (Isa isa : test::vector_isas()) {
      force_isa(isa);
      std::vector<float> out(static_cast<size_t>(n));
      kernels::gelu_tanh_mul(g.data(), u.data(), out.data(), n);
      for (size_t i = 0; i < size_t(n); ++i) {
        const double x = g[i];
        const double gelu =
            0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        EXPECT_NEAR(out[i], gelu * u[i], 1e-5 * (1 + std::abs(gelu * u[i]))) << n << " " << i;
      }
      if (first.empty()) first = out;
      EXPECT_EQ(out, first) << isa_name(isa) << " n " << n;
    }
  }
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

// RoPE scaling as transformers computes it. Llama 3.1's (factor 8, low 1,
// high 4, original context 8192, theta 500000, head 128): high frequencies
// kept, low ones / 8, those between blended; the expected values are
// transformers' formula in double.
TEST(Kernels, RopeScalingStretchesTheFrequencies) {
  const std::vector<float> plain = rope_frequencies(128, 500000.0f);
  ASSERT_EQ(plain.size(), 64u);
  RopeScaling llama3;
  llama3.kind = RopeScaling::Kind::Llama3;
  llama3.factor = 8;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_position = 8192;
  const std::vector<float> scaled = rope_frequencies(128, 500000.0f, llama3);
  const std::pair<int, double> expected[] = {{0, 1.0},
                                             {20, 0.016560440080994446},
                                             {30, 0.0013718935677611381},
                                             {40, 3.428102195952591e-05},
                                             {63, 3.068925988914511e-07}};
  for (const auto& [i, want] : expected) EXPECT_NEAR(scaled[size_t(i)], want, want * 2e-6) << i;
  EXPECT_EQ(scaled[20], plain[20]) << "high frequencies are kept exactly";
  // Linear: position p of the scaled table is position p / factor of the plain one.
  RopeScaling linear;
  linear.kind = RopeScaling::Kind::Linear;
  linear.factor = 2;
  const kernels::RopeTable stretched(64, 16, 10000.0f, linear), table(64, 16, 10000.0f);
  for (int pos : {0, 2, 10, 62})
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(stretched.cos(pos)[i], table.cos(pos / 2)[i]) << pos << " " << i;
      EXPECT_EQ(stretched.sin(pos)[i], table.sin(pos / 2)[i]) << pos << " " << i;
    }
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

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The array conversions (vectors of 8, then a tail) give the scalar
// conversions' bits for every value: rounding ties both ways, subnormal f16
// results, overflow to infinity, infinities and NaNs (which may sit beside
// ordinary values in a vector), at every offset and tail length.
TEST(DTypes, ArrayConversionsGiveTheScalarBits) {
  std::vector<float> src;
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) src.push_back(from_bits(uint32_t(rng())));  // any bits
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    // f16 and bf16 values, and the points halfway to their neighbours.
    const float f = f16_to_f32(uint16_t(h)), g = bf16_to_f32(uint16_t(h));
    uint32_t fb, gb;
    std::memcpy(&fb, &f, 4);
    std::memcpy(&gb, &g, 4);
    for (float x : {f, g, from_bits(fb + 0x1000), from_bits(fb + 0xfff), from_bits(gb + 0x8000),
                    from_bits(gb + 0x7fff)})
      src.push_back(x);
  }
  for (float x : {65504.0f, 65520.0f, 65519.99f, 1e-8f, 2.98e-8f, 2.99e-8f, INFINITY, -INFINITY,
                  NAN, -NAN, 0.0f, -0.0f})
    src.push_back(x);
  std::shuffle(src.begin(), src.end(), rng);
  for (DType dt : {DType::F16, DType::BF16}) {
    auto scalar = [dt](float x) { return dt == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x); };
    for (size_t offset : {size_t(0), size_t(3)}) {
      const size_t n = src.size() - offset;
      std::vector<uint16_t> got(n);
      convert_from_f32(src.data() + offset, dt, got.data(), n);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], scalar(src[offset + i]))
            << dtype_name(dt) << " of " << std::hexfloat << src[offset + i] << " at " << i;
      std::vector<float> back(n), want(n);
      convert_to_f32(got.data(), dt, back.data(), n);
      for (size_t i = 0; i < n; ++i) {
        want[i] = dt == DType::F16 ? f16_to_f32(got[i]) : bf16_to_f32(got[i]);
        if (std::isnan(want[i]))
          ASSERT_TRUE(std::isnan(back[i])) << i;
        else
          ASSERT_EQ(std::memcmp(&back[i], &want[i], 4), 0) << dtype_name(dt) << " " << got[i];
      }
    }
    for (size_t len = 0; len <= 17; ++len) {
      std::vector<uint16_t> got(len + 1, 0xabcd);
      convert_from_f32(src.data(), dt, got.data(), len);
      for (size_t i = 0; i < len; ++i) ASSERT_EQ(got[i], scalar(src[i])) << len;
      EXPECT_EQ(got[len], 0xabcd) << "wrote past " << len << " values";
    }
  }
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
