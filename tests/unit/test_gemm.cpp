// The packed GEMM against a naive reference and OpenBLAS, per ISA and dtype,
// and the property the whole engine leans on: results do not depend on the
// batch size, the thread split or the ISA.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "gpu/cpu/gemm.h"
#include "tests/support/isa_support.h"

namespace troupe {
namespace {

using test::IsaGuard;
using test::supported_isas;

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Shape {
  int M, N, K;
};

class GemmTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmTest, MatchesNaiveAndOpenBlasAndIsBitIdenticalAcrossIsas) {
  const auto [M, N, K] = GetParam();
  const auto x = random_vec(size_t(M) * K, 1);
  const auto w = random_vec(size_t(N) * K, 2, 0.5f);
  const auto packed = PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, DType::F32);
  std::vector<float> ref(size_t(M) * N);
  gemm_panels_scalar(x.data(), M, K, packed, 0, packed.panels(), ref.data(), N);

  // Naive double-precision check of the reference itself.
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
      ASSERT_NEAR(ref[size_t(m) * N + n], acc, 1e-4 * std::sqrt(double(K)));
    }
  // OpenBLAS agrees within f32 rounding.
  std::vector<float> blas(size_t(M) * N);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, w.data(), K,
              0.0f, blas.data(), N);
  for (size_t i = 0; i < blas.size(); ++i)
    ASSERT_NEAR(ref[i], blas[i], 1e-4f * std::sqrt(float(K)));

  IsaGuard guard;
  ThreadPool pool(3);
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    std::vector<float> y(size_t(M) * N, -1.0f);
    matmul(pool, x.data(), M, K, packed, y.data(), N);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(y[i], ref[i]) << isa_name(isa) << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Values(Shape{1, 16, 8}, Shape{1, 5, 3}, Shape{2, 33, 17},
                                           Shape{3, 64, 64}, Shape{5, 100, 31}, Shape{7, 129, 40},
                                           Shape{13, 80, 192}, Shape{64, 200, 96},
                                           Shape{1, 2000, 192},
                                           // k past several k blocks of every ISA
                                           Shape{20, 70, 1100}, Shape{13, 48, 1500}));

TEST(Gemm, RowsDoNotDependOnBatchSize) {
  const int N = 77, K = 150, M = 30;
  const auto x = random_vec(size_t(M) * K, 3);
  const auto w = random_vec(size_t(N) * K, 4);
  ThreadPool pool(2);
  // 16-bit weights take another path once there are several row blocks
  // (widened per k block); a row alone must still give the same values.
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const auto packed = PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, dt);
    std::vector<float> all(size_t(M) * N);
    matmul(pool, x.data(), M, K, packed, all.data(), N);
    for (int m = 0; m < M; ++m) {
      std::vector<float> one(N);
      matmul(pool, x.data() + size_t(m) * K, 1, K, packed, one.data(), N);
      for (int n = 0; n < N; ++n) ASSERT_EQ(one[n], all[size_t(m) * N + n]) << dtype_name(dt);
    }
  }
}

// Prefill-sized products give each thread one chunk of panels, of whatever
// size divides them evenly (the kernels take what is not a multiple of their
// panel group as one narrower group: 3, 2 or 1 panels), or with many rows a
// share of the rows. None of that may change a bit.
TEST(Gemm, EveryThreadSplitAndNarrowGroupGivesTheScalarBits) {
  IsaGuard guard;
  const int K = 70;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t = 1; t <= 4; ++t) pools.push_back(std::make_unique<ThreadPool>(t));
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (int N : {16 * 3, 16 * 6, 16 * 7 + 5, 16 * 11})
      for (int M : {1, 20, 47, 130, 261}) {
        const auto x = random_vec(size_t(M) * K, 7);
        const auto w = random_vec(size_t(N) * K, 8);
        const auto packed = PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, dt);
        std::vector<float> ref(size_t(M) * N);
        gemm_panels_scalar(x.data(), M, K, packed, 0, packed.panels(), ref.data(), N);
        for (const auto& pool : pools)
          for (Isa isa : supported_isas()) {
            force_isa(isa);
            std::vector<float> y(size_t(M) * N, -1.0f);
            matmul(*pool, x.data(), M, K, packed, y.data(), N);
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(y[i], ref[i])
                  << dtype_name(dt) << " " << isa_name(isa) << " M=" << M << " N=" << N
                  << " threads=" << pool->size() << " element " << i;
          }
      }
}

TEST(Gemm, F16WeightsEqualF32OnTheRoundedWeights) {
  IsaGuard guard;
  ThreadPool pool(2);
  // One row block (weights read directly), several with a partial last one,
  // and K spanning several k blocks of every ISA with a partial last block.
  for (const Shape s : {Shape{1, 33, 300}, Shape{9, 70, 130}, Shape{40, 200, 600}}) {
    const int M = s.M, N = s.N, K = s.K;
    const auto x = random_vec(size_t(M) * K, 5);
    const auto w = random_vec(size_t(N) * K, 6);
    for (DType dt : {DType::F16}) {
      // Round the weights through the 16-bit type, then the f32 product of the
      // rounded weights must equal the 16-bit product exactly.
      std::vector<uint16_t> w16(w.size());
      convert_from_f32(w.data(), dt, w16.data(), w.size());
      std::vector<float> rounded(w.size());
      convert_to_f32(w16.data(), dt, rounded.data(), w.size());
      const auto p16 = PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, dt);
      const auto p32 =
          PackedMatrix::pack({Tensor::view(rounded.data(), {N, K}, DType::F32)}, DType::F32);
      EXPECT_EQ(p16.bytes() * 2, p32.bytes());
      std::vector<float> ref(size_t(M) * N);
      gemm_panels_scalar(x.data(), M, K, p32, 0, p32.panels(), ref.data(), N);
      for (Isa isa : supported_isas()) {
        force_isa(isa);
        std::vector<float> y(size_t(M) * N, -1.0f);
        matmul(pool, x.data(), M, K, p16, y.data(), N);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_EQ(y[i], ref[i]) << dtype_name(dt) << " " << isa_name(isa) << " M=" << M
                                  << " N=" << N << " K=" << K << " element " << i;
      }
    }
  }
}

float bf16_value(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0) return std::copysign(0.0f, f);  // denormals flush
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;         // to nearest even
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 weights multiply as vdpbf16ps does: x and W rounded to bf16, k in pairs
// that restart at each piece, the odd product added before the even one.
// Written here from that definition alone, not from the packed layout.
float bf16_chain(const float* x, const float* w, int k0, int k1) {
  float acc = 0.0f;
  for (int k = k0; k < k1; k += 2) {
    if (k + 1 < k1) acc = std::fma(bf16_value(x[k + 1]), bf16_value(w[k + 1]), acc);
    acc = std::fma(bf16_value(x[k]), bf16_value(w[k]), acc);
  }
  return acc;
}

TEST(Gemm, Bf16WeightsTakeTheBf16PairProduct) {
  IsaGuard guard;
  ThreadPool pool(2);
  // Odd and even K and pieces; one row block, several, a partial last one;
  // k spanning several k blocks of every ISA. x spans many magnitudes, with
  // tiny values that round to bf16 denormals and flush.
  const std::vector<std::vector<int>> cuts{
      {}, {}, {0, 7, 130}, {0, 33, 300, 301, 600}, {}, {0, 1000, 1030, 2100}};
  const std::vector<Shape> shapes{{1, 33, 301},   {9, 70, 130},   {9, 70, 130},
                                  {40, 200, 600}, {20, 70, 2100}, {20, 70, 2100}};
  for (size_t c = 0; c < shapes.size(); ++c) {
    const int M = shapes[c].M, N = shapes[c].N, K = shapes[c].K;
    auto x = random_vec(size_t(M) * K, 5);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], int(i % 11) * 4 - 20);
    x[3] = 1e-39f;
    const auto w = random_vec(size_t(N) * K, 6);
    auto packed = PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, DType::BF16);
    std::vector<int> bounds = cuts[c].empty() ? std::vector<int>{0, K} : cuts[c];
    if (!cuts[c].empty()) packed.set_pieces(bounds);
    EXPECT_EQ(packed.bytes(), size_t(packed.panels()) * 16 * 4 * size_t(packed.steps()));
    std::vector<float> want(size_t(M) * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float sum = 0.0f;
        for (size_t p = 0; p + 1 < bounds.size(); ++p) {
          const float part = bf16_chain(x.data() + size_t(m) * K, w.data() + size_t(n) * K,
                                        bounds[p], bounds[p + 1]);
          sum = p == 0 ? part : sum + part;
        }
        want[size_t(m) * N + n] = sum;
        // And the values are what the product should be, to bf16 rounding
        // (2^-8 of each term, relative).
        double exact = 0, magnitude = 0;
        for (int k = 0; k < K; ++k) {
          const double t = double(x[size_t(m) * K + k]) * double(w[size_t(n) * K + k]);
          exact += t;
          magnitude += std::fabs(t);
        }
        ASSERT_NEAR(sum, exact, magnitude / 128);
      }
    std::vector<float> ref(size_t(M) * N);
    gemm_panels_scalar(x.data(), M, K, packed, 0, packed.panels(), ref.data(), N);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(ref[i], want[i]) << "scalar, element " << i;
    for (Isa isa : supported_isas()) {
      force_isa(isa);
      std::vector<float> y(size_t(M) * N, -1.0f);
      matmul(pool, x.data(), M, K, packed, y.data(), N);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(y[i], want[i]) << isa_name(isa) << " M=" << M << " N=" << N << " K=" << K
                                 << " element " << i;
    }
  }
}

// A product cut into pieces of k sums one chain per piece, in order; with a
// piece stride each piece's chains land in their own block. Shards that hold
// whole pieces (the columns of k a tensor-parallel rank holds) and add their
// pieces in order onto the sum so far give the whole product's value.
TEST(Gemm, PiecesSumInOrderAndShardsOfPiecesAddUpToTheWhole) {
  IsaGuard guard;
  ThreadPool pool(2);
  // Pieces shorter and longer than every ISA's k block; one row block (read
  // directly), several, and enough for 16-bit weights to be widened.
  const int N = 70, K = 700;
  // Odd pieces too: bf16 pairs restart at each piece. The second set's are
  // short, as a head's columns are: summed in registers however many rows
  // (groups of 3 rows over runs of whole pieces, a run after the first
  // starting from the sum in y); the first's one call per piece beyond 3
  // rows. Both cut at 300, where the two shards below meet.
  const std::vector<std::vector<int>> cuts{
      {0, 41, 300, 311, 700}, {0, 41, 100, 160, 230, 300, 311, 380, 450, 520, 600, 650, 700}};
  // (140 rows are split by rows across the threads.)
  for (const auto& bounds : cuts)
    for (int M : {1, 3, 5, 9, 40, 140}) {
      const size_t P = bounds.size() - 1;
      const size_t left_pieces =
          size_t(std::find(bounds.begin(), bounds.end(), 300) - bounds.begin());
      const auto x = random_vec(size_t(M) * K, 21);
      const auto w = random_vec(size_t(N) * K, 22);
      for (DType dt : {DType::F32, DType::BF16}) {
        auto whole = PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, dt);
        whole.set_pieces(bounds);
        std::vector<float> ref(size_t(M) * N), ref_pieces(P * size_t(M) * N);
        gemm_panels_scalar(x.data(), M, K, whole, 0, whole.panels(), ref.data(), N);
        gemm_panels_scalar(x.data(), M, K, whole, 0, whole.panels(), ref_pieces.data(), N,
                           size_t(M) * N);
        // The scalar reference is what it says: piece by piece, then in order.
        for (size_t i = 0; i < ref.size(); ++i) {
          float sum = ref_pieces[i];
          for (size_t p = 1; p < P; ++p) sum += ref_pieces[p * ref.size() + i];
          ASSERT_EQ(sum, ref[i]);
        }
        // Two shards: the pieces before column 300 and those after, each a
        // matrix of its columns.
        std::vector<float> left(size_t(N) * 300), right(size_t(N) * 400);
        for (int n = 0; n < N; ++n)
          for (int k = 0; k < K; ++k)
            (k < 300 ? left[size_t(n) * 300 + size_t(k)]
                     : right[size_t(n) * 400 + size_t(k - 300)]) = w[size_t(n) * K + size_t(k)];
        auto a = PackedMatrix::pack({Tensor::view(left.data(), {N, 300}, DType::F32)}, dt);
        auto b = PackedMatrix::pack({Tensor::view(right.data(), {N, 400}, DType::F32)}, dt);
        std::vector<int> a_bounds(bounds.begin(), bounds.begin() + std::ptrdiff_t(left_pieces) + 1);
        std::vector<int> b_bounds;
        for (size_t p = left_pieces; p <= P; ++p) b_bounds.push_back(bounds[p] - 300);
        a.set_pieces(a_bounds);
        b.set_pieces(b_bounds);
        const size_t right_pieces = P - left_pieces;
        std::vector<float> xa(size_t(M) * 300), xb(size_t(M) * 400);
        for (int m = 0; m < M; ++m)
          for (int k = 0; k < K; ++k)
            (k < 300 ? xa[size_t(m) * 300 + size_t(k)] : xb[size_t(m) * 400 + size_t(k - 300)]) =
                x[size_t(m) * K + size_t(k)];
        for (Isa isa : supported_isas()) {
          force_isa(isa);
          std::vector<float> y(size_t(M) * N, -1.0f), pieces(P * size_t(M) * N, -1.0f);
          matmul(pool, x.data(), M, K, whole, y.data(), N);
          matmul(pool, x.data(), M, K, whole, pieces.data(), N, size_t(M) * N);
          std::vector<float> sa(size_t(M) * N), sb(right_pieces * size_t(M) * N);
          matmul(pool, xa.data(), M, 300, a, sa.data(), N);
          matmul(pool, xb.data(), M, 400, b, sb.data(), N, size_t(M) * N);
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_EQ(y[i], ref[i])
                << isa_name(isa) << " " << dtype_name(dt) << " M=" << M << " pieces=" << P;
            for (size_t p = 0; p < P; ++p)
              ASSERT_EQ(pieces[p * y.size() + i], ref_pieces[p * y.size() + i]) << isa_name(isa);
            float shards = sa[i];
            for (size_t p = 0; p < right_pieces; ++p) shards += sb[p * y.size() + i];
            ASSERT_EQ(shards, y[i])
                << isa_name(isa) << " " << dtype_name(dt) << " M=" << M << " pieces=" << P;
          }
        }
      }
    }
  PackedMatrix m = PackedMatrix::pack(
      {Tensor::view(std::vector<float>(8).data(), {2, 4}, DType::F32)}, DType::F32);
  EXPECT_THROW(m.set_pieces({0, 2}), std::invalid_argument);
  EXPECT_THROW(m.set_pieces({0, 3, 3, 4}), std::invalid_argument);
  EXPECT_THROW(m.set_pieces({1, 4}), std::invalid_argument);
}

TEST(Gemm, StackedBlocksAndRowReadBack) {
  const int K = 21;
  const auto a = random_vec(size_t(5) * K, 7), b = random_vec(size_t(19) * K, 8);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    auto p = PackedMatrix::pack(
        {Tensor::view(a.data(), {5, K}, DType::F32), Tensor::view(b.data(), {19, K}, DType::F32)},
        dt);
    ASSERT_EQ(p.rows(), 24);
    // Rows read back the same before and after pieces (odd ones re-pair bf16).
    for (bool cut : {false, true}) {
      if (cut) p.set_pieces({0, 3, 10, K});
      std::vector<float> row(K);
      for (const auto& [n, src] : {std::pair{3, a.data() + 3 * K}, {5 + 17, b.data() + 17 * K}}) {
        p.row_to_f32(n, row.data());
        for (int k = 0; k < K; ++k) {
          const float want = dt == DType::F32    ? src[k]
                             : dt == DType::BF16 ? bf16_value(src[k])
                                                 : f16_to_f32(f32_to_f16(src[k]));
          EXPECT_EQ(row[size_t(k)], want) << dtype_name(dt) << " row " << n << " k " << k;
        }
      }
      EXPECT_THROW(p.row_to_f32(24, row.data()), std::out_of_range);
    }
  }
}

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  ThreadPool pool(4);
  // Short loops back to back (workers arrive late, or for a loop already
  // over), and one of more tasks than a loop's word holds.
  for (int n : {37, 2, 3, 1, 100, 70000}) {
    for (int round = 0; round < (n > 1000 ? 2 : 200); ++round) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n, [&](int t, int thread) {
        if (thread < 0 || thread >= 4) bad_thread.fetch_add(1);
        hits[size_t(t)].fetch_add(1);
      });
      ASSERT_EQ(bad_thread.load(), 0);
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << n << " tasks";
      // Rested workers (a step over) are woken by the next loop.
      if (round % 3 == 0) pool.rest();
    }
  }
  // A rested pool's workers do come back: some task runs off the caller's
  // thread when the caller waits for them.
  std::atomic<int> others{0};
  for (int round = 0; round < 200 && others.load() == 0; ++round) {
    pool.rest();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    pool.parallel_for(64, [&](int, int thread) {
      if (thread != 0) others.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  }
  EXPECT_GT(others.load(), 0);
}

}  // namespace
}  // namespace troupe
