// The CUDA backend's plain-C++ planning: step metadata packing, the decode
// attention split, graph batch sizes, and the device pool's accounting.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu/cuda/decode_split.h"
#include "gpu/cuda/graph_sizes.h"
#include "gpu/cuda/memory_plan.h"
#include "gpu/cuda/step_metadata.h"
#include "gpu/synth_model.h"

namespace troupe::cu {
namespace {

ModelConfig tiny() {
  return synth_preset("tiny");  // vocab 300, context 128
}

StepItem item(uint64_t seq, std::vector<int> tokens, int position, std::vector<int> blocks,
              bool sample = true) {
  StepItem it;
  it.seq = seq;
  it.tokens = std::move(tokens);
  it.position = position;
  it.blocks = std::move(blocks);
  it.sample = sample;
  return it;
}

template <class T>
const T* field(const std::vector<std::byte>& buf, size_t offset) {
  return reinterpret_cast<const T*>(buf.data() + offset);
}

TEST(StepLayout, ArraysAreAlignedAndDisjoint) {
  const StepLayout l = StepLayout::for_capacity({64, 8, 4});
  const size_t offsets[] = {l.counts,     l.token_ids, l.positions,    l.token_item, l.slots,
                            l.item_start, l.context,   l.block_tables, l.row_token,  l.temperature,
                            l.top_p,      l.top_k,     l.coin};
  for (size_t i = 0; i < std::size(offsets); ++i) {
    EXPECT_EQ(offsets[i] % 16, 0u) << i;
    if (i > 0) {
      EXPECT_GT(offsets[i], offsets[i - 1]) << i;
    }
  }
  EXPECT_GE(l.token_ids - l.counts, 4 * sizeof(int));
  EXPECT_GE(l.row_token - l.block_tables, 8u * 4u * sizeof(int));
  EXPECT_GE(l.bytes, l.coin + 8 * sizeof(double));
  EXPECT_THROW(StepLayout::for_capacity({0, 8, 4}), std::invalid_argument);
}

TEST(StepMetadata, PacksARaggedBatch) {
  const int bt = 4;
  const StepLayout l = StepLayout::for_capacity({16, 4, 8});
  std::vector<std::byte> buf(l.bytes);
  // A 3-token prefill chunk at position 2 of blocks {5, 1}, a decode token
  // at position 6 of blocks {2, 7}, an unsampled prefill chunk.
  const std::vector<StepItem> items{item(10, {11, 12, 13}, 2, {5, 1}), item(20, {14}, 6, {2, 7}),
                                    item(30, {15, 16}, 0, {3}, false)};
  const RowSampling rows[] = {{0, 1, 0, 0}, {0.8f, 0.9f, 40, 0.25}};
  const PackedStep p = pack_step(items, rows, bt, l, 0, buf);
  EXPECT_EQ(p.tokens, 6);
  EXPECT_EQ(p.items, 3);
  EXPECT_EQ(p.max_item_tokens, 3);
  EXPECT_EQ(p.max_context, 7);
  EXPECT_FALSE(p.decode_only);
  EXPECT_EQ(p.row_item, (std::vector<int>{0, 1}));

  const int* counts = field<int>(buf, l.counts);
  EXPECT_EQ(counts[StepLayout::kTokens], 6);
  EXPECT_EQ(counts[StepLayout::kItems], 3);
  EXPECT_EQ(counts[StepLayout::kRows], 2);
  const int* ids = field<int>(buf, l.token_ids);
  const int* pos = field<int>(buf, l.positions);
  const int* slots = field<int>(buf, l.slots);
  const int* tok_item = field<int>(buf, l.token_item);
  EXPECT_EQ(std::vector<int>(ids, ids + 6), (std::vector<int>{11, 12, 13, 14, 15, 16}));
  EXPECT_EQ(std::vector<int>(pos, pos + 6), (std::vector<int>{2, 3, 4, 6, 0, 1}));
  EXPECT_EQ(std::vector<int>(tok_item, tok_item + 6), (std::vector<int>{0, 0, 0, 1, 2, 2}));
  // position 2, 3 in block 5, position 4 in block 1; position 6 in block 7.
  EXPECT_EQ(std::vector<int>(slots, slots + 6),
            (std::vector<int>{5 * 4 + 2, 5 * 4 + 3, 1 * 4 + 0, 7 * 4 + 2, 3 * 4, 3 * 4 + 1}));
  const int* start = field<int>(buf, l.item_start);
  EXPECT_EQ(std::vector<int>(start, start + 4), (std::vector<int>{0, 3, 4, 6}));
  const int* ctx = field<int>(buf, l.context);
  EXPECT_EQ(std::vector<int>(ctx, ctx + 3), (std::vector<int>{5, 7, 2}));
  const int* tables = field<int>(buf, l.block_tables);
  EXPECT_EQ(tables[0], 5);
  EXPECT_EQ(tables[1], 1);
  EXPECT_EQ(tables[2], 0);  // unused entries are zero, never garbage
  EXPECT_EQ(tables[8], 2);
  EXPECT_EQ(tables[9], 7);
  const int* row_token = field<int>(buf, l.row_token);
  EXPECT_EQ(row_token[0], 2);  // last token of item 0
  EXPECT_EQ(row_token[1], 3);
  EXPECT_FLOAT_EQ(field<float>(buf, l.temperature)[1], 0.8f);
  EXPECT_FLOAT_EQ(field<float>(buf, l.top_p)[1], 0.9f);
  EXPECT_EQ(field<int>(buf, l.top_k)[1], 40);
  EXPECT_EQ(field<double>(buf, l.coin)[1], 0.25);
}

TEST(StepMetadata, PadsADecodeStepWithInertItems) {
  const StepLayout l = StepLayout::for_capacity({8, 8, 2});
  std::vector<std::byte> buf(l.bytes, std::byte{0x7f});
  const std::vector<StepItem> items{item(1, {5}, 3, {0}), item(2, {6}, 0, {1})};
  const RowSampling rows[] = {{}, {}};
  const PackedStep p = pack_step(items, rows, 4, l, 4, buf);
  EXPECT_TRUE(p.decode_only);
  EXPECT_EQ(p.items, 4);
  EXPECT_EQ(p.real_items, 2);
  EXPECT_EQ(p.tokens, 4);
  EXPECT_EQ(field<int>(buf, l.counts)[StepLayout::kItems], 4);
  EXPECT_EQ(field<int>(buf, l.counts)[StepLayout::kRows], 2);
  for (int i = 2; i < 4; ++i) {
    EXPECT_EQ(field<int>(buf, l.slots)[i], -1) << "padding writes no KV slot";
    EXPECT_EQ(field<int>(buf, l.context)[i], 0);
    EXPECT_EQ(field<int>(buf, l.token_ids)[i], 0);
    EXPECT_EQ(field<int>(buf, l.block_tables)[2 * i], 0);
  }
  EXPECT_EQ(field<int>(buf, l.item_start)[4], 4);
  EXPECT_THROW(pack_step(items, rows, 4, l, 9, buf), std::invalid_argument);
}

TEST(StepMetadata, PacksOnlyTheBlocksAStepReads) {
  const StepLayout l = StepLayout::for_capacity({8, 2, 3});
  std::vector<std::byte> buf(l.bytes, std::byte{0x7f});
  // Positions 4..5 of 4-token blocks: blocks 0 and 1 are read; 2 and 3 are
  // reserved ahead (the last one past the layout's width).
  const std::vector<StepItem> items{item(1, {5, 6}, 4, {7, 8, 9, 10})};
  const RowSampling rows[] = {{}};
  pack_step(items, rows, 4, l, 0, buf);
  const int* table = field<int>(buf, l.block_tables);
  EXPECT_EQ(table[0], 7);
  EXPECT_EQ(table[1], 8);
  EXPECT_EQ(table[2], 0);
  EXPECT_EQ(field<int>(buf, l.slots)[1], 8 * 4 + 1);
}

TEST(StepMetadata, ValidationNamesTheProblem) {
  const ModelConfig m = tiny();
  const StepCapacity cap{8, 2, 4};
  auto message = [&](const std::vector<StepItem>& items) {
    try {
      validate_step(items, m, 16, 10, cap);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({item(1, {1, 2}, 0, {0})}), "");
  EXPECT_NE(message({}).find("at least one item"), std::string::npos);
  EXPECT_NE(message({item(1, {}, 0, {0})}).find("has no tokens"), std::string::npos);
  EXPECT_NE(message({item(1, {300}, 0, {0})}).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(message({item(1, {1}, 128, {0, 1, 2, 3})}).find("context length 128"),
            std::string::npos);
  EXPECT_NE(message({item(7, {1, 2}, 15, {0})}).find("does not cover 17 positions"),
            std::string::npos);
  EXPECT_NE(message({item(7, {1}, 0, {10})}).find("block id 10"), std::string::npos);
  // A table longer than the step needs (blocks reserved ahead) is fine;
  // only the blocks it reads are checked.
  EXPECT_EQ(message({item(7, {1}, 0, {0, 1, 2, 3, 4, 99})}), "");
  EXPECT_NE(message({item(7, {1}, 70, {0, 1, 2, 3, 4})}).find("5 blocks in use exceed 4"),
            std::string::npos);
  EXPECT_NE(message({item(1, {1}, 0, {0}), item(2, {1}, 0, {1}), item(3, {1}, 0, {2})})
                .find("max_batch_sequences of 2"),
            std::string::npos);
  EXPECT_NE(message({item(1, std::vector<int>(9, 1), 0, {0})}).find("max_batch_tokens of 8"),
            std::string::npos);
  EXPECT_NE(message({item(7, {1}, 0, {10})}).find("sequence 7"), std::string::npos);
}

TEST(DecodeSplit, FewSequencesSplitLongContexts) {
  DecodeSplitInputs in;
  in.sequences = 1, in.kv_heads = 4, in.max_context = 2048, in.sm_count = 132;
  const DecodeSplit s = plan_decode_split(in);
  EXPECT_TRUE(s.merged());
  EXPECT_EQ(s.partition_tokens % kDecodeChunk, 0);
  EXPECT_GE(s.partition_tokens, kMinPartitionTokens);
  EXPECT_GE(s.partitions * s.partition_tokens, 2048);
  EXPECT_LT((s.partitions - 1) * s.partition_tokens, 2048);
  EXPECT_EQ(s.partitions, 8);  // 2048 / 256: the shortest partition allowed
}

TEST(DecodeSplit, AFullGpuOrAShortContextIsNotSplit) {
  DecodeSplitInputs in;
  in.sequences = 128, in.kv_heads = 4, in.max_context = 2048, in.sm_count = 132;
  EXPECT_EQ(plan_decode_split(in).partitions, 1);  // 512 blocks >= 264
  in.sequences = 1, in.max_context = 200;
  const DecodeSplit s = plan_decode_split(in);
  EXPECT_EQ(s.partitions, 1);
  EXPECT_EQ(s.partition_tokens, 256);
  EXPECT_THROW(plan_decode_split({0, 4, 10, 132, false}), std::invalid_argument);
}

TEST(DecodeSplit, DeterministicModeIgnoresTheBatch) {
  for (int seqs : {1, 7, 64, 256}) {
    const DecodeSplit s = plan_decode_split({seqs, 4, 2048, 132, true});
    EXPECT_EQ(s.partition_tokens, kFixedPartitionTokens) << seqs;
    EXPECT_EQ(s.partitions, 4) << seqs;
  }
}

TEST(DecodeSplit, NeverMorePartitionsThanThePoolHolds) {
  for (int ctx = 1; ctx <= 5000; ctx += 37)
    for (int seqs : {1, 2, 3, 9, 33})
      for (int sms : {1, 16, 132})
        for (bool det : {false, true}) {
          const DecodeSplit s = plan_decode_split({seqs, 2, ctx, sms, det});
          EXPECT_LE(s.partitions, max_decode_partitions(ctx)) << ctx << " " << seqs;
          EXPECT_GE(s.partitions * s.partition_tokens, ctx);
        }
}

TEST(GraphSizes, PowersThenMultiplesOfEight) {
  EXPECT_EQ(graph_batch_sizes(32), (std::vector<int>{1, 2, 4, 8, 16, 24, 32}));
  EXPECT_EQ(graph_batch_sizes(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(graph_batch_sizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_TRUE(graph_batch_sizes(0).empty());
}

TEST(GraphSizes, PadsToTheSmallestCapturedSize) {
  const auto sizes = graph_batch_sizes(32);
  EXPECT_EQ(padded_batch(sizes, 1), 1);
  EXPECT_EQ(padded_batch(sizes, 3), 4);
  EXPECT_EQ(padded_batch(sizes, 9), 16);
  EXPECT_EQ(padded_batch(sizes, 32), 32);
  EXPECT_EQ(padded_batch(sizes, 33), 0);  // eager
  EXPECT_EQ(padded_batch(sizes, 0), 0);
}

TEST(PoolPlan, AlignsAndGroups) {
  PoolPlan p;
  EXPECT_EQ(p.add("weights", 10), 0u);
  EXPECT_EQ(p.add("weights", 300), kPoolAlign);
  EXPECT_EQ(p.add("KV cache", 1), 3 * kPoolAlign);
  EXPECT_EQ(p.total(), 4 * kPoolAlign);
  ASSERT_EQ(p.groups().size(), 2u);
  EXPECT_EQ(p.groups()[0].name, "weights");
  EXPECT_EQ(p.groups()[0].bytes, 3 * kPoolAlign);
}

TEST(PoolPlan, RefusesNamingWhatDidNotFit) {
  const size_t GiB = size_t(1) << 30;
  PoolPlan p;
  p.add("weights", 2 * GiB);
  p.add("KV cache (4096 blocks x 16 tokens)", 6 * GiB);
  p.add("activations", GiB / 2);
  EXPECT_NO_THROW(p.check_fits(10 * GiB, GiB, "CUDA device 0"));
  try {
    p.check_fits(8 * GiB, GiB, "CUDA device 0");
    FAIL() << "expected a refusal";
  } catch (const DeviceMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("CUDA device 0: KV cache (4096 blocks x 16 tokens) needs 6.00 GiB"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("only 5.00 GiB is left"), std::string::npos) << m;
    EXPECT_NE(m.find("8.00 GiB free, 1.00 GiB kept in reserve"), std::string::npos) << m;
    EXPECT_NE(m.find("planned before it: weights 2.00 GiB"), std::string::npos) << m;
  }
  EXPECT_THROW(p.check_fits(GiB, 2 * GiB, "d"), DeviceMemoryError);  // reserve above free
}

TEST(PoolPlan, StepBuffersScaleWithTheCapacity) {
  const ModelConfig m = synth_preset("1b");
  PoolPlan small, large;
  const StepBuffers a =
      plan_step_buffers(small, m, DType::BF16, StepLayout::for_capacity({64, 8, 128}));
  plan_step_buffers(large, m, DType::BF16, StepLayout::for_capacity({2048, 256, 128}));
  EXPECT_LT(small.total(), large.total());
  EXPECT_EQ(a.x, 0u);
  EXPECT_EQ(a.xb - a.x, 64u * 2048 * 4);    // f32 residual stream
  EXPECT_EQ(a.qkv - a.xb, 64u * 2048 * 2);  // bf16 projection input
  EXPECT_GT(a.workspace, a.metadata);
  EXPECT_EQ(small.total() - a.workspace, kGemmWorkspaceBytes);
  EXPECT_EQ(kv_cache_bytes(m, DType::BF16, 16, 100), size_t(22) * 2 * 100 * 16 * 256 * 2);
}

TEST(FormatBytes, PicksAUnit) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(format_bytes(size_t(3) << 29), "1.50 GiB");
}

}  // namespace
}  // namespace troupe::cu
