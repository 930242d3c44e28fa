#pragma once
// Plain data shared with the per-ISA attention kernels (attention_avx2.cpp,
// attention_avx512.cpp). Like gemm_types.h: those files are compiled with
// wider ISA flags, so they see only this POD and call no inline library code.
#include <cstddef>

namespace troupe::kernels {

// What a cache row holds: f32, or 16-bit floats the kernels widen exactly
// on load (so the arithmetic and its order are the same for every type).
enum class KvType : int { F32, F16, BF16 };

// 16-bit cache elements, as distinct types so the kernels overload on them.
struct F16Bits {
  unsigned short bits;
};
struct Bf16Bits {
  unsigned short bits;
};

// Keys and values of one layer in a paged cache: position j of a sequence
// lives in block blocks[j / block_tokens], row j % block_tokens, at
// head_off + blocks[b] * block_stride + row * row_stride (gpu/kv_cache.h
// keeps each kv head's blocks apart, so row_stride is the head size there).
struct PagedKv {
  const void* keys;    // block 0 of this layer's keys
  const void* values;  // block 0 of this layer's values
  const int* blocks;
  int block_tokens;
  size_t block_stride;  // elements from one block to the next
  size_t row_stride;    // elements from one position's row to the next
  KvType type = KvType::F32;
};

// Query heads that attend to the same kv head of the same sequence (the heads
// of a grouped-query group, consecutive tokens of a prompt chunk), so that
// each key and value row is loaded once for all of them.
constexpr int kTileQueries = 8;

struct HeadTile {
  int count = 0;
  const float* q[kTileQueries];  // head_dim values each
  int n[kTileQueries];           // query i attends to positions [from[i], n[i])
  int from[kTileQueries] = {};   // 0 but in a sliding window's layers
  float* scores[kTileQueries];   // n[i] floats each
  float* out[kTileQueries];      // head_dim values each
};

// Floats of scratch a tile's scores pass needs for its packed queries.
constexpr size_t tile_scratch_floats(int head_dim) {
  return size_t(kTileQueries) * size_t((head_dim + 7) / 8 * 8);
}

namespace detail {
// scores[i][j] = q_i . k_j * scale, every dot in the one order attend_head
// has always used; then (after the caller's softmax) out_i = sum_j
// scores[i][j] v_j, each element one FMA chain over j.
using TileScoresFn = void (*)(const HeadTile& tile, int head_dim, float scale, const PagedKv& kv,
                              size_t head_off, float* scratch);
using TileValuesFn = void (*)(const HeadTile& tile, int head_dim, const PagedKv& kv,
                              size_t head_off);
struct TileFns {
  TileScoresFn scores;
  TileValuesFn values;
};
TileFns attention_avx2(KvType type);
TileFns attention_avx512(KvType type);
}  // namespace detail

}  // namespace troupe::kernels
