// The one place that turns the configuration into engines: specs from the
// config, stage placement from measured layer times and memory caps, and
// the engines built from a spec.
#include <gtest/gtest.h>

#include <limits>

#include "deploy/engine_builder.h"
#include "gpu/layer_profile.h"
#include "gpu/parallel_engine.h"
#include "support/test_support.h"

namespace troupe {
namespace {

TEST(EngineBuilder, BalancedStagesFollowTheCostsAndTheMemoryCaps) {
  LayerProfile p;
  p.seconds = {1, 1, 1, 1, 1, 5};  // a heavy last layer (the classifier)
  p.weight_bytes = {100, 100, 100, 100, 100, 100};
  auto stages = balanced_stages(p, 2);
  EXPECT_EQ(stages, (std::vector<std::pair<int, int>>{{0, 5}, {5, 6}}));
  // Stage 0 can hold two layers with their KV share: the rest goes to stage 1.
  StageMemory m;
  m.kv_bytes_per_layer = 20;
  m.stage_cap_bytes = {240, std::numeric_limits<uint64_t>::max()};
  stages = balanced_stages(p, 2, m);
  EXPECT_EQ(stages, (std::vector<std::pair<int, int>>{{0, 2}, {2, 6}}));
  m.stage_cap_bytes = {100, 100};
  EXPECT_THROW(balanced_stages(p, 2, m), std::invalid_argument);
  EXPECT_TRUE(balanced_stages(p, 1).empty());
}

TEST(EngineBuilder, SpecsComeFromTheConfigPerReplica) {
  Config c = parse_config(
      "parallel: {replicas: 2, pipeline: 1, tensor: 2}\n"
      "devices: [{threads: 1}, {threads: 2, memory: 1GiB}, {threads: 3}, {threads: 4}]\n"
      "kv_cache: {block_tokens: 8, blocks: 77}\n",
      "test");
  ModelConfig m;
  m.n_layers = 4;
  m.n_kv_heads = 2;
  m.head_dim = 16;
  const EngineSpec r0 = engine_spec(c, m, 0), r1 = engine_spec(c, m, 1);
  EXPECT_EQ(r0.threads, (std::vector<int>{1, 2}));
  EXPECT_EQ(r1.threads, (std::vector<int>{3, 4}));
  EXPECT_EQ(r0.memory_of(1), int64_t(1) << 30);
  EXPECT_EQ(r0.memory_of(0), 0);
  EXPECT_EQ(r0.tensor, 2);
  EXPECT_EQ(r0.block_tokens, 8);
  EXPECT_EQ(r0.blocks, 77);
  // A byte budget becomes blocks through the model's KV size per token.
  apply_override(c, "kv_cache.bytes", std::to_string(m.kv_bytes_per_token() * 8 * 5 + 3));
  EXPECT_EQ(engine_spec(c, m, 0).blocks, 5);
  // ... of the cache's elements: a 16-bit cache fits twice the blocks.
  apply_override(c, "kv_cache.dtype", "f16");
  EXPECT_EQ(engine_spec(c, m, 0).kv_dtype, DType::F16);
  EXPECT_EQ(engine_spec(c, m, 0).blocks, 10);
  EXPECT_EQ(stage_memory(m, engine_spec(c, m, 0)).kv_bytes_per_layer,
            uint64_t(10) * 8 * kv_bytes_per_token(1, m.kv_dim(), DType::F16));
  apply_override(c, "kv_cache.dtype", "f32");
  // A stage holds T times its smallest shard's cap; no cap is "max".
  const StageMemory sm = stage_memory(m, r0);
  ASSERT_EQ(sm.stage_cap_bytes.size(), 1u);
  EXPECT_EQ(sm.stage_cap_bytes[0], uint64_t(2) << 30);
  EXPECT_EQ(sm.kv_bytes_per_layer, uint64_t(77) * 8 * kv_bytes_per_token(1, m.kv_dim()));
  EXPECT_TRUE(stage_memory(m, r1).stage_cap_bytes.empty());
}

TEST(EngineBuilder, ResolvesStagesRefusesMisfitsAndSharesOneDeviceWeights) {
  auto ck = std::make_shared<const Checkpoint>(load_checkpoint(test::model_path("fortune")));
  auto builder = std::make_shared<EngineBuilder>(ck, DType::F32);
  EngineSpec spec;
  spec.tensor = 4;  // 6 heads
  try {
    builder->resolve(spec);
    FAIL();
  } catch (const LayoutMisfit& e) {
    EXPECT_NE(std::string(e.what()).find("6 attention heads"), std::string::npos) << e.what();
  }
  spec.tensor = 1;
  spec.pipeline = 2;
  spec.blocks = 64;
  const EngineSpec resolved = builder->resolve(spec);
  ASSERT_EQ(resolved.stage_layers.size(), 2u);
  EXPECT_EQ(resolved.stage_layers.front().first, 0);
  EXPECT_EQ(resolved.stage_layers.front().second, resolved.stage_layers.back().first);
  EXPECT_EQ(resolved.stage_layers.back().second, 5);
  ASSERT_NE(builder->profile(), nullptr);
  EXPECT_EQ(builder->profile()->seconds.size(), 5u);
  auto pipeline = builder->build(resolved);
  EXPECT_EQ(pipeline->stages(), 2);
  EXPECT_EQ(pipeline->kv_blocks(), 64);
  // One-device replicas share one copy of the weights, packed by the first
  // build (the worker's), not by resolve (a node agent's, which must keep
  // answering and sending heartbeats).
  EngineSpec one;
  one.blocks = 32;
  const EngineFactory first = builder->factory(one);
  EXPECT_FALSE(builder->whole_model_packed());
  auto a = first({});
  EXPECT_TRUE(builder->whole_model_packed());
  auto b = builder->factory(one)({});
  ASSERT_NE(dynamic_cast<Engine*>(a.get()), nullptr);
  EXPECT_EQ(&dynamic_cast<Engine&>(*a).model(), &dynamic_cast<Engine&>(*b).model());
  EXPECT_EQ(a->kv_blocks(), 32);
}

// Device kinds: `auto` settles on CUDA only where a device answers; `cuda`
// without one, or with CUDA indices that do not fit the layout, is refused
// saying why.
// A device's memory cap holds its share of the weights and KV cache, in
// every layout; a refusal names the device and what did not fit.
TEST(EngineBuilder, AMemoryCapTooSmallForADevicesShareIsRefusedNamingIt) {
  auto ck = std::make_shared<const Checkpoint>(load_checkpoint(test::model_path("fortune")));
  auto builder = std::make_shared<EngineBuilder>(ck, DType::F32);
  const ModelConfig& c = ck->config;
  uint64_t weights = 0;
  for (uint64_t b : layer_weight_bytes(c, DType::F32)) weights += b;
  EngineSpec spec;
  spec.blocks = 64;
  const uint64_t kv = uint64_t(spec.blocks) * uint64_t(spec.block_tokens) * c.kv_bytes_per_token();
  spec.memory_bytes = {int64_t(weights + kv)};  // exactly enough
  EXPECT_NO_THROW(builder->resolve(spec));
  spec.memory_bytes = {int64_t(weights + kv - 1)};
  try {
    builder->resolve(spec);
    FAIL() << "a cap one byte short was taken";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device 0 (stage 0, shard 0) has a memory cap"), std::string::npos) << what;
    EXPECT_NE(what.find("64 blocks"), std::string::npos) << what;
  }
  // Two tensor shards each hold half: the cap that was short is enough for
  // one, half of it too small for the second.
  spec.tensor = 2;
  spec.memory_bytes = {int64_t(weights + kv - 1)};
  EXPECT_NO_THROW(builder->resolve(spec));
  spec.memory_bytes = {0, int64_t((weights + kv) / 4)};
  try {
    builder->resolve(spec);
    FAIL() << "a shard's cap too small was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("device 1 (stage 0, shard 1)"), std::string::npos)
        << e.what();
  }
}

TEST(EngineBuilder, DeviceKindsAreSettledOrRefusedWithTheReason) {
  auto ck = std::make_shared<const Checkpoint>(load_checkpoint(test::model_path("fortune")));
  auto builder = std::make_shared<EngineBuilder>(ck, DType::F32);
  EngineSpec spec;
  spec.blocks = 16;
  spec.kind = DeviceKind::Cuda;
  spec.pipeline = 2;
  spec.cuda_devices = {0, 1, 2};
  try {
    builder->resolve(spec);
    FAIL() << "three CUDA indices were accepted for two devices";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("one CUDA device index, or one per device"),
              std::string::npos)
        << e.what();
  }
  spec.cuda_devices = {0, 1};
  {
    // A CUDA engine keeps its cache in the weights' type: another 16-bit
    // type asked for is refused, GPU or not.
    auto bf16 = std::make_shared<EngineBuilder>(ck, DType::BF16);
    EngineSpec f16_cache = spec;
    f16_cache.kv_dtype = DType::F16;
    try {
      bf16->resolve(f16_cache);
      FAIL() << "an f16 cache was accepted for a CUDA replica with bf16 weights";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("kv_cache.dtype: f16 is for CPU devices"),
                std::string::npos)
          << e.what();
    }
  }
  std::string why;
  const bool gpu = EngineBuilder::cuda_available(&why);
  if (gpu) GTEST_SKIP() << "a CUDA device answers here (" << why << "); tests/gpu covers it";
  for (int pipeline : {2, 1}) {
    spec.pipeline = pipeline;
    spec.cuda_devices.resize(size_t(pipeline));
    try {
      builder->resolve(spec);
      FAIL() << "kind cuda was accepted without a GPU";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("devices: kind cuda, but"), std::string::npos)
          << e.what();
    }
  }
  {
    // A layout on `auto` without a GPU is a CPU layout.
    EngineSpec layout = spec;
    layout.kind = DeviceKind::Auto;
    layout.pipeline = 2;
    layout.cuda_devices = {0, 1};
    const EngineSpec resolved = builder->resolve(layout);
    EXPECT_EQ(resolved.kind, DeviceKind::Cpu);
    EXPECT_NE(dynamic_cast<ParallelEngine*>(builder->build(resolved).get()), nullptr);
  }
  spec.kind = DeviceKind::Auto;
  const EngineSpec resolved = builder->resolve(spec);
  EXPECT_EQ(resolved.kind, DeviceKind::Cpu);
  auto engine = builder->build(resolved);
  EXPECT_NE(dynamic_cast<Engine*>(engine.get()), nullptr);
  spec.kind = DeviceKind::Auto;
  EXPECT_THROW(builder->build(spec), std::logic_error);  // not resolved
}

TEST(EngineBuilder, AReplicaIsOfOneDeviceKindAndTakesItsCudaIndex) {
  ModelConfig m;
  m.n_layers = 4;
  m.n_kv_heads = 2;
  m.n_heads = 2;
  m.dim = 64;
  Config c = parse_config(
      "parallel: {replicas: 2, pipeline: 1, tensor: 1}\n"
      "devices: [{kind: cuda, index: 3}, {kind: auto}]\n",
      "test");
  EXPECT_EQ(engine_spec(c, m, 0).kind, DeviceKind::Cuda);
  EXPECT_EQ(engine_spec(c, m, 0).cuda_devices, std::vector<int>{3});
  EXPECT_EQ(engine_spec(c, m, 1).kind, DeviceKind::Auto);
  EXPECT_EQ(engine_spec(c, m, 1).cuda_devices, std::vector<int>{1});  // its number in the layout
  // A layout's devices each take their own index, or their number.
  Config layout = parse_config(
      "parallel: {replicas: 2, pipeline: 2, tensor: 2}\n"
      "devices: [{kind: cuda}, {kind: cuda}, {kind: cuda, index: 0}, {kind: cuda, index: 0},\n"
      "          {kind: cuda}, {kind: cuda}, {kind: cuda}, {kind: cuda}]\n",
      "test");
  EXPECT_EQ(engine_spec(layout, m, 0).cuda_devices, (std::vector<int>{0, 1, 0, 0}));
  EXPECT_EQ(engine_spec(layout, m, 1).cuda_devices, (std::vector<int>{4, 5, 6, 7}));
  Config mixed = parse_config(
      "parallel: {replicas: 1, pipeline: 1, tensor: 2}\n"
      "devices: [{kind: cpu}, {kind: cuda}]\n",
      "test");
  try {
    engine_spec(mixed, m, 0);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mixes kinds cpu and cuda"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_config("devices: [{kind: cuda, index: -2}]\n", "test"), ConfigError);
}

}  // namespace
}  // namespace troupe
