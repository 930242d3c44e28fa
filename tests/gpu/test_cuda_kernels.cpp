// Each CUDA kernel against the CPU backend's kernels on random inputs, with
// outputs poisoned (NaN) before the call. Tolerances: f32 outputs within
// 1e-4 relative (other summation orders, expf against the CPU's exp); 16-bit
// outputs within their rounding (1e-2 relative for bf16, 2e-3 for f16).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda_test_support.h"
#include "gpu/cpu/kernels.h"
#include "gpu/cuda/kernels.h"
#include "gpu/cuda/memory_plan.h"
#include "gpu/sampler.h"

namespace troupe::test {
namespace {

using cu::StepLayout;

// Tolerance of an output stored in `dtype`.
float out_rtol(DType dtype) {
  return dtype == DType::F32 ? 1e-4f : dtype == DType::F16 ? 2e-3f : 1e-2f;
}

// Device output of `n` elements of `dtype`, read back as f32.
struct DeviceOut {
  DType dtype;
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> h16;
  DeviceOut(DType t, size_t n)
      : dtype(t), f32(t == DType::F32 ? n : 1), h16(t == DType::F32 ? 1 : n) {
    f32.poison(), h16.poison();
  }
  void* get() { return dtype == DType::F32 ? static_cast<void*>(f32.get()) : h16.get(); }
  std::vector<float> read() const {
    return dtype == DType::F32 ? f32.download() : from_16bit(h16.download(), dtype);
  }
};

// Device copy of f32 values stored as `dtype`; `rounded` is what it holds.
struct DeviceValues {
  DeviceOut out;
  std::vector<float> rounded;
  DeviceValues(const std::vector<float>& v, DType dtype) : out(dtype, v.size()) {
    if (dtype == DType::F32) {
      out.f32.upload(v);
      rounded = v;
    } else {
      const auto h = to_16bit(v, dtype);
      out.h16.upload(h);
      rounded = from_16bit(h, dtype);
    }
  }
};

// The step metadata of `items` on the device.
struct DeviceStep {
  StepLayout layout;
  cu::PackedStep packed;
  DeviceBuffer<std::byte> buffer;
  cu::StepView view;
  DeviceStep(const std::vector<StepItem>& items, std::vector<cu::RowSampling> rows,
             int block_tokens, int blocks_per_seq)
      : layout(StepLayout::for_capacity(
            {std::accumulate(items.begin(), items.end(), 0,
                             [](int n, const StepItem& it) { return n + int(it.tokens.size()); }),
             int(items.size()), blocks_per_seq})),
        buffer(layout.bytes) {
    std::vector<std::byte> host(layout.bytes);
    packed = cu::pack_step(items, rows, block_tokens, layout, 0, host);
    buffer.upload(host);
    view = cu::step_view(buffer.get(), layout);
  }
};

TEST_F(CudaTest, AddRmsNormMatchesCpu) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const int rows = 7, dim = 2048;
    auto x = random_floats(size_t(rows) * dim, 1), delta = random_floats(x.size(), 2);
    auto w = random_floats(size_t(dim), 3);
    DeviceBuffer<float> dx(x), dd(delta), dw(w);
    DeviceOut out(dtype, x.size());
    cu::add_rmsnorm(dx.get(), dd.get(), dw.get(), nullptr, out.get(), dtype, rows, dim, 1e-5f,
                    nullptr);
    std::vector<float> want(x.size()), sum(x.size());
    for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + delta[i];
    for (int r = 0; r < rows; ++r)
      kernels::rmsnorm(&sum[size_t(r) * dim], w.data(), &want[size_t(r) * dim], dim, 1e-5f);
    EXPECT_TRUE(all_near(out.read(), want, 1e-5f, out_rtol(dtype))) << dtype_name(dtype);
    EXPECT_TRUE(all_near(dx.download(), sum, 0, 0)) << "the residual add is stored back";
  }
}

TEST_F(CudaTest, FinalNormGathersRowsAndLeavesTheResidual) {
  const int dim = 64;
  auto x = random_floats(size_t(5) * dim, 4), delta = random_floats(x.size(), 5);
  auto w = random_floats(size_t(dim), 6);
  DeviceBuffer<float> dx(x), dd(delta), dw(w);
  DeviceBuffer<int> map(std::vector<int>{4, 1});
  DeviceOut out(DType::F32, size_t(2) * dim);
  cu::add_rmsnorm(dx.get(), dd.get(), dw.get(), map.get(), out.get(), DType::F32, 2, dim, 1e-5f,
                  nullptr);
  std::vector<float> want(size_t(2) * dim), row(dim);
  for (int r = 0; r < 2; ++r) {
    const int s = r == 0 ? 4 : 1;
    for (int i = 0; i < dim; ++i)
      row[size_t(i)] = x[size_t(s * dim + i)] + delta[size_t(s * dim + i)];
    kernels::rmsnorm(row.data(), w.data(), &want[size_t(r) * dim], dim, 1e-5f);
  }
  EXPECT_TRUE(all_near(out.read(), want, 1e-5f, 1e-4f));
  EXPECT_TRUE(all_near(dx.download(), x, 0, 0));
}

TEST_F(CudaTest, SiluMulMatchesCpu) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    const int rows = 5, hidden = 5632;
    auto gu = random_floats(size_t(rows) * 2 * hidden, 7, 6.0f);
    DeviceBuffer<float> dgu(gu);
    DeviceOut out(dtype, size_t(rows) * hidden);
    cu::silu_mul(dgu.get(), rows, hidden, out.get(), dtype, nullptr);
    std::vector<float> want(size_t(rows) * hidden);
    for (int r = 0; r < rows; ++r)
      kernels::silu_mul(&gu[size_t(r) * 2 * hidden], &gu[size_t(r) * 2 * hidden + hidden],
                        &want[size_t(r) * hidden], hidden);
    EXPECT_TRUE(all_near(out.read(), want, 1e-5f, out_rtol(dtype))) << dtype_name(dtype);
  }
}

StepItem item(uint64_t seq, int position, int tokens, std::vector<int> blocks) {
  StepItem it;
  it.seq = seq;
  it.position = position;
  it.tokens.assign(size_t(tokens), 0);
  it.blocks = std::move(blocks);
  return it;
}

TEST_F(CudaTest, RopeWritesQueriesAndTheKvCache) {
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::RotateHalf}) {
    const int heads = 8, kv_heads = 2, hd = 64, bt = 16, max_pos = 256;
    const int qd = heads * hd, kvd = kv_heads * hd, cols = qd + 2 * kvd;
    // Two items: 3 tokens from position 14 (crossing into the second block),
    // 1 token at 40.
    const std::vector<StepItem> items{item(1, 14, 3, {6, 2}), item(2, 40, 1, {0, 1, 3})};
    DeviceStep step(items, {}, bt, 4);
    const int T = 4;
    auto qkv = random_floats(size_t(T) * cols, 8);
    const kernels::RopeTable table(max_pos, hd, 10000.0f);
    std::vector<float> cs(table.cos(0), table.cos(0) + size_t(max_pos) * (hd / 2));
    cs.insert(cs.end(), table.sin(0), table.sin(0) + size_t(max_pos) * (hd / 2));
    DeviceBuffer<float> dqkv(qkv), dcs(cs), q(size_t(T) * qd), kc(size_t(8) * bt * kvd),
        vc(size_t(8) * bt * kvd);
    q.poison(), kc.poison(), vc.poison();
    const cu::AttentionShape shape{heads, kv_heads, hd, bt, 1.0f};
    cu::rope_write_kv(dqkv.get(), step.view, T, dcs.get(), max_pos, shape, layout, q.get(),
                      kc.get(), vc.get(), DType::F32, nullptr);
    const auto gq = q.download(), gk = kc.download(), gv = vc.download();
    const int positions[] = {14, 15, 16, 40};
    const int slots[] = {6 * bt + 14, 6 * bt + 15, 2 * bt + 0, 3 * bt + 8};  // 40: blocks[2]
    for (int t = 0; t < T; ++t) {
      std::vector<float> row(qkv.begin() + long(t) * cols, qkv.begin() + long(t + 1) * cols);
      kernels::rope(row.data(), heads, hd, positions[t], table, layout);
      kernels::rope(row.data() + qd, kv_heads, hd, positions[t], table, layout);
      EXPECT_TRUE(
          all_near(std::vector<float>(gq.begin() + long(t) * qd, gq.begin() + long(t + 1) * qd),
                   std::vector<float>(row.begin(), row.begin() + qd), 1e-6f, 1e-6f));
      const long s = slots[t];
      EXPECT_TRUE(all_near(std::vector<float>(gk.begin() + s * kvd, gk.begin() + (s + 1) * kvd),
                           std::vector<float>(row.begin() + qd, row.begin() + qd + kvd), 1e-6f,
                           1e-6f));
      EXPECT_TRUE(all_near(std::vector<float>(gv.begin() + s * kvd, gv.begin() + (s + 1) * kvd),
                           std::vector<float>(row.begin() + qd + kvd, row.end()), 0, 0));
    }
  }
}

struct AttentionCase {
  int group;
  int head_dim;
  DType dtype;
};

class AttentionTest : public CudaTest, public ::testing::WithParamInterface<AttentionCase> {};

// A ragged batch of prefill chunks and decode tokens over scattered block
// tables, one decode context well past the split length, attended with the
// decode split and without it; every output against kernels::attend_head.
TEST_P(AttentionTest, RaggedBatchMatchesCpu) {
  const AttentionCase c = GetParam();
  const int kv_heads = 2, heads = kv_heads * c.group, hd = c.head_dim, bt = 16;
  const int qd = heads * hd, kvd = kv_heads * hd;
  const int max_seq = 2048, per_seq = max_seq / bt;
  struct Spec {
    int position, tokens;
  };
  const std::vector<Spec> specs{{0, 5}, {37, 19}, {1500, 1}, {100, 1}, {0, 1}, {3, 130}};
  std::vector<StepItem> items;
  int next_block = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int need = (specs[i].position + specs[i].tokens + bt - 1) / bt;
    // Scattered: a stride prime to the count visits every block once.
    int stride = 7;
    while (std::gcd(stride, need) != 1) ++stride;
    std::vector<int> blocks;
    for (int b = 0; b < need; ++b) blocks.push_back(next_block + (b * stride) % need);
    next_block += need;
    items.push_back(item(i, specs[i].position, specs[i].tokens, blocks));
  }
  const int num_blocks = next_block;
  DeviceStep step(items, {}, bt, per_seq);
  const int T = step.packed.tokens;
  const auto q = random_floats(size_t(T) * qd, 11);
  DeviceValues k(random_floats(size_t(num_blocks) * bt * kvd, 12), c.dtype);
  DeviceValues v(random_floats(size_t(num_blocks) * bt * kvd, 13), c.dtype);
  DeviceBuffer<float> dq(q);
  const cu::AttentionShape shape{heads, kv_heads, hd, bt, 1.0f / std::sqrt(float(hd))};
  const int parts = cu::max_decode_partitions(max_seq);
  DeviceBuffer<float> acc(items.size() * heads * parts * hd), mx(items.size() * heads * parts),
      sum(items.size() * heads * parts);

  // CPU reference over the same (rounded) cache.
  std::vector<float> want(size_t(T) * qd), scores(max_seq);
  {
    int t = 0;
    for (const StepItem& it : items)
      for (size_t j = 0; j < it.tokens.size(); ++j, ++t)
        for (int h = 0; h < heads; ++h) {
          const kernels::PagedKv kv{k.rounded.data(), v.rounded.data(), it.blocks.data(), bt,
                                    size_t(bt) * kvd, size_t(kvd)};
          kernels::attend_head(&q[size_t(t) * qd + size_t(h) * hd], hd, shape.scale, kv,
                               size_t(h / c.group) * hd, it.position + int(j) + 1, scores.data(),
                               &want[size_t(t) * qd + size_t(h) * hd]);
        }
  }
  for (bool split : {true, false}) {
    const cu::DecodeSplit plan =
        split ? cu::DecodeSplit{256, (1501 + 255) / 256} : cu::DecodeSplit{1536, 1};
    DeviceOut out(c.dtype, size_t(T) * qd);
    acc.poison(), mx.poison(), sum.poison();
    cu::decode_attention(step.view, int(items.size()), dq.get(), k.out.get(), v.out.get(), c.dtype,
                         shape, plan, {acc.get(), mx.get(), sum.get()}, out.get(), nullptr);
    cu::prefill_attention(step.view, int(items.size()), step.packed.max_item_tokens, dq.get(),
                          k.out.get(), v.out.get(), c.dtype, shape, out.get(), nullptr);
    EXPECT_TRUE(all_near(out.read(), want, 2e-5f, out_rtol(c.dtype)))
        << "group " << c.group << ", head_dim " << hd << ", " << dtype_name(c.dtype)
        << (split ? ", split" : ", unsplit");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gqa, AttentionTest,
    ::testing::Values(AttentionCase{1, 64, DType::F32}, AttentionCase{4, 64, DType::F32},
                      AttentionCase{8, 64, DType::F32}, AttentionCase{1, 128, DType::F32},
                      AttentionCase{4, 128, DType::F32}, AttentionCase{8, 128, DType::F32},
                      AttentionCase{8, 64, DType::BF16}, AttentionCase{4, 128, DType::BF16},
                      AttentionCase{1, 128, DType::F16}, AttentionCase{2, 8, DType::F32},
                      AttentionCase{3, 32, DType::F32}, AttentionCase{6, 64, DType::BF16},
                      AttentionCase{7, 64, DType::F32}, AttentionCase{5, 128, DType::F32}),
    [](const auto& info) {
      // snprintf: GCC 12 warns (-Wrestrict, falsely) on chained string +.
      char name[64];
      std::snprintf(name, sizeof name, "g%d_d%d_%s", info.param.group, info.param.head_dim,
                    dtype_name(info.param.dtype));
      return std::string(name);
    });

// The device sampler against troupe::Sampler with the same coin, over
// greedy, temperature, top-k (heap and quickselect sizes), top-p and both,
// on vocabularies of 32000 and 300 with NaN and -inf sprinkled in.
TEST_F(CudaTest, SamplerMatchesTheCpuSampler) {
  const std::vector<SamplingParams> params{
      {0, 1, 0, 1},       {0.7f, 1, 0, 2},     {1.0f, 1, 40, 3},  {0.8f, 1, 1500, 4},
      {0.9f, 0.9f, 0, 5}, {1.2f, 0.8f, 50, 6}, {1e-30f, 1, 0, 7}, {0.5f, 0.95f, 2000, 8}};
  for (int vocab : {32000, 300}) {
    const int reps = 8;
    const int rows = int(params.size()) * reps;
    std::vector<float> logits = random_floats(size_t(rows) * vocab, 20 + vocab, 6.0f);
    for (int r = 0; r < rows; r += 5) {
      logits[size_t(r) * vocab + 3] = std::nanf("");
      logits[size_t(r) * vocab + 7] = -INFINITY;
    }
    std::vector<StepItem> items;
    std::vector<cu::RowSampling> rs;
    std::vector<int> want;
    for (int r = 0; r < rows; ++r) {
      SamplingParams p = params[size_t(r) % params.size()];
      p.seed = uint64_t(r) * 977 + 1;
      Sampler cpu(p);
      Xoshiro256 rng = cpu.rng();
      rs.push_back({p.temperature, p.top_p, p.top_k, p.temperature > 0 ? rng.next_double() : 0});
      want.push_back(cpu.sample(std::span<const float>(&logits[size_t(r) * vocab], size_t(vocab))));
      StepItem it = item(uint64_t(r), 0, 1, {0});
      it.sample = true;
      items.push_back(it);
    }
    DeviceStep step(items, rs, 16, 1);
    DeviceBuffer<float> dl(logits);
    DeviceBuffer<int> ids{size_t(rows)}, flags{size_t(rows)};
    ids.poison(), flags.poison();
    cu::sample_rows(dl.get(), rows, vocab, step.view, ids.get(), flags.get(), nullptr);
    const auto got = ids.download(), flagged = flags.download();
    int unsure = 0;
    for (int r = 0; r < rows; ++r) {
      if (flagged[size_t(r)]) {
        ++unsure;  // the host would sample it with the CPU sampler
        continue;
      }
      EXPECT_EQ(flagged[size_t(r)], 0);
      EXPECT_EQ(got[size_t(r)], want[size_t(r)]) << "vocab " << vocab << " row " << r;
    }
    EXPECT_LE(unsure, 1) << "rows the device left to the host";
  }
}

TEST_F(CudaTest, SumRanksAddsInRankOrder) {
  const size_t n = 1000;
  auto g = random_floats(3 * n, 30);
  DeviceBuffer<float> dg(g), out(n);
  out.poison();
  cu::sum_ranks(dg.get(), 3, n, out.get(), nullptr);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = (g[i] + g[n + i]) + g[2 * n + i];
  EXPECT_TRUE(all_near(out.download(), want, 0, 0));
}

}  // namespace
}  // namespace troupe::test
