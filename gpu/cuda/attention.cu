// Paged attention over the block tables: decode (one query token per
// sequence, optionally split into partitions plus a merge) and chunked
// prefill (tiles of query tokens sharing each key and value they load).
// Scores, softmax and sums are f32; the cache holds the weights' dtype.
#include <algorithm>
#include <string>
#include <type_traits>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/device_common.cuh"
#include "gpu/cuda/kernels.h"

namespace troupe::cu {

namespace {

// ---- decode ----------------------------------------------------------------

// Query heads per KV head the register arrays hold (grouped-query ratio).
constexpr int kMaxGroup = 8;
constexpr int kMaxHeadDim = 256;

struct DecodeSmem {
  int head_dim, group, key_lanes;
  // q [group][head_dim], p [group][chunk], stats [3][group], reduction
  // [key_lanes][group][head_dim].
  size_t floats() const {
    return size_t(group) * head_dim + size_t(group) * kDecodeChunk + 3 * size_t(group) +
           size_t(key_lanes) * group * head_dim;
  }
};

__device__ __forceinline__ size_t kv_row(const int* table, int block_tokens, int pos, int kvd,
                                         int head_offset) {
  const int slot = table[pos / block_tokens] * block_tokens + pos % block_tokens;
  return size_t(slot) * size_t(kvd) + size_t(head_offset);
}

// One block per (partition, KV head, item); kDecodeChunk threads. Keys are
// taken kDecodeChunk at a time: each thread scores one key against every
// query head of the group (the key is read once), the chunk's softmax is
// folded into running maxima and sums (online softmax), and the values are
// accumulated by (key lane, 8-element column chunk) threads.
template <class T, int G>
__global__ void __launch_bounds__(kDecodeChunk)
    decode_kernel(StepView step, const float* q, const T* k_cache, const T* v_cache,
                  AttentionShape shape, int partition_tokens, int partitions,
                  DecodePartials partials, T* out) {
  extern __shared__ float smem[];
  const int item = blockIdx.z, kvh = blockIdx.y, part = blockIdx.x;
  const int t = step.item_start[item];
  if (step.item_start[item + 1] - t != 1) return;  // prefill items: prefill_attention
  const int ctx = step.context[item];
  const int kbeg = part * partition_tokens;
  if (part > 0 && kbeg >= ctx) return;
  const int kend = min(kbeg + partition_tokens, ctx);
  const int D = shape.head_dim, bt = shape.block_tokens;
  const int kvd = shape.n_kv_heads * D, qd = shape.n_heads * D;
  const int col_chunks = D / 8, key_lanes = kDecodeChunk / col_chunks;
  float* q_s = smem;
  float* p_s = q_s + G * D;
  float* m_s = p_s + G * kDecodeChunk;
  float* l_s = m_s + G;
  float* corr_s = l_s + G;
  float* red = corr_s + G;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int i = tid; i < G * D; i += blockDim.x)
    q_s[i] = q[size_t(t) * qd + size_t(kvh) * G * D + i] * shape.scale;
  if (tid < G) m_s[tid] = -INFINITY, l_s[tid] = 0.0f;
  __syncthreads();

  const int* table = step.block_tables + size_t(item) * step.blocks_per_seq;
  const int cl = tid % col_chunks, kl = tid / col_chunks;
  float acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;

  for (int c0 = kbeg; c0 < kend; c0 += kDecodeChunk) {
    const int n = min(kDecodeChunk, kend - c0);
    {
      float s[G];
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = 0.0f;
      if (tid < n) {
        const T* krow = k_cache + kv_row(table, bt, c0 + tid, kvd, kvh * D);
        for (int d0 = 0; d0 < D; d0 += 8) {
          float kv[8];
          load8(krow + d0, kv);
#pragma unroll
          for (int g = 0; g < G; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) s[g] += q_s[g * D + d0 + e] * kv[e];
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) p_s[g * kDecodeChunk + tid] = tid < n ? s[g] : -INFINITY;
    }
    __syncthreads();
    for (int g = warp; g < G; g += kDecodeChunk / 32) {
      float mx = -INFINITY;
      for (int i = lane; i < kDecodeChunk; i += 32) mx = fmaxf(mx, p_s[g * kDecodeChunk + i]);
      mx = warp_max(mx);
      const float m_old = m_s[g], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int i = lane; i < kDecodeChunk; i += 32) {
        const float sc = p_s[g * kDecodeChunk + i];
        const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
        p_s[g * kDecodeChunk + i] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float corr = exp_diff(m_old, m_new);
        corr_s[g] = corr;
        l_s[g] = l_s[g] * corr + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    if (kl < key_lanes) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float corr = corr_s[g];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      }
      for (int kk = kl; kk < n; kk += key_lanes) {
        float v[8];
        load8(v_cache + kv_row(table, bt, c0 + kk, kvd, kvh * D + cl * 8), v);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float p = p_s[g * kDecodeChunk + kk];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] += p * v[e];
        }
      }
    }
    __syncthreads();
  }

  // Key lanes summed in lane order: a fixed order, whatever the batch.
  if (kl < key_lanes) {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(size_t(kl) * G + g) * D + cl * 8 + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float a = 0.0f;
    for (int l = 0; l < key_lanes; ++l) a += red[(size_t(l) * G + g) * D + d];
    const int h = kvh * G + g;
    if (partitions == 1) {
      const float l = l_s[g];
      out[size_t(t) * qd + size_t(h) * D + d] = from_f32<T>(l > 0.0f ? a / l : 0.0f);
    } else {
      const size_t idx = (size_t(item) * shape.n_heads + h) * partitions + part;
      partials.acc[idx * D + d] = a;
      if (d == 0) partials.max[idx] = m_s[g], partials.sum[idx] = l_s[g];
    }
  }
}

// Combines a decode token's partitions: rescale each partition's numerator
// and sum to the overall maximum, then divide. With one partition it gives
// exactly what the unsplit kernel writes.
template <class T>
__global__ void merge_kernel(StepView step, DecodePartials partials, int partition_tokens,
                             int partitions, AttentionShape shape, T* out) {
  const int item = blockIdx.y, h = blockIdx.x;
  const int t = step.item_start[item];
  if (step.item_start[item + 1] - t != 1) return;
  const int n = (step.context[item] + partition_tokens - 1) / partition_tokens;
  const size_t base = (size_t(item) * shape.n_heads + h) * partitions;
  float m = -INFINITY;
  for (int p = 0; p < n; ++p) m = fmaxf(m, partials.max[base + p]);
  float den = 0.0f;
  for (int p = 0; p < n; ++p) den += exp_diff(partials.max[base + p], m) * partials.sum[base + p];
  const int D = shape.head_dim;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f;
    for (int p = 0; p < n; ++p)
      num += exp_diff(partials.max[base + p], m) * partials.acc[(base + p) * D + d];
    out[size_t(t) * shape.n_heads * D + size_t(h) * D + d] =
        from_f32<T>(den > 0.0f ? num / den : 0.0f);
  }
}

template <class T, int G>
void launch_decode(const StepView& step, int items, const float* q, const void* k_cache,
                   const void* v_cache, const AttentionShape& shape, const DecodeSplit& split,
                   const DecodePartials& partials, void* out, cudaStream_t stream) {
  const int col_chunks = shape.head_dim / 8;
  const DecodeSmem sm{shape.head_dim, G, kDecodeChunk / col_chunks};
  const dim3 grid(split.partitions, shape.n_kv_heads, items);
  decode_kernel<T, G><<<grid, kDecodeChunk, sm.floats() * sizeof(float), stream>>>(
      step, q, static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), shape,
      split.partition_tokens, split.partitions, partials, static_cast<T*>(out));
  check_launch("decode_attention");
  if (!split.merged()) return;
  merge_kernel<T><<<dim3(shape.n_heads, items), 128, 0, stream>>>(
      step, partials, split.partition_tokens, split.partitions, shape, static_cast<T*>(out));
  check_launch("decode_attention merge");
}

// ---- prefill ---------------------------------------------------------------

constexpr int kPrefillWarps = 8;
constexpr int kRowsPerWarp = 8;
constexpr int kPrefillRows = kPrefillWarps * kRowsPerWarp;  // (query token, head) rows
constexpr int kKeyTile = 32;

size_t prefill_smem_bytes(int head_dim) {
  return sizeof(float) * (size_t(kPrefillRows) * head_dim + size_t(kKeyTile) * (head_dim + 1) +
                          size_t(kKeyTile) * head_dim);
}

// One block per (query tile, KV head, item): the tile's tokens x the group's
// query heads are 64 rows, 8 per warp. Keys and values are staged 32 at a
// time in shared memory (keys padded by one float per row so that lanes
// reading different keys hit different banks); each lane scores one key for
// a row, and each lane owns head_dim / 32 output columns.
template <class T, int MAXD>
__global__ void __launch_bounds__(kPrefillWarps * 32)
    prefill_kernel(StepView step, const float* q, const T* k_cache, const T* v_cache,
                   AttentionShape shape, T* out) {
  extern __shared__ float smem[];
  const int item = blockIdx.z, kvh = blockIdx.y, tile = blockIdx.x;
  const int start = step.item_start[item];
  const int n_tok = step.item_start[item + 1] - start;
  if (n_tok < 2) return;  // decode items: decode_attention
  const int G = shape.n_heads / shape.n_kv_heads;
  const int tile_cap = kPrefillRows / G;
  const int j0 = tile * tile_cap;
  if (j0 >= n_tok) return;
  const int tile_tokens = min(tile_cap, n_tok - j0);
  const int rows = tile_tokens * G;
  const int D = shape.head_dim, bt = shape.block_tokens;
  const int kvd = shape.n_kv_heads * D, qd = shape.n_heads * D;
  float* q_s = smem;
  float* k_s = q_s + kPrefillRows * D;
  float* v_s = k_s + kKeyTile * (D + 1);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int i = tid; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    const int tok = start + j0 + r / G, h = kvh * G + r % G;
    q_s[i] = q[size_t(tok) * qd + size_t(h) * D + d] * shape.scale;
  }
  const int* table = step.block_tables + size_t(item) * step.blocks_per_seq;
  const int last_pos = step.positions[start + j0 + tile_tokens - 1];

  constexpr int kCols = MAXD / 32;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kCols];
  int pos[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    pos[i] = r < rows ? step.positions[start + j0 + r / G] : -1;
    m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kCols; ++e) acc[i][e] = 0.0f;
  }

  for (int k0 = 0; k0 <= last_pos; k0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (and q_s is written)
    for (int i = tid; i < kKeyTile * D; i += blockDim.x) {
      const int kk = i / D, d = i % D, k = k0 + kk;
      float kv = 0.0f, vv = 0.0f;
      if (k <= last_pos) {
        const size_t row = kv_row(table, bt, k, kvd, kvh * D);
        kv = to_f32(k_cache[row + d]);
        vv = to_f32(v_cache[row + d]);
      }
      k_s[kk * (D + 1) + d] = kv;
      v_s[kk * D + d] = vv;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (pos[i] < 0) continue;  // the same for the whole warp
      const int r = warp * kRowsPerWarp + i;
      const int k = k0 + lane;
      float s = -INFINITY;
      if (k <= pos[i]) {
        s = 0.0f;
        for (int d = 0; d < D; ++d) s += q_s[r * D + d] * k_s[lane * (D + 1) + d];
      }
      const float m_new = fmaxf(m[i], warp_max(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float corr = exp_diff(m[i], m_new);
      l[i] = l[i] * corr + warp_sum(p);
      m[i] = m_new;
#pragma unroll
      for (int e = 0; e < kCols; ++e) acc[i][e] *= corr;
      for (int kk = 0; kk < kKeyTile; ++kk) {
        const float pk = __shfl_sync(0xffffffffu, p, kk);
#pragma unroll
        for (int e = 0; e < kCols; ++e) {
          const int d = lane + 32 * e;
          if (d < D) acc[i][e] += pk * v_s[kk * D + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (pos[i] < 0) continue;
    const int r = warp * kRowsPerWarp + i;
    const int tok = start + j0 + r / G, h = kvh * G + r % G;
#pragma unroll
    for (int e = 0; e < kCols; ++e) {
      const int d = lane + 32 * e;
      if (d < D)
        out[size_t(tok) * qd + size_t(h) * D + d] =
            from_f32<T>(l[i] > 0.0f ? acc[i][e] / l[i] : 0.0f);
    }
  }
}

template <class T, int MAXD>
void launch_prefill(const StepView& step, int items, int max_item_tokens, const float* q,
                    const void* k_cache, const void* v_cache, const AttentionShape& shape,
                    void* out, cudaStream_t stream) {
  const int G = shape.n_heads / shape.n_kv_heads;
  const dim3 grid(ceil_div(max_item_tokens, kPrefillRows / G), shape.n_kv_heads, items);
  prefill_kernel<T, MAXD><<<grid, kPrefillWarps * 32, prefill_smem_bytes(shape.head_dim), stream>>>(
      step, q, static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), shape,
      static_cast<T*>(out));
  check_launch("prefill_attention");
}

void check_shape(const AttentionShape& s) {
  if (s.n_kv_heads < 1 || s.n_heads % s.n_kv_heads != 0 || s.n_heads / s.n_kv_heads > kMaxGroup ||
      s.head_dim % 8 != 0 || s.head_dim > kMaxHeadDim)
    throw std::invalid_argument(
        "CUDA attention needs head_dim a multiple of 8 up to 256 and at most 8 query heads per "
        "KV head (got head_dim " +
        std::to_string(s.head_dim) + ", " + std::to_string(s.n_heads) + " heads, " +
        std::to_string(s.n_kv_heads) + " KV heads)");
}

template <class T, int MAXD>
void allow_prefill_smem() {
  check(cudaFuncSetAttribute(prefill_kernel<T, MAXD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(prefill_smem_bytes(MAXD))),
        "cudaFuncSetAttribute(prefill_attention)");
}

}  // namespace

void decode_attention(const StepView& step, int items, const float* q, const void* k_cache,
                      const void* v_cache, DType cache_type, const AttentionShape& shape,
                      const DecodeSplit& split, const DecodePartials& partials, void* out,
                      cudaStream_t stream) {
  check_shape(shape);
  const int group = shape.n_heads / shape.n_kv_heads;
  dispatch_dtype(cache_type, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto g) {
      launch_decode<T, decltype(g)::value>(step, items, q, k_cache, v_cache, shape, split, partials,
                                           out, stream);
    };
    // Every ratio up to kMaxGroup has its own kernel: models with 3, 6 or 7
    // query heads per KV head exist, and so do tensor shards of them.
    switch (group) {
      case 1:
        run(std::integral_constant<int, 1>{});
        break;
      case 2:
        run(std::integral_constant<int, 2>{});
        break;
      case 3:
        run(std::integral_constant<int, 3>{});
        break;
      case 4:
        run(std::integral_constant<int, 4>{});
        break;
      case 5:
        run(std::integral_constant<int, 5>{});
        break;
      case 6:
        run(std::integral_constant<int, 6>{});
        break;
      case 7:
        run(std::integral_constant<int, 7>{});
        break;
      case 8:
        run(std::integral_constant<int, 8>{});
        break;
      default:
        throw std::invalid_argument(
            "CUDA decode attention supports 1 to 8 query heads per KV "
            "head, not " +
            std::to_string(group));
    }
  });
}

void prefill_attention(const StepView& step, int items, int max_item_tokens, const float* q,
                       const void* k_cache, const void* v_cache, DType cache_type,
                       const AttentionShape& shape, void* out, cudaStream_t stream) {
  check_shape(shape);
  dispatch_dtype(cache_type, [&](auto tag) {
    using T = decltype(tag);
    if (shape.head_dim <= 64)
      launch_prefill<T, 64>(step, items, max_item_tokens, q, k_cache, v_cache, shape, out, stream);
    else if (shape.head_dim <= 128)
      launch_prefill<T, 128>(step, items, max_item_tokens, q, k_cache, v_cache, shape, out, stream);
    else
      launch_prefill<T, 256>(step, items, max_item_tokens, q, k_cache, v_cache, shape, out, stream);
  });
}

void configure_kernels() {
  allow_prefill_smem<float, 64>();
  allow_prefill_smem<float, 128>();
  allow_prefill_smem<float, 256>();
  allow_prefill_smem<__half, 64>();
  allow_prefill_smem<__half, 128>();
  allow_prefill_smem<__half, 256>();
  allow_prefill_smem<__nv_bfloat16, 64>();
  allow_prefill_smem<__nv_bfloat16, 128>();
  allow_prefill_smem<__nv_bfloat16, 256>();
}

}  // namespace troupe::cu
