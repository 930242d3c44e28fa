#pragma once
// How decode attention divides a sequence's context among thread blocks.
// One block per (sequence, KV head) reads each key and value once for all
// the query heads of its group; when sequences x KV heads are too few to
// fill the GPU, long contexts are cut into partitions, each its own block,
// and a merge step combines their partial softmaxes (vLLM's paged attention
// v2, FlashDecoding). Plain C++ so the choice is unit-tested.
namespace troupe::cu {

// Keys a decode block scores at once (its threads); partitions are
// multiples of it.
inline constexpr int kDecodeChunk = 128;
// Deterministic mode cuts every context at this length, whatever the batch,
// so a sequence's partial sums never depend on what else is in the step.
inline constexpr int kFixedPartitionTokens = 512;
// A partition shorter than this costs more in merging than it gains.
inline constexpr int kMinPartitionTokens = 256;

struct DecodeSplit {
  int partition_tokens = 0;  // keys per block, a multiple of kDecodeChunk
  int partitions = 1;        // blocks per (sequence, KV head), covering max_context
  bool merged() const { return partitions > 1; }
};

struct DecodeSplitInputs {
  int sequences = 1;
  int kv_heads = 1;
  int max_context = 1;  // the longest context the blocks must cover
  int sm_count = 1;     // multiprocessors of the device
  bool deterministic = false;
};

// Blocks the plan aims for: two per multiprocessor keeps every one busy
// while another waits on memory.
inline int decode_target_blocks(int sm_count) {
  return 2 * sm_count;
}

// Deterministic: fixed partitions of kFixedPartitionTokens. Otherwise one
// partition when sequences x KV heads reach the target, else enough
// partitions (each at least kMinPartitionTokens) to reach it.
// Throws std::invalid_argument for non-positive inputs.
DecodeSplit plan_decode_split(const DecodeSplitInputs& in);

}  // namespace troupe::cu
