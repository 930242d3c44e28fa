// CUDA layouts (make_cuda_parallel_engine): pipeline stages and tensor-
// parallel shards on the GPU give the single device's answer. On one GPU
// every shard shares device 0 (its own stream and pool; tensor groups over
// the in-process communicator); with two or more GPUs a tensor group spans
// them over NCCL.
#include <cmath>

#include "cuda_test_support.h"
#include "gpu/checkpoint.h"
#include "gpu/engine.h"
#include "gpu/parallel_engine.h"
#include "gpu/synth_model.h"
#include "support/engine_driver.h"
#include "support/mixed_steps.h"
#include "support/test_support.h"

namespace troupe::test {
namespace {

CudaEngineOptions layout_options() {
  CudaEngineOptions o;
  o.blocks = 640;
  o.max_batch_tokens = 256;
  o.max_batch_sequences = 16;
  o.graphs = false;
  o.reserve_bytes = size_t(256) << 20;
  return o;
}

ParallelEngineOptions layout(int pipeline, int tensor) {
  ParallelEngineOptions l;
  l.pipeline = pipeline;
  l.tensor = tensor;
  return l;
}

float largest(const MixedRun& r) {
  float m = 0;
  for (const auto& step : r.logits)
    for (float v : step) m = std::max(m, std::abs(v));
  return m;
}

// Mixed prefill and decode steps, greedy and seeded-sampled sequences
// together: every layout on one GPU gives the single CUDA engine's ids, and
// its logits within 1e-4 of the largest (f32 weights; the layouts differ
// from one device only in how the tensor group's partial sums are added).
TEST_F(CudaTest, LayoutsOnOneGpuGiveTheSingleDeviceAnswer) {
  for (const char* name : {"stories260K", "tiny"}) {
    const Checkpoint ck = std::string(name) == "tiny"
                              ? synth_checkpoint(synth_preset("tiny"), 3, DType::F32)
                              : load_checkpoint(repo_file("models/stories260K/stories260K.bin"));
    auto single = make_cuda_engine(ck, DType::F32, layout_options());
    const MixedRun want = run_mixed(*single, true, true);
    single.reset();
    const float tol = 1e-4f * largest(want);
    for (auto [P, T] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}, {3, 1}, {1, 4}}) {
      auto engine = make_cuda_parallel_engine(ck, DType::F32, layout(P, T), {0}, layout_options());
      const MixedRun got = run_mixed(*engine, true, true);
      EXPECT_EQ(got.ids, want.ids) << name << " P=" << P << " T=" << T;
      EXPECT_LE(max_logit_diff(got, want), tol) << name << " P=" << P << " T=" << T;
      const EngineStats st = engine->stats();
      EXPECT_EQ(int(st.weight_bytes.size()), P * T);
      if (T > 1) {
        EXPECT_GT(st.stages[0].comm_bytes, 0u) << name << " P=" << P << " T=" << T;
      }
    }
  }
}

// bf16 weights on a layout against the CPU's layout, two sequences per
// step (a prefill, then decode) fed the CPU's tokens: logits within the
// single-device bf16 test's tolerance (the GPU rounds activations to bf16
// before each projection, the CPU keeps them f32), and the same greedy id
// wherever the CPU's choice leads the GPU's by more than that tolerance.
TEST_F(CudaTest, Bf16LayoutMatchesTheCpuLayout) {
  const Checkpoint ck = synth_checkpoint(synth_preset("110m"), 7, DType::BF16);
  ParallelEngineOptions cpu_layout = layout(2, 2);
  cpu_layout.blocks = 640;
  ParallelEngine cpu(ck, DType::BF16, cpu_layout);
  auto gpu = make_cuda_parallel_engine(ck, DType::BF16, layout(2, 2), {0}, layout_options());
  cpu.keep_logits(true), gpu->keep_logits(true);
  SlotBook a(64), b(64);
  std::vector<std::vector<int>> tokens{{1, 345, 2001, 77, 31999, 5, 900, 12}, {1, 42, 7}};
  const size_t vocab = size_t(ck.config.vocab_size);
  for (int step = 0; step < 9; ++step) {
    const auto want = cpu.step({a.next(0, tokens[0]), a.next(1, tokens[1])});
    const auto got = gpu->step({b.next(0, tokens[0]), b.next(1, tokens[1])});
    const auto& lc = cpu.last_logits();
    const auto& lg = gpu->last_logits();
    float scale = 0;
    for (float v : lc) scale = std::max(scale, std::abs(v));
    const float tol = 5e-2f * scale;
    EXPECT_TRUE(all_near(lg, lc, tol, 0)) << "step " << step;
    EXPECT_TRUE(ids_agree(lc, vocab, want, got, tol)) << "step " << step;
    for (size_t i = 0; i < 2; ++i) tokens[i] = {want[i]};
  }
}

// A pipeline with steps of several groups in flight (each stage works on
// one group while the next works on another) gives the single device's ids.
TEST_F(CudaTest, PipelinedGroupsInFlightGiveTheSingleDeviceIds) {
  const Checkpoint ck = load_checkpoint(repo_file("models/stories260K/stories260K.bin"));
  auto single = make_cuda_engine(ck, DType::F32, layout_options());
  const auto want = decode_in_groups(*single, 6, 2, 12);
  single.reset();
  auto pipeline = make_cuda_parallel_engine(ck, DType::F32, layout(2, 1), {0}, layout_options());
  EXPECT_EQ(decode_in_groups(*pipeline, 6, 2, 12), want);
}

// Shards hold their slices: each of a tensor pair's shards well under the
// whole model's weights.
TEST_F(CudaTest, CudaShardsHoldOnlyTheirSlice) {
  const Checkpoint ck = synth_checkpoint(synth_preset("110m"), 7, DType::BF16);
  auto single = make_cuda_engine(ck, DType::BF16, layout_options());
  const size_t whole = single->stats().weight_bytes.at(0);
  single.reset();
  auto pair = make_cuda_parallel_engine(ck, DType::BF16, layout(1, 2), {0}, layout_options());
  for (size_t b : pair->stats().weight_bytes) EXPECT_LT(double(b), 0.65 * double(whole));
}

// Bad device lists and layouts are refused with the reason.
TEST_F(CudaTest, LayoutsThatDoNotFitAreRefused) {
  const Checkpoint ck = load_checkpoint(repo_file("models/stories260K/stories260K.bin"));
  try {
    make_cuda_parallel_engine(ck, DType::F32, layout(2, 1), {0, 0, 0}, layout_options());
    FAIL() << "three device indices for two devices";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 CUDA device indices"), std::string::npos) << e.what();
  }
  try {
    make_cuda_parallel_engine(ck, DType::F32, layout(1, 3), {0}, layout_options());
    FAIL() << "tensor 3 over 8 heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tensor = 3"), std::string::npos) << e.what();
  }
}

// Two GPUs or more: a tensor pair on GPUs 0 and 1 (over NCCL) and two
// stages of such pairs (groups sharing GPUs: through host memory) give the
// single device's answer.
TEST_F(CudaTest, TensorPairsAcrossTwoGpusGiveTheSingleDeviceAnswer) {
  int count = 0;
  cu::check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 2) GTEST_SKIP() << "one GPU here; these layouts need two";
  const Checkpoint ck = load_checkpoint(repo_file("models/stories260K/stories260K.bin"));
  auto single = make_cuda_engine(ck, DType::F32, layout_options());
  const MixedRun want = run_mixed(*single, true, true);
  single.reset();
  for (auto [P, gpus] :
       std::vector<std::pair<int, std::vector<int>>>{{1, {0, 1}}, {2, {0, 1, 0, 1}}}) {
    auto engine = make_cuda_parallel_engine(ck, DType::F32, layout(P, 2), gpus, layout_options());
    const MixedRun got = run_mixed(*engine, true, true);
    EXPECT_EQ(got.ids, want.ids) << "P=" << P;
    EXPECT_LE(max_logit_diff(got, want), 1e-4f * largest(want)) << "P=" << P;
  }
}

}  // namespace
}  // namespace troupe::test
