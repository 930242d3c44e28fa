// Block-quantized weights kept as their parts (packed_matrix.h): every
// product over them must equal, bit for bit, the f32 (or bf16) product over
// the dequantized weights, for every kind, ISA, batch size, thread split and
// cut into pieces, so that a quantized model answers as its dequantization
// does, in any layout and batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/cpu/gemm.h"
#include "gpu/loaders/ggml_quants.h"
#include "support/test_support.h"
#include "tests/support/isa_support.h"
#include "util/gguf_file.h"

namespace troupe {
namespace {

using test::IsaGuard;
using test::supported_isas;

struct Quantized {
  std::string name;
  Tensor blocks;  // a blocks view
  Tensor f32;     // its dequantization
};

Tensor dequantized(const Tensor& t) {
  Tensor out = Tensor::zeros(t.shape(), DType::F32);
  const std::vector<float> v = t.to_f32();
  std::memcpy(out.raw_mut(), v.data(), v.size() * sizeof(float));
  return out;
}

// Every kind with parts, from dequant.gguf (6 rows of 512: one partial
// panel each, rows small, large, constant, ...).
const std::vector<Quantized>& kinds() {
  static const GgufFile f = GgufFile::open(test::data_path("gguf/dequant.gguf"));
  static const std::vector<Quantized> all = [] {
    std::vector<Quantized> out;
    for (const GgufTensorInfo& t : f.tensors()) {
      if (t.name.ends_with(".expected") || !quant_form(t.type)) continue;
      const Tensor b = Tensor::blocks_view(t.data, {t.ne[1], t.ne[0]}, t.type, f.keepalive());
      out.push_back({t.name, b, dequantized(b)});
    }
    return out;
  }();
  return all;
}

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Where a and b first differ in their bits, or -1.
long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return long(i);
  return -1;
}

std::vector<float> product(const PackedMatrix& w, const std::vector<float>& x, int M) {
  std::vector<float> y(size_t(M) * size_t(w.rows()), std::nanf(""));
  gemm_panels(x.data(), M, w.cols(), w, 0, w.panels(), y.data(), w.rows());
  return y;
}

TEST(QuantizedGemm, EveryKindGivesTheF32ProductOfItsDequantizedWeights) {
  ASSERT_EQ(kinds().size(), 12u);  // q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K iq4_nl iq4_xs
  IsaGuard guard;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Quantized& q : kinds()) {
      SCOPED_TRACE(q.name + " in " + dtype_name(dt));
      const PackedMatrix packed = PackedMatrix::pack({q.blocks}, dt);
      const PackedMatrix plain = PackedMatrix::pack({q.f32}, dt);
      ASSERT_TRUE(packed.quantized());
      EXPECT_EQ(packed.dtype(), dt);
      // A fifth to a little over half of f32's bytes (a partial panel's
      // padding rows count in both).
      EXPECT_LT(packed.bytes(), PackedMatrix::pack({q.f32}, DType::F32).bytes() * 6 / 10);
      std::vector<float> row(size_t(packed.cols())), want(row.size());
      for (int n = 0; n < packed.rows(); ++n) {
        packed.row_to_f32(n, row.data());
        plain.row_to_f32(n, want.data());
        ASSERT_EQ(first_difference(row, want), -1) << "row " << n;
      }
      for (Isa isa : supported_isas()) {
        force_isa(isa);
        for (int M : {1, 2, 3, 5, 6, 7, 13, 31, 70}) {
          const auto x = random_vec(size_t(M) * size_t(packed.cols()), uint32_t(M));
          ASSERT_EQ(first_difference(product(packed, x, M), product(plain, x, M)), -1)
              << isa_name(isa) << " M=" << M;
        }
      }
    }
}

// A fused matrix of blocks of different kinds (as q, k and v of a Q4_K_M
// file: q4_K and q6_K), split over threads and rows as the engine splits it.
TEST(QuantizedGemm, MixedKindsAndThreadSplitsGiveTheF32Bits) {
  const Checkpoint ck = load_checkpoint(test::data_path("gguf/llama-q4_k_m.gguf"));
  const LayerTensors& t = ck.layers[0];
  ASSERT_NE(t.wq.block_type(), t.wv.block_type());
  IsaGuard guard;
  for (DType dt : {DType::F32, DType::BF16}) {
    const PackedMatrix packed = PackedMatrix::pack({t.wq, t.wk, t.wv}, dt);
    const PackedMatrix plain =
        PackedMatrix::pack({dequantized(t.wq), dequantized(t.wk), dequantized(t.wv)}, dt);
    ASSERT_TRUE(packed.quantized());
    for (Isa isa : supported_isas()) {
      force_isa(isa);
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        for (int M : {1, 4, 17, 200}) {  // 200: split by rows
          const auto x = random_vec(size_t(M) * size_t(packed.cols()), 9);
          std::vector<float> a(size_t(M) * size_t(packed.rows())), b(a.size());
          matmul(pool, x.data(), M, packed.cols(), packed, a.data(), packed.rows());
          matmul(pool, x.data(), M, plain.cols(), plain, b.data(), plain.rows());
          ASSERT_EQ(first_difference(a, b), -1)
              << dtype_name(dt) << " " << isa_name(isa) << " threads=" << threads << " M=" << M;
        }
      }
    }
  }
}

// Pieces on group boundaries keep the blocks; pieces that cut a group lay the
// matrix out in f32. Either way the sums and the per-piece chains are the
// f32 matrix's.
TEST(QuantizedGemm, PiecesKeepOrDropTheBlocksAndGiveTheF32Bits) {
  const Quantized* q4k = nullptr;
  for (const Quantized& q : kinds())
    if (q.name == "q4_K") q4k = &q;
  ASSERT_NE(q4k, nullptr);
  IsaGuard guard;
  for (DType dt : {DType::F32, DType::BF16})
    for (const std::vector<int>& bounds :
         {std::vector<int>{0, 64, 128, 192, 512}, std::vector<int>{0, 32, 480, 512},
          std::vector<int>{0, 48, 512}, std::vector<int>{0, 47, 512}}) {
      PackedMatrix packed = PackedMatrix::pack({q4k->blocks}, dt);
      PackedMatrix f32 = PackedMatrix::pack({q4k->f32}, dt);
      packed.set_pieces(bounds);
      f32.set_pieces(bounds);
      EXPECT_EQ(packed.quantized(), bounds[1] % 32 == 0);
      EXPECT_EQ(packed.dtype(), dt);
      const size_t P = bounds.size() - 1, N = size_t(packed.rows());
      for (Isa isa : supported_isas()) {
        force_isa(isa);
        for (int M : {1, 3, 8, 40}) {
          const auto x = random_vec(size_t(M) * 512, 5);
          ASSERT_EQ(first_difference(product(packed, x, M), product(f32, x, M)), -1)
              << dtype_name(dt) << " " << isa_name(isa) << " M=" << M << " bounds " << bounds[1];
          std::vector<float> a(P * size_t(M) * N), b(a.size());
          gemm_panels(x.data(), M, 512, packed, 0, packed.panels(), a.data(), int(N), 0,
                      size_t(M) * N);
          gemm_panels(x.data(), M, 512, f32, 0, f32.panels(), b.data(), int(N), 0, size_t(M) * N);
          ASSERT_EQ(first_difference(a, b), -1) << isa_name(isa) << " M=" << M << " by piece";
        }
      }
    }
}

// A tensor shard's columns (Tensor::cols) keep the blocks where they cut
// no group, even where they cut the kind's blocks of 256.
TEST(QuantizedGemm, ColumnWindowsOfWholeGroupsStayQuantized) {
  for (const Quantized& q : kinds()) {
    SCOPED_TRACE(q.name);
    const int group = quant_form(q.blocks.block_type())->group;
    for (DType dt : {DType::F32, DType::BF16})
      for (const auto& [b, e] : {std::pair{64, 320}, {group, 512 - group}, {8, 512}}) {
        const PackedMatrix packed = PackedMatrix::pack({q.blocks.cols(b, e)}, dt);
        const PackedMatrix plain = PackedMatrix::pack({q.f32.cols(b, e)}, dt);
        EXPECT_EQ(packed.quantized(), b % group == 0) << b << ".." << e;
        const auto x = random_vec(size_t(3) * size_t(e - b), 11);
        ASSERT_EQ(first_difference(product(packed, x, 3), product(plain, x, 3)), -1)
            << dtype_name(dt) << " " << b << ".." << e;
      }
    // Integer products' layout: a window may start inside the kind's block
    // (groups of it skipped); its weights and products stay the same.
    IsaGuard guard;
    for (const auto& [b, e] : {std::pair{64, 320}, {group, 512 - group}, {256 + group, 512}}) {
      const PackedMatrix int8 =
          PackedMatrix::pack({q.blocks.cols(b, e)}, DType::F32, QuantProducts::Int8);
      const PackedMatrix plain = PackedMatrix::pack({q.f32.cols(b, e)}, DType::F32);
      ASSERT_TRUE(int8.int8()) << b << ".." << e;
      std::vector<float> row(size_t(e - b)), want(row.size());
      for (int n = 0; n < int8.rows(); ++n) {
        int8.row_to_f32(n, row.data());
        plain.row_to_f32(n, want.data());
        ASSERT_EQ(first_difference(row, want), -1) << b << ".." << e << " row " << n;
      }
      const auto x = random_vec(size_t(3) * size_t(e - b), 12);
      force_isa(Isa::Scalar);
      const std::vector<float> reference = product(int8, x, 3);
      for (Isa isa : supported_isas()) {
        force_isa(isa);
        ASSERT_EQ(first_difference(product(int8, x, 3), reference), -1)
            << isa_name(isa) << " " << b << ".." << e;
      }
    }
  }
}

// What cannot stay quantized is dequantized into the asked dtype: a first
// block whose rows end inside a panel, a block that is not quantized, or
// any block packed in f16.
TEST(QuantizedGemm, BlocksThatWouldShareAPanelOrMixWithFloatsAreDequantized) {
  const Quantized& a = kinds()[0];
  const Quantized& b = kinds()[1];
  EXPECT_FALSE(PackedMatrix::pack({a.blocks, b.blocks}, DType::F32).quantized());  // 6 rows
  EXPECT_FALSE(PackedMatrix::pack({a.f32}, DType::F32).quantized());
  const Checkpoint ck = load_checkpoint(test::data_path("gguf/llama-q4_k_m.gguf"));
  const PackedMatrix mixed =
      PackedMatrix::pack({ck.layers[0].wq, dequantized(ck.layers[0].wk)}, DType::BF16);
  EXPECT_FALSE(mixed.quantized());
  EXPECT_EQ(mixed.dtype(), DType::BF16);
  const PackedMatrix f16 = PackedMatrix::pack({ck.layers[0].wq}, DType::F16);
  EXPECT_FALSE(f16.quantized());
  EXPECT_EQ(f16.dtype(), DType::F16);
  const PackedMatrix two = PackedMatrix::pack({a.blocks, b.blocks}, DType::F32);
  const PackedMatrix two_f32 = PackedMatrix::pack({a.f32, b.f32}, DType::F32);
  const auto x = random_vec(512 * 3, 3);
  EXPECT_EQ(first_difference(product(two, x, 3), product(two_f32, x, 3)), -1);
}

// ---- Integer products (QuantProducts::Int8, gemm_int8.inl) ----

// x's quantization error bounds an integer product's distance from the
// exact one: each x moves by at most half its block's step d = max|x| / 127
// (blocks of 32 from each piece's start), so |y - exact| <= sum |w| d / 2,
// plus the f32 roundings of the two chains.
double int8_error_bound(const PackedMatrix& w, const float* x, int n) {
  const std::vector<int>& bounds = w.piece_bounds();
  std::vector<float> row(size_t(w.cols()));
  w.row_to_f32(n, row.data());
  double bound = 0.0, magnitude = 0.0;
  for (size_t p = 0; p + 1 < bounds.size(); ++p)
    for (int b = bounds[p]; b < bounds[p + 1]; b += 32) {
      const int e = std::min(b + 32, bounds[p + 1]);
      double amax = 0.0;
      for (int k = b; k < e; ++k) amax = std::max(amax, double(std::fabs(x[k])));
      for (int k = b; k < e; ++k) {
        bound += std::fabs(row[size_t(k)]) * amax / 127.0 / 2.0;
        magnitude += std::fabs(double(row[size_t(k)]) * x[k]);
      }
    }
  return bound * (1 + 1e-5) + magnitude * 1e-5;
}

// The exact f32 product over w's weights (double sums).
std::vector<double> exact_product(const PackedMatrix& w, const std::vector<float>& x, int M) {
  std::vector<double> y(size_t(M) * size_t(w.rows()));
  std::vector<float> row(size_t(w.cols()));
  for (int n = 0; n < w.rows(); ++n) {
    w.row_to_f32(n, row.data());
    for (int m = 0; m < M; ++m) {
      double acc = 0.0;
      for (int k = 0; k < w.cols(); ++k)
        acc += double(row[size_t(k)]) * x[size_t(m) * size_t(w.cols()) + size_t(k)];
      y[size_t(m) * size_t(w.rows()) + size_t(n)] = acc;
    }
  }
  return y;
}

// Every kind: the integer layout holds the same weights; every ISA (the
// instruction, its emulations, the scalar reference) and every batch size
// gives the same bits, a row alone as in any batch; and each output lies
// within the bound x's quantization sets around the exact product.
TEST(Int8Gemm, EveryKindIsOneChainInEveryIsaAndBatchNearTheExactProduct) {
  IsaGuard guard;
  for (const Quantized& q : kinds()) {
    SCOPED_TRACE(q.name);
    const PackedMatrix w = PackedMatrix::pack({q.blocks}, DType::F32, QuantProducts::Int8);
    const PackedMatrix exact = PackedMatrix::pack({q.blocks}, DType::F32);
    ASSERT_TRUE(w.quantized() && w.int8());
    // The kind's own factors and integers instead of f32 scales: fewer
    // bytes (a q4_K weight 4.75 bits: 4 + 16 bits of a, b a group of 32 +
    // 32 bits of d, e a block of 256).
    EXPECT_LT(w.bytes(), exact.bytes());
    if (q.name == "q4_K") {
      EXPECT_LE(w.bytes() * 8, size_t(kPanel) * size_t(w.cols()) * 19 / 4);
    }
    std::vector<float> row(size_t(w.cols())), want(row.size());
    for (int n = 0; n < w.rows(); ++n) {
      w.row_to_f32(n, row.data());
      exact.row_to_f32(n, want.data());
      ASSERT_EQ(first_difference(row, want), -1) << "row " << n;
    }
    const int M = 13;
    auto x = random_vec(size_t(M) * size_t(w.cols()), 21);
    for (int k = 0; k < 40; ++k) x[size_t(k)] *= 1e3f;  // blocks of very different scales
    force_isa(Isa::Scalar);
    const std::vector<float> reference = product(w, x, M);
    for (Isa isa : supported_isas()) {
      force_isa(isa);
      ASSERT_EQ(first_difference(product(w, x, M), reference), -1) << isa_name(isa);
      for (int m : {0, 7, 12}) {
        const std::vector<float> alone(x.begin() + long(m) * w.cols(),
                                       x.begin() + long(m + 1) * w.cols());
        const std::vector<float> one = product(w, alone, 1);
        ASSERT_EQ(
            first_difference(one, std::vector<float>(reference.begin() + long(m) * w.rows(),
                                                     reference.begin() + long(m + 1) * w.rows())),
            -1)
            << isa_name(isa) << " row " << m << " alone";
      }
    }
    const std::vector<double> truth = exact_product(w, x, M);
    double worst = 0.0;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < w.rows(); ++n) {
        const size_t i = size_t(m) * size_t(w.rows()) + size_t(n);
        const double bound = int8_error_bound(w, x.data() + size_t(m) * size_t(w.cols()), n);
        ASSERT_LE(std::fabs(reference[i] - truth[i]), bound) << "m=" << m << " n=" << n;
        worst = std::max(worst, std::fabs(reference[i] - truth[i]) / (bound + 1e-30));
      }
    EXPECT_GT(worst, 0.0);  // not the exact product by accident
  }
}

// A fused q|k|v of q4_K and q6_K panels and an FFN-sized product, over
// threads and row splits as the engine runs them, with pieces (a tensor
// shard's sums): the same bits as the scalar reference, piece by piece too.
TEST(Int8Gemm, MixedKindsPiecesAndThreadSplitsGiveTheReferenceBits) {
  const Checkpoint ck = load_checkpoint(test::data_path("gguf/llama-q4_k_m.gguf"));
  const LayerTensors& t = ck.layers[0];
  IsaGuard guard;
  PackedMatrix qkv = PackedMatrix::pack({t.wq, t.wk, t.wv}, DType::BF16, QuantProducts::Int8);
  ASSERT_TRUE(qkv.int8());
  EXPECT_EQ(qkv.dtype(), DType::F32);  // integer sums, f32 chains
  PackedMatrix cut = qkv;
  const int K = qkv.cols();
  cut.set_pieces({0, 32, K / 2, K / 2 + 64, K});
  ASSERT_TRUE(cut.int8());
  for (const PackedMatrix* w : {&qkv, &cut}) {
    for (int M : {1, 4, 17, 200}) {  // 200: split by rows
      const auto x = random_vec(size_t(M) * size_t(K), uint32_t(M));
      force_isa(Isa::Scalar);
      const std::vector<float> reference = product(*w, x, M);
      const size_t P = size_t(w->pieces()), N = size_t(w->rows());
      std::vector<float> by_piece(P * size_t(M) * N);
      gemm_panels(x.data(), M, K, *w, 0, w->panels(), by_piece.data(), int(N), 0, size_t(M) * N);
      for (Isa isa : supported_isas()) {
        force_isa(isa);
        for (int threads : {1, 3}) {
          ThreadPool pool(threads);
          std::vector<float> y(size_t(M) * N);
          matmul(pool, x.data(), M, K, *w, y.data(), int(N));
          ASSERT_EQ(first_difference(y, reference), -1)
              << isa_name(isa) << " threads=" << threads << " M=" << M << " pieces=" << P;
        }
        std::vector<float> pieces(by_piece.size());
        gemm_panels(x.data(), M, K, *w, 0, w->panels(), pieces.data(), int(N), 0, size_t(M) * N);
        ASSERT_EQ(first_difference(pieces, by_piece), -1) << isa_name(isa) << " by piece";
      }
      // The sum over pieces is their chains added in order.
      if (P > 1)
        for (size_t i = 0; i < size_t(M) * N; i += 37) {
          float sum = by_piece[i];
          for (size_t p = 1; p < P; ++p) sum += by_piece[p * size_t(M) * N + i];
          ASSERT_EQ(sum, reference[i]) << i;
        }
    }
  }
}

// A NaN or infinity in x reaches every output of its row and no other.
TEST(Int8Gemm, NonFiniteInputsPoisonTheirRowOnly) {
  const Quantized& q = kinds()[4];  // q8_0: 8-bit q, no offset
  IsaGuard guard;
  const PackedMatrix w = PackedMatrix::pack({q.blocks}, DType::F32, QuantProducts::Int8);
  const int M = 3;
  auto x = random_vec(size_t(M) * size_t(w.cols()), 4);
  const auto clean_x = x;
  x[size_t(w.cols()) + 100] = std::numeric_limits<float>::infinity();
  x[size_t(2 * w.cols()) + 3] = std::nanf("");
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    const std::vector<float> y = product(w, x, M), clean = product(w, clean_x, M);
    for (int n = 0; n < w.rows(); ++n) {
      EXPECT_EQ(y[size_t(n)], clean[size_t(n)]) << isa_name(isa);
      EXPECT_TRUE(std::isnan(y[size_t(w.rows() + n)])) << isa_name(isa);
      EXPECT_TRUE(std::isnan(y[size_t(2 * w.rows() + n)])) << isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace troupe
