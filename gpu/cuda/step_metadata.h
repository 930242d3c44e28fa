#pragma once
// What the CUDA kernels of one step read besides weights and activations:
// token ids, positions, KV slots, block tables, per-row sampling. It lives in
// one persistent device buffer laid out for the engine's largest step, so a
// step fills it with one asynchronous copy and a captured graph replays
// against the same addresses every time. Plain C++: packed on the host.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/model_config.h"
#include "service/step_item.h"

namespace troupe::cu {

// The largest step the buffers are laid out for.
struct StepCapacity {
  int tokens = 0;          // tokens of all items together
  int items = 0;           // sequences in a step
  int blocks_per_seq = 0;  // block-table width: ceil(context / block_tokens)
};

// Where each array starts in the metadata buffer (bytes; every array
// 16-byte aligned). Counts come first so kernels of a captured graph can
// read the real sizes of the step they run for.
struct StepLayout {
  // counts: int32 [kCounts]
  static constexpr int kTokens = 0, kItems = 1, kRows = 2, kCounts = 4;
  size_t counts = 0;
  size_t token_ids = 0;     // int32 [tokens]
  size_t positions = 0;     // int32 [tokens]
  size_t token_item = 0;    // int32 [tokens]: the item each token belongs to
  size_t slots = 0;         // int32 [tokens]: block * block_tokens + offset; -1 for padding
  size_t item_start = 0;    // int32 [items + 1]: first token of each item
  size_t context = 0;       // int32 [items]: positions filled after the step
  size_t block_tables = 0;  // int32 [items * blocks_per_seq]
  size_t row_token = 0;     // int32 [items]: the token whose logits row r holds
  size_t temperature = 0;   // f32 [items], per row
  size_t top_p = 0;         // f32 [items], per row
  size_t top_k = 0;         // int32 [items], per row
  size_t coin = 0;          // f64 [items], per row: the sampler's uniform draw
  size_t bytes = 0;
  StepCapacity capacity;

  static StepLayout for_capacity(const StepCapacity& capacity);
};

// How a row of logits is sampled: greedy when temperature <= 0.
struct RowSampling {
  float temperature = 0;
  float top_p = 1;
  int top_k = 0;
  double coin = 0;  // next_double() of the sequence's generator
};

// A step as packed: its sizes (padded for a graph) and which item each
// logits row belongs to.
struct PackedStep {
  int tokens = 0;             // including padding
  int items = 0;              // including padding
  int real_items = 0;         // items given
  int max_item_tokens = 0;    // the longest item: prefill attention's grid
  int max_context = 0;        // the longest context after the step
  bool decode_only = true;    // every item has one token
  std::vector<int> row_item;  // item of each logits row (items with sample set)
};

// Throws std::invalid_argument naming the item and the problem (no tokens,
// an id outside the vocabulary, past the context, a block table that does
// not cover the item or, up to its last position, names a block outside
// [0, num_blocks)), or when the step exceeds the capacity; checked before
// anything is packed. Entries past an item's last position are not read.
void validate_step(std::span<const StepItem> items, const ModelConfig& model, int block_tokens,
                   int num_blocks, const StepCapacity& capacity);

// Packs `items` into `out` (layout.bytes of it), padded with empty one-token
// items up to `pad_items` (0: no padding): a padding token writes no KV slot,
// has no context and is not sampled. `sampling` holds one entry per sampled
// item, in item order. Validate first.
PackedStep pack_step(std::span<const StepItem> items, std::span<const RowSampling> sampling,
                     int block_tokens, const StepLayout& layout, int pad_items,
                     std::span<std::byte> out);

}  // namespace troupe::cu
