// Row-wise kernels: embedding, residual add + RMSNorm, RoPE with the KV
// write, SiLU x up, a stage's last residual add, and the rank-ordered sum
// behind NCCL's exact all-reduce.
// One block per token row; each row's reduction has a fixed order, so a
// token's result never depends on the other rows of the step.
#include <algorithm>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/device_common.cuh"
#include "gpu/cuda/kernels.h"

namespace troupe::cu {

namespace {

constexpr int kRowThreads = 256;

template <class T>
__global__ void embed_kernel(const T* table, const int* ids, int dim, float* x) {
  const int t = blockIdx.x;
  const T* row = table + size_t(ids[t]) * size_t(dim);
  float* out = x + size_t(t) * size_t(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[i] = to_f32(row[i]);
}

// Sum over the block in a fixed tree: warp shuffles, then warp 0 over the
// warps' partial sums.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : 0.0f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  const float total = scratch[0];
  __syncthreads();
  return total;
}

template <class T>
__global__ void add_rmsnorm_kernel(float* x, const float* delta, const float* w, const int* row_map,
                                   T* out, int dim, float eps) {
  __shared__ float scratch[32];
  const int r = blockIdx.x;
  const int s = row_map ? row_map[r] : r;
  float* xr = x + size_t(s) * size_t(dim);
  const float* dr = delta ? delta + size_t(s) * size_t(dim) : nullptr;
  float ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (dr) v += dr[i];
    if (dr && !row_map) xr[i] = v;
    ss += v * v;
  }
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / float(dim) + eps);
  T* o = out + size_t(r) * size_t(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (dr && row_map) v += dr[i];
    o[i] = from_f32<T>(w[i] * (inv * v));
  }
}

template <class T>
__global__ void rope_kv_kernel(const float* qkv, const int* positions, const int* slots,
                               const float* cos_sin, int max_pos, AttentionShape shape,
                               RopeLayout layout, float* q, T* k_cache, T* v_cache) {
  const int t = blockIdx.x;
  const int hd = shape.head_dim, half = hd / 2;
  const int qd = shape.n_heads * hd, kvd = shape.n_kv_heads * hd;
  const float* row = qkv + size_t(t) * size_t(qd + 2 * kvd);
  const int pos = positions[t];
  const int slot = slots[t];
  const float* cs = cos_sin + size_t(pos) * size_t(half);
  const float* sn = cos_sin + size_t(max_pos) * size_t(half) + size_t(pos) * size_t(half);
  // Pairs of the query heads, then of the key heads: the same rotation the
  // CPU's kernels::rope applies.
  const int pairs = (shape.n_heads + shape.n_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half, i = p % half;
    const int a = layout == RopeLayout::Interleaved ? 2 * i : i;
    const int b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half;
    const float* src = row + size_t(head) * size_t(hd);
    const float x0 = src[a], x1 = src[b];
    const float c = cs[i], s = sn[i];
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    if (head < shape.n_heads) {
      float* dst = q + size_t(t) * size_t(qd) + size_t(head) * size_t(hd);
      dst[a] = y0, dst[b] = y1;
    } else if (slot >= 0) {
      T* dst = k_cache + size_t(slot) * size_t(kvd) + size_t(head - shape.n_heads) * size_t(hd);
      dst[a] = from_f32<T>(y0), dst[b] = from_f32<T>(y1);
    }
  }
  if (slot < 0) return;
  for (int i = threadIdx.x; i < kvd; i += blockDim.x)
    v_cache[size_t(slot) * size_t(kvd) + size_t(i)] = from_f32<T>(row[qd + kvd + i]);
}

template <class T>
__global__ void silu_mul_kernel(const float* gate_up, int hidden, T* out) {
  const int r = blockIdx.x;
  const float* g = gate_up + size_t(r) * size_t(2 * hidden);
  const float* u = g + hidden;
  T* o = out + size_t(r) * size_t(hidden);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float gv = g[i];
    o[i] = from_f32<T>(gv / (1.0f + expf(-gv)) * u[i]);
  }
}

__global__ void sum_ranks_kernel(const float* gathered, int ranks, size_t n, float* out) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float s = gathered[i];
    for (int r = 1; r < ranks; ++r) s += gathered[size_t(r) * n + i];
    out[i] = s;
  }
}

__global__ void add_into_kernel(float* x, const float* delta, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] += delta[i];
}

// Grid-stride launches: enough blocks for n, at most 4096.
int stride_blocks(size_t n) {
  return std::max(1, int(std::min<size_t>((n + 255) / 256, 4096)));
}

}  // namespace

void embed_tokens(const void* table, DType dtype, const int* token_ids, int tokens, int dim,
                  float* x, cudaStream_t stream) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    embed_kernel<T>
        <<<tokens, kRowThreads, 0, stream>>>(static_cast<const T*>(table), token_ids, dim, x);
  });
  check_launch("embed_tokens");
}

void add_rmsnorm(float* x, const float* delta, const float* w, const int* row_map, void* out,
                 DType out_type, int rows, int dim, float eps, cudaStream_t stream) {
  dispatch_dtype(out_type, [&](auto tag) {
    using T = decltype(tag);
    add_rmsnorm_kernel<T>
        <<<rows, kRowThreads, 0, stream>>>(x, delta, w, row_map, static_cast<T*>(out), dim, eps);
  });
  check_launch("add_rmsnorm");
}

void rope_write_kv(const float* qkv, const StepView& step, int tokens, const float* cos_sin,
                   int max_pos, const AttentionShape& shape, RopeLayout layout, float* q,
                   void* k_cache, void* v_cache, DType cache_type, cudaStream_t stream) {
  dispatch_dtype(cache_type, [&](auto tag) {
    using T = decltype(tag);
    rope_kv_kernel<T><<<tokens, kRowThreads, 0, stream>>>(
        qkv, step.positions, step.slots, cos_sin, max_pos, shape, layout, q,
        static_cast<T*>(k_cache), static_cast<T*>(v_cache));
  });
  check_launch("rope_write_kv");
}

void silu_mul(const float* gate_up, int rows, int hidden, void* out, DType out_type,
              cudaStream_t stream) {
  dispatch_dtype(out_type, [&](auto tag) {
    using T = decltype(tag);
    silu_mul_kernel<T><<<rows, kRowThreads, 0, stream>>>(gate_up, hidden, static_cast<T*>(out));
  });
  check_launch("silu_mul");
}

void add_into(float* x, const float* delta, size_t n, cudaStream_t stream) {
  add_into_kernel<<<stride_blocks(n), 256, 0, stream>>>(x, delta, n);
  check_launch("add_into");
}

void sum_ranks(const float* gathered, int ranks, size_t n, float* out, cudaStream_t stream) {
  sum_ranks_kernel<<<stride_blocks(n), 256, 0, stream>>>(gathered, ranks, n, out);
  check_launch("sum_ranks");
}

}  // namespace troupe::cu
