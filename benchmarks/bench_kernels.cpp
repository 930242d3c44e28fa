// Kernel micro-benchmarks (Google Benchmark): the packed GEMM against
// OpenBLAS sgemm on the shapes of a 110M-parameter decoder, for decode
// (M = 1), decode batches (M = 8, 32) and prefill (M = 256), one thread. Run: build/bench_kernels
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "gpu/cpu/gemm.h"
#include "gpu/cpu/kernels.h"
#include "gpu/dtype.h"
#include "gpu/kv_cache.h"
#include "gpu/sampler.h"
#include "gpu/tensor.h"

namespace {

using namespace troupe;

struct Operands {
  std::vector<float> x, w, y;
  PackedMatrix packed;
};

Operands make(int M, int N, int K, DType dtype) {
  Operands o;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  o.x.resize(size_t(M) * K);
  o.w.resize(size_t(N) * K);
  o.y.resize(size_t(M) * N);
  for (auto& v : o.x) v = d(rng);
  for (auto& v : o.w) v = d(rng);
  o.packed = PackedMatrix::pack({Tensor::view(o.w.data(), {N, K}, DType::F32)}, dtype);
  return o;
}

void set_counters(benchmark::State& state, int M, int N, int K) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * double(state.iterations()), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}

void BM_PackedGemm(benchmark::State& state, DType dtype, int threads = 1) {
  const int M = int(state.range(0)), N = int(state.range(1)), K = int(state.range(2));
  auto o = make(M, N, K, dtype);
  ThreadPool pool(threads);
  for (auto _ : state) {
    matmul(pool, o.x.data(), M, K, o.packed, o.y.data(), N);
    benchmark::DoNotOptimize(o.y.data());
  }
  set_counters(state, M, N, K);
}

// bf16 products emulated in f32 FMAs (what CPUs without AVX512_BF16 run),
// beside BM_PackedGemm/bf16's vdpbf16ps where the CPU has it.
void BM_PackedGemmBf16Emulated(benchmark::State& state) {
  if (best_isa() < Isa::Avx512) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  force_isa(Isa::Avx512);
  BM_PackedGemm(state, DType::BF16);
  force_isa(best_isa());
}

// The down projection as the model runs it: its input cut into one piece per
// head (12 for the 110m shape), each piece's chain summed in order.
void BM_PackedGemmPieces(benchmark::State& state, DType dtype) {
  const int M = int(state.range(0)), N = int(state.range(1)), K = int(state.range(2));
  auto o = make(M, N, K, dtype);
  std::vector<int> bounds;
  for (int p = 0; p <= 12; ++p) bounds.push_back(int(int64_t(p) * K / 12 / 16 * 16));
  bounds.back() = K;
  o.packed.set_pieces(bounds);
  ThreadPool pool(1);
  for (auto _ : state) {
    matmul(pool, o.x.data(), M, K, o.packed, o.y.data(), N);
    benchmark::DoNotOptimize(o.y.data());
  }
  set_counters(state, M, N, K);
}

void BM_OpenBlasSgemm(benchmark::State& state) {
  const int M = int(state.range(0)), N = int(state.range(1)), K = int(state.range(2));
  auto o = make(M, N, K, DType::F32);
  openblas_set_num_threads(1);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, o.x.data(), K, o.w.data(),
                K, 0.0f, o.y.data(), N);
    benchmark::DoNotOptimize(o.y.data());
  }
  set_counters(state, M, N, K);
}

// Keys and values of `rows` positions of `width` elements, random, stored as
// `dtype` (the bytes a KvCache of that type holds), allocated as its storage
// is (Tensor::zeros: 64-byte aligned, so that rows start on cache lines as
// there; a std::vector's 16-byte alignment cost decode a fifth more lines).
struct KvRows {
  Tensor keys, values;
  KvRows(size_t rows, int width, DType dtype, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> f(rows * size_t(width));
    for (auto* t : {&keys, &values}) {
      for (auto& e : f) e = d(rng);
      *t = Tensor::zeros({int64_t(f.size())}, dtype);
      convert_from_f32(f.data(), dtype, t->raw_mut(), f.size());
    }
  }
};

// Prefill attention of one kv head over a paged cache as the model tiles it:
// every position of a range(0)-token prompt attends to those before it,
// range(1) consecutive tokens a tile (1: as decode attends). head_dim 64,
// blocks of 16 tokens, the cache's elements `dtype`.
void BM_AttentionPrefill(benchmark::State& state, DType dtype) {
  const int n = int(state.range(0)), per_tile = int(state.range(1)), hd = 64, bt = 16;
  const int blocks = (n + bt - 1) / bt;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> d(-1, 1);
  const KvRows rows(size_t(blocks) * bt, hd, dtype, rng);
  std::vector<float> q(size_t(n) * hd);
  for (auto& e : q) e = d(rng);
  std::vector<int> table(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) table[size_t(b)] = blocks - 1 - b;  // not in order
  const kernels::PagedKv kv{rows.keys.raw(), rows.values.raw(), table.data(),  bt,
                            size_t(bt) * hd, size_t(hd),        kv_type(dtype)};
  std::vector<float> scores(size_t(kernels::kTileQueries) * size_t(n)),
      scratch(kernels::tile_scratch_floats(hd)), out(size_t(n) * hd);
  double pairs = 0;
  for (auto _ : state) {
    pairs = 0;
    for (int t1 = n; t1 > 0; t1 -= per_tile) {
      kernels::HeadTile tile;
      tile.count = std::min(per_tile, t1);
      for (int i = 0; i < tile.count; ++i) {
        const int t = t1 - 1 - i;
        tile.q[i] = q.data() + size_t(t) * hd;
        tile.n[i] = t + 1;
        tile.scores[i] = scores.data() + size_t(i) * size_t(n);
        tile.out[i] = out.data() + size_t(t) * hd;
        pairs += t + 1;
      }
      kernels::attend_tile(tile, hd, 1.0f / 8, kv, 0, scratch.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  // Two FMAs a pair and element: q . k and the weighted sum of v.
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * hd * pairs * double(state.iterations()), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK_CAPTURE(BM_AttentionPrefill, f32, DType::F32)
    ->Args({512, 8})
    ->Args({2048, 8})
    ->Args({512, 1});
BENCHMARK_CAPTURE(BM_AttentionPrefill, f16, DType::F16)->Args({512, 8})->Args({2048, 8});

// One decode step's attention for range(0) sequences of range(1) positions
// each, 12 kv heads of 64 (110m's shape) in blocks of 16 laid out as
// gpu/kv_cache.h lays them out (each kv head's blocks apart): every query reads
// its head's keys and values once, so the cache's bytes bound it once they
// are past the caches. range(2) lays the blocks out: 0 each sequence's
// consecutive, 1 scattered (a shuffled pool, as a server's cache is after
// requests come and go), 2 interleaved (block b of sequence s is
// b * seqs + s, as sequences that grow together take them one by one).
void BM_AttentionDecode(benchmark::State& state, DType dtype) {
  const int seqs = int(state.range(0)), n = int(state.range(1)), heads = 12, hd = 64, bt = 16;
  const int width = heads * hd, per_seq = (n + bt - 1) / bt;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  const KvRows rows(size_t(seqs) * size_t(per_seq) * bt, width, dtype, rng);
  std::vector<std::vector<int>> tables(static_cast<size_t>(seqs));
  std::vector<int> ids(size_t(seqs) * size_t(per_seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int(i);
  if (state.range(2)) std::shuffle(ids.begin(), ids.end(), rng);
  for (int s = 0; s < seqs; ++s)
    for (int b = 0; b < per_seq; ++b)
      tables[size_t(s)].push_back(state.range(2) == 2 ? b * seqs + s
                                                      : ids[size_t(s * per_seq + b)]);
  std::vector<float> q(size_t(heads) * hd), scores(static_cast<size_t>(n)), out(q.size());
  for (auto& e : q) e = d(rng);
  const size_t head_stride = size_t(seqs) * size_t(per_seq) * bt * hd;  // a head's blocks
  for (auto _ : state) {
    for (int s = 0; s < seqs; ++s) {
      const kernels::PagedKv kv{
          rows.keys.raw(), rows.values.raw(), tables[size_t(s)].data(), bt, size_t(bt) * size_t(hd),
          size_t(hd),      kv_type(dtype)};
      for (int h = 0; h < heads; ++h)
        kernels::attend_head(q.data() + size_t(h) * hd, hd, 0.125f, kv, size_t(h) * head_stride, n,
                             scores.data(), out.data() + size_t(h) * hd);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["cache GB/s"] = benchmark::Counter(
      double(seqs) * n * 2 * width * double(dtype_size(dtype)) * double(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["positions/s"] =
      benchmark::Counter(double(seqs) * n * heads * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK_CAPTURE(BM_AttentionDecode, f32, DType::F32)
    ->Args({1, 1024, 0})
    ->Args({8, 2048, 0})
    ->Args({32, 256, 0})
    ->Args({32, 256, 1})
    ->Args({32, 256, 2});
BENCHMARK_CAPTURE(BM_AttentionDecode, f16, DType::F16)->Args({1, 1024, 0})->Args({8, 2048, 0});
BENCHMARK_CAPTURE(BM_AttentionDecode, bf16, DType::BF16)
    ->Args({1, 1024, 0})
    ->Args({8, 2048, 0})
    ->Args({32, 256, 1});

// What a request that asks for log-probabilities costs per token: a pass of
// exp over the vocabulary, and one to pick the likeliest. Args: vocabulary,
// alternatives.
void BM_TokenLogprobs(benchmark::State& state) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(size_t(state.range(0)));
  for (float& l : logits) l = dist(rng);
  const int top = int(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(token_logprobs(logits, 7, top));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TokenLogprobs)->Args({32000, 0})->Args({32000, 5})->Args({128256, 20});

// What penalties and a bias cost per sampled token: a copy of the row, then
// the ids they touch. Args: vocabulary, tokens the sequence holds (prompt
// and output alike, all of them distinct ids).
void BM_LogitPenalties(benchmark::State& state) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int vocab = int(state.range(0)), held = int(state.range(1));
  std::vector<float> logits(static_cast<size_t>(vocab)), out;
  for (float& l : logits) l = dist(rng);
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.5f;
  p.repetition_penalty = 1.2f;
  p.logit_bias = {{11, 2.0f}, {13, -100.0f}};
  LogitPenalties pen(p);
  std::vector<int> tokens(static_cast<size_t>(held));
  for (int i = 0; i < held; ++i) tokens[size_t(i)] = (i * 7919) % vocab;
  pen.reset(tokens, held / 2);
  for (auto _ : state) {
    pen.apply(logits, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LogitPenalties)->Args({32000, 256})->Args({32000, 4096})->Args({128256, 4096});

// Block-quantized weights (a GGUF's q4_K or q8_0, random bytes under valid
// scales) as the model packs them: exact products in f32 or bf16, or
// integer ones (QuantProducts::Int8). Two threads, as troupe bench runs.
void BM_QuantizedGemm(benchmark::State& state, uint32_t type, DType dtype, QuantProducts products) {
  const int M = int(state.range(0)), N = int(state.range(1)), K = int(state.range(2));
  const bool k_quant = type == 12;  // q4_K: 144 bytes a 256; else q8_0: 34 bytes a 32
  const size_t block = k_quant ? 144 : 34, per = k_quant ? 256 : 32;
  std::vector<uint8_t> bytes(size_t(N) * size_t(K) / per * block);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = uint8_t(rng());
  for (size_t at = 0; at < bytes.size(); at += block)
    for (int h = 0; h < (k_quant ? 2 : 1); ++h) {
      const uint16_t d = f32_to_f16(0.001f + 0.001f * float(rng() % 8));
      std::memcpy(&bytes[at + 2 * size_t(h)], &d, 2);
    }
  const Tensor w = Tensor::blocks_view(bytes.data(), {N, K}, type, nullptr);
  const PackedMatrix packed = PackedMatrix::pack({w}, dtype, products);
  std::vector<float> x(size_t(M) * size_t(K)), y(size_t(M) * size_t(N));
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& v : x) v = d(rng);
  ThreadPool pool(2);
  for (auto _ : state) {
    matmul(pool, x.data(), M, K, packed, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, M, N, K);
}

void shapes_quantized(benchmark::internal::Benchmark* b) {
  for (int M : {1, 8, 128}) {
    b->Args({M, 2560, 2048});   // the 1b preset's fused q/k/v
    b->Args({M, 11264, 2048});  // fused gate/up
  }
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int M : {1, 8, 12, 18, 24, 32, 256}) {
    b->Args({M, 2304, 768});  // fused q/k/v
    b->Args({M, 4096, 768});  // fused gate/up
    b->Args({M, 768, 2048});  // down
  }
}

// The 1b preset's products (GQA: 32 query heads, 4 kv heads) at prefill.
void shapes_1b(benchmark::internal::Benchmark* b) {
  b->Args({256, 2560, 2048});   // fused q/k/v
  b->Args({256, 11264, 2048});  // fused gate/up
  b->Args({256, 2048, 5632});   // down
}

BENCHMARK_CAPTURE(BM_PackedGemm, f32, DType::F32)->Apply(shapes);
BENCHMARK_CAPTURE(BM_PackedGemm, bf16, DType::BF16)->Apply(shapes);
BENCHMARK(BM_PackedGemmBf16Emulated)->Apply(shapes);
BENCHMARK_CAPTURE(BM_PackedGemm, bf16_1b, DType::BF16)->Apply(shapes_1b);
// Two threads on one product: how far the split across a pool scales.
BENCHMARK_CAPTURE(BM_PackedGemm, f32_2threads, DType::F32, 2)->Apply(shapes)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedGemm, bf16_2threads, DType::BF16, 2)->Apply(shapes)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedGemmPieces, f32, DType::F32)->Apply(shapes);
BENCHMARK_CAPTURE(BM_PackedGemmPieces, bf16, DType::BF16)->Apply(shapes);
BENCHMARK(BM_OpenBlasSgemm)->Apply(shapes);
BENCHMARK_CAPTURE(BM_QuantizedGemm, q4_K_f32, 12, DType::F32, QuantProducts::Exact)
    ->Apply(shapes_quantized)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantizedGemm, q4_K_bf16, 12, DType::BF16, QuantProducts::Exact)
    ->Apply(shapes_quantized)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantizedGemm, q4_K_int8, 12, DType::F32, QuantProducts::Int8)
    ->Apply(shapes_quantized)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantizedGemm, q8_0_bf16, 8, DType::BF16, QuantProducts::Exact)
    ->Apply(shapes_quantized)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantizedGemm, q8_0_int8, 8, DType::F32, QuantProducts::Int8)
    ->Apply(shapes_quantized)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
