// Block-quantized weights kept as their parts (packed_matrix.h): every
// product over them must equal, bit for bit, the f32 (or bf16) product over
// the dequantized weights, for every kind, ISA, batch size, thread split and
// cut into pieces, so that a quantized model answers as its dequantization
// does, in any layout and batch.
#include <gtest/gtest.h>

#include <cstring>
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

}  // namespace
}  // namespace troupe
