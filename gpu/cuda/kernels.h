#pragma once
// Launchers of the CUDA backend's own kernels (everything but the
// projections, which go through cuBLASLt). Callable from plain C++: pointers
// are device pointers, work is queued on `stream`, nothing synchronises.
// Element types follow the weights' dtype ("act": projection inputs and the
// KV cache); the residual stream, projection outputs and all accumulation
// are f32.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "gpu/cuda/decode_split.h"
#include "gpu/cuda/step_metadata.h"
#include "gpu/dtype.h"
#include "gpu/model_config.h"

namespace troupe::cu {

// The step metadata buffer on the device, array by array.
struct StepView {
  const int* counts = nullptr;
  const int* token_ids = nullptr;
  const int* positions = nullptr;
  const int* token_item = nullptr;
  const int* slots = nullptr;
  const int* item_start = nullptr;
  const int* context = nullptr;
  const int* block_tables = nullptr;
  const int* row_token = nullptr;
  const float* temperature = nullptr;
  const float* top_p = nullptr;
  const int* top_k = nullptr;
  const double* coin = nullptr;
  int blocks_per_seq = 0;
};

inline StepView step_view(const void* metadata, const StepLayout& l) {
  const char* b = static_cast<const char*>(metadata);
  StepView v;
  v.counts = reinterpret_cast<const int*>(b + l.counts);
  v.token_ids = reinterpret_cast<const int*>(b + l.token_ids);
  v.positions = reinterpret_cast<const int*>(b + l.positions);
  v.token_item = reinterpret_cast<const int*>(b + l.token_item);
  v.slots = reinterpret_cast<const int*>(b + l.slots);
  v.item_start = reinterpret_cast<const int*>(b + l.item_start);
  v.context = reinterpret_cast<const int*>(b + l.context);
  v.block_tables = reinterpret_cast<const int*>(b + l.block_tables);
  v.row_token = reinterpret_cast<const int*>(b + l.row_token);
  v.temperature = reinterpret_cast<const float*>(b + l.temperature);
  v.top_p = reinterpret_cast<const float*>(b + l.top_p);
  v.top_k = reinterpret_cast<const int*>(b + l.top_k);
  v.coin = reinterpret_cast<const double*>(b + l.coin);
  v.blocks_per_seq = l.capacity.blocks_per_seq;
  return v;
}

// x[t] = row token_ids[t] of `table` ([vocab, dim] in `dtype`), as f32.
void embed_tokens(const void* table, DType dtype, const int* token_ids, int tokens, int dim,
                  float* x, cudaStream_t stream);

// For each output row r < rows, with source row s = row_map ? row_map[r] : r:
// v = x[s] (+ delta[s] when delta is set); out[r] = v / sqrt(mean(v^2) + eps)
// * w in `out_type`. Without a row map x[s] = v is stored back (the residual
// add); with one x is left alone (the final norm of the sampled tokens).
void add_rmsnorm(float* x, const float* delta, const float* w, const int* row_map, void* out,
                 DType out_type, int rows, int dim, float eps, cudaStream_t stream);

// Where attention reads and writes: the geometry of heads and the cache.
struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 0;
  float scale = 1;  // 1 / sqrt(head_dim)
};

// Rotates the query and key heads of each token of qkv ([tokens, q + 2 kv]
// f32) by its position (`cos_sin`: [max_pos, head_dim / 2] cos then sin),
// writes the queries to q ([tokens, q] f32) and the keys and values to the
// token's KV slot (skipped for slot -1) of one layer's cache in `cache_type`.
void rope_write_kv(const float* qkv, const StepView& step, int tokens, const float* cos_sin,
                   int max_pos, const AttentionShape& shape, RopeLayout layout, float* q,
                   void* k_cache, void* v_cache, DType cache_type, cudaStream_t stream);

// out[t] = silu(gate[t]) * up[t] in `out_type`; gate_up is [rows, 2 hidden].
void silu_mul(const float* gate_up, int rows, int hidden, void* out, DType out_type,
              cudaStream_t stream);

// Scratch of split decode attention: [items, heads, partitions, head_dim]
// partial numerators, and [items, heads, partitions] maxima and sums.
struct DecodePartials {
  float* acc = nullptr;
  float* max = nullptr;
  float* sum = nullptr;
};

// Attention of the one-token items among `items` (others are skipped): one
// block per (partition, KV head, item) reads each key and value once for
// the KV head's query heads; with split.partitions > 1 a merge kernel
// combines the partitions. out is [tokens, q] in `cache_type`.
void decode_attention(const StepView& step, int items, const float* q, const void* k_cache,
                      const void* v_cache, DType cache_type, const AttentionShape& shape,
                      const DecodeSplit& split, const DecodePartials& partials, void* out,
                      cudaStream_t stream);

// Causal attention of the items with more than one token (chunked prefill:
// earlier positions come from the cache through the block table), in tiles
// of queries that share each key and value loaded.
void prefill_attention(const StepView& step, int items, int max_item_tokens, const float* q,
                       const void* k_cache, const void* v_cache, DType cache_type,
                       const AttentionShape& shape, void* out, cudaStream_t stream);

// Samples logits row r < counts[kRows] ([rows, vocab] f32) as
// troupe::Sampler does with the same coin: sampled[r] is the id, flags[r]
// is 1 when the coin landed so near a boundary between two ids that f64
// rounding could decide it (the host then samples that row itself), else 0.
void sample_rows(const float* logits, int rows, int vocab, const StepView& step, int* sampled,
                 int* flags, cudaStream_t stream);

// x[i] += delta[i] for i < n: a stage's last down projection joining the
// residual it hands to the next stage (the same f32 add add_rmsnorm makes).
void add_into(float* x, const float* delta, size_t n, cudaStream_t stream);

// out[i] = sum over r < ranks, in rank order, of gathered[r * n + i].
void sum_ranks(const float* gathered, int ranks, size_t n, float* out, cudaStream_t stream);

// Kernel attributes (shared memory above 48 KiB); call once per device
// before the first launch and never inside a graph capture.
void configure_kernels();

}  // namespace troupe::cu
