#include "gpu/cuda/step_metadata.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::cu {

namespace {

constexpr size_t kAlign = 16;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Appends an array of `count` elements of `size` bytes; returns its offset.
size_t place(size_t& cursor, size_t count, size_t size) {
  const size_t at = cursor;
  cursor = align_up(cursor + count * size);
  return at;
}

template <class T>
T* at(std::span<std::byte> out, size_t offset) {
  return reinterpret_cast<T*>(out.data() + offset);
}

std::string item_name(size_t i, const StepItem& it) {
  return "step item " + std::to_string(i) + " (sequence " + std::to_string(it.seq) + ")";
}

}  // namespace

StepLayout StepLayout::for_capacity(const StepCapacity& c) {
  if (c.tokens < 1 || c.items < 1 || c.blocks_per_seq < 1)
    throw std::invalid_argument("step capacity needs at least one token, item and block");
  StepLayout l;
  l.capacity = c;
  const size_t T = size_t(c.tokens), S = size_t(c.items);
  size_t cursor = 0;
  l.counts = place(cursor, kCounts, 4);
  l.token_ids = place(cursor, T, 4);
  l.positions = place(cursor, T, 4);
  l.token_item = place(cursor, T, 4);
  l.slots = place(cursor, T, 4);
  l.item_start = place(cursor, S + 1, 4);
  l.context = place(cursor, S, 4);
  l.block_tables = place(cursor, S * size_t(c.blocks_per_seq), 4);
  l.row_token = place(cursor, S, 4);
  l.temperature = place(cursor, S, 4);
  l.top_p = place(cursor, S, 4);
  l.top_k = place(cursor, S, 4);
  l.coin = place(cursor, S, 8);
  l.bytes = cursor;
  return l;
}

void validate_step(std::span<const StepItem> items, const ModelConfig& model, int block_tokens,
                   int num_blocks, const StepCapacity& capacity) {
  if (items.empty()) throw std::invalid_argument("a step needs at least one item");
  if (int(items.size()) > capacity.items)
    throw std::invalid_argument("step of " + std::to_string(items.size()) +
                                " sequences exceeds the engine's max_batch_sequences of " +
                                std::to_string(capacity.items));
  size_t tokens = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    if (it.tokens.empty()) throw std::invalid_argument(item_name(i, it) + " has no tokens");
    for (int id : it.tokens)
      if (id < 0 || id >= model.vocab_size)
        throw std::invalid_argument(item_name(i, it) + ": token id " + std::to_string(id) +
                                    " is outside the vocabulary [0, " +
                                    std::to_string(model.vocab_size) + ")");
    const size_t end = size_t(it.position) + it.tokens.size();
    if (it.position < 0 || end > size_t(model.max_seq_len))
      throw std::invalid_argument(item_name(i, it) + ": positions up to " + std::to_string(end) +
                                  " exceed the context length " +
                                  std::to_string(model.max_seq_len));
    if (it.blocks.size() * size_t(block_tokens) < end)
      throw std::invalid_argument(item_name(i, it) + ": block table of " +
                                  std::to_string(it.blocks.size()) + " blocks does not cover " +
                                  std::to_string(end) + " positions");
    // Only the blocks up to the step's last position are read (and packed):
    // a longer table (blocks reserved ahead) is fine, as on the CPU.
    const size_t used = (end + size_t(block_tokens) - 1) / size_t(block_tokens);
    if (used > size_t(capacity.blocks_per_seq))
      throw std::invalid_argument(item_name(i, it) + ": " + std::to_string(used) +
                                  " blocks in use exceed " +
                                  std::to_string(capacity.blocks_per_seq) + " per sequence");
    for (int b : std::span<const int>(it.blocks).first(used))
      if (b < 0 || b >= num_blocks)
        throw std::invalid_argument(item_name(i, it) + ": block id " + std::to_string(b) +
                                    " is outside the cache's [0, " + std::to_string(num_blocks) +
                                    ")");
    tokens += it.tokens.size();
  }
  if (tokens > size_t(capacity.tokens))
    throw std::invalid_argument("step of " + std::to_string(tokens) +
                                " tokens exceeds the engine's max_batch_tokens of " +
                                std::to_string(capacity.tokens));
}

PackedStep pack_step(std::span<const StepItem> items, std::span<const RowSampling> sampling,
                     int block_tokens, const StepLayout& l, int pad_items,
                     std::span<std::byte> out) {
  if (out.size() < l.bytes) throw std::invalid_argument("pack_step: buffer smaller than layout");
  const int S = std::max(int(items.size()), pad_items);
  if (S > l.capacity.items) throw std::invalid_argument("pack_step: padding exceeds capacity");
  const int B = l.capacity.blocks_per_seq;
  PackedStep p;
  p.real_items = int(items.size());
  p.items = S;
  int* ids = at<int>(out, l.token_ids);
  int* pos = at<int>(out, l.positions);
  int* tok_item = at<int>(out, l.token_item);
  int* slots = at<int>(out, l.slots);
  int* start = at<int>(out, l.item_start);
  int* ctx = at<int>(out, l.context);
  int* tables = at<int>(out, l.block_tables);
  int t = 0;
  for (int i = 0; i < S; ++i) {
    start[i] = t;
    int* table = tables + size_t(i) * size_t(B);
    if (i >= p.real_items) {  // padding: one inert token
      ids[t] = 0, pos[t] = 0, tok_item[t] = i, slots[t] = -1;
      ++t;
      ctx[i] = 0;
      std::fill(table, table + B, 0);
      continue;
    }
    const StepItem& it = items[size_t(i)];
    const int n = int(it.tokens.size());
    for (int j = 0; j < n; ++j, ++t) {
      const int position = it.position + j;
      ids[t] = it.tokens[size_t(j)];
      pos[t] = position;
      tok_item[t] = i;
      slots[t] =
          it.blocks[size_t(position / block_tokens)] * block_tokens + position % block_tokens;
    }
    ctx[i] = it.position + n;
    const size_t used = size_t(ctx[i] + block_tokens - 1) / size_t(block_tokens);
    std::copy_n(it.blocks.begin(), used, table);
    std::fill(table + used, table + B, 0);
    p.max_item_tokens = std::max(p.max_item_tokens, n);
    p.max_context = std::max(p.max_context, ctx[i]);
    p.decode_only = p.decode_only && n == 1;
    if (it.sample) p.row_item.push_back(i);
  }
  start[S] = t;
  p.tokens = t;
  if (p.max_item_tokens == 0) p.max_item_tokens = 1;
  if (sampling.size() != p.row_item.size())
    throw std::invalid_argument("pack_step: one sampling entry per sampled item is needed");
  int* row_token = at<int>(out, l.row_token);
  float* temp = at<float>(out, l.temperature);
  float* top_p = at<float>(out, l.top_p);
  int* top_k = at<int>(out, l.top_k);
  double* coin = at<double>(out, l.coin);
  for (size_t r = 0; r < p.row_item.size(); ++r) {
    const int i = p.row_item[r];
    row_token[r] = start[i + 1] - 1;
    temp[r] = sampling[r].temperature;
    top_p[r] = sampling[r].top_p;
    top_k[r] = sampling[r].top_k;
    coin[r] = sampling[r].coin;
  }
  // A graph computes logits for every item: rows past the sampled ones read
  // token 0 rather than a stale index, and are not sampled.
  for (int r = int(p.row_item.size()); r < S; ++r) row_token[r] = 0, temp[r] = 0;
  int* counts = at<int>(out, l.counts);
  counts[StepLayout::kTokens] = p.tokens;
  counts[StepLayout::kItems] = p.items;
  counts[StepLayout::kRows] = int(p.row_item.size());
  counts[3] = 0;
  return p;
}

}  // namespace troupe::cu
