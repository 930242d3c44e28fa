// Sampling on the device, so that only token ids cross to the host. The one
// file that includes cub (nvcc is slow on it).
//
// It reproduces troupe::Sampler (gpu/sampler.h) given the same coin: the
// weights are the same IEEE operations (explicit _rn intrinsics, no
// contraction), so bit-identical; the top-k and top-p sets are found by
// radix selection on exact keys (logit, then lower id), so identical; only
// the f64 sums (kept mass, running sum of the walk, top-p's prefix) are
// added in another order. Each such sum is within (n-1) ulp-units of the
// exact one for any order, so when the coin (or top-p's threshold) is
// farther than that bound from the boundary between two ids, the CPU's
// answer is provably the same; otherwise the row is flagged and the host
// samples it with the CPU sampler itself. Flags happen about once in 1e10
// draws.
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/device_common.cuh"
#include "gpu/cuda/kernels.h"

namespace troupe::cu {

namespace {

constexpr int kThreads = 512;

// The CPU sampler's constants (gpu/sampler.cpp), the same float literals.
constexpr float kLn2 = 0.693147180559945f;
__constant__ float kPoly[8] = {2.80597929e-4f, 1.96418550e-3f, 1.17851130e-2f, 5.89255651e-2f,
                               2.35702260e-1f, 7.07106781e-1f, 1.41421356f,    1.41421356f};

// 2^((l - max) * scale): exp2_nonpositive of gpu/sampler.cpp, operation for
// operation.
__device__ float weight_of(float l, float max, float scale) {
  float y = __fmul_rn(__fsub_rn(l, max), scale);
  y = y > -127.0f ? y : -127.0f;  // NaN fails the test and becomes -127 too
  const float k = floorf(y);
  const float u = __fmul_rn(__fsub_rn(__fsub_rn(y, k), 0.5f), kLn2);
  float p = kPoly[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) p = __fmaf_rn(p, u, kPoly[i]);
  return __fmul_rn(p, __uint_as_float(uint32_t(int32_t(k) + 127) << 23));
}

// The sampler's order "higher logit, then lower id" as one integer: larger
// key, better candidate. 0 for ids that are never candidates (NaN, inf).
__device__ uint64_t key_of(float v, int id) {
  if (!isfinite(v)) return 0;
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(b) << 32) | uint64_t(0xffffffffu - uint32_t(id));
}

struct Shared {
  union {
    cub::BlockReduce<float, kThreads>::TempStorage f;
    cub::BlockReduce<double, kThreads>::TempStorage d;
    cub::BlockReduce<int, kThreads>::TempStorage i;
    cub::BlockScan<double, kThreads>::TempStorage scan;
  } cub;
  int count[256];
  double mass[256];
  uint64_t prefix;
  double above, at;
  int done;
  int found;
  double before, after;
  float value;
};

struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};

// Each thread owns one contiguous range of ids: the walk needs id order.
struct Range {
  int begin, end;
  __device__ Range(int vocab) {
    const int per = (vocab + kThreads - 1) / kThreads;
    begin = min(vocab, int(threadIdx.x) * per);
    end = min(vocab, begin + per);
  }
};

__device__ int block_min(Shared& sh, int v) {
  const int r = cub::BlockReduce<int, kThreads>(sh.cub.i).Reduce(v, MinOp{});
  if (threadIdx.x == 0) sh.found = r;
  __syncthreads();
  const int out = sh.found;
  __syncthreads();
  return out;
}

__device__ double block_sum(Shared& sh, double v) {
  const double r = cub::BlockReduce<double, kThreads>(sh.cub.d).Sum(v);
  if (threadIdx.x == 0) sh.at = r;
  __syncthreads();
  const double out = sh.at;
  __syncthreads();
  return out;
}

// The lowest id whose logit equals `target`; INT_MAX when none does.
__device__ int first_equal(Shared& sh, const float* x, Range r, float target) {
  int first = INT_MAX;
  for (int i = r.begin; i < r.end; ++i)
    if (x[i] == target) {
      first = i;
      break;
    }
  return block_min(sh, first);
}

// The key of the k-th best candidate: exactly k keys are >= it. 1 (every
// candidate) when there are fewer than k.
__device__ uint64_t kth_best_key(Shared& sh, const float* x, Range r, int k) {
  uint64_t prefix = 0;
  int remaining = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const uint64_t high = shift == 56 ? 0 : ~((uint64_t(1) << (shift + 8)) - 1);
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.count[d] = 0;
    __syncthreads();
    for (int i = r.begin; i < r.end; ++i) {
      const uint64_t key = key_of(x[i], i);
      if (key != 0 && (key & high) == prefix) atomicAdd(&sh.count[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, d = 255;
      for (; d >= 0 && cum + sh.count[d] < remaining; --d) cum += sh.count[d];
      sh.done = d < 0;
      if (d >= 0) sh.prefix = prefix | (uint64_t(d) << shift), remaining -= cum;
    }
    __syncthreads();
    if (sh.done) return 1;
    prefix = sh.prefix;  // `remaining` matters to thread 0 alone, which keeps it
    __syncthreads();
  }
  return prefix;
}

// The largest key t >= lo whose candidates at or above it weigh at least
// `need`; above = their weight without t's own, at = t's weight. Returns 0
// when even all of them fall short (f64 rounding).
__device__ uint64_t top_p_key(Shared& sh, const float* x, Range r, uint64_t lo, double need,
                              float max, float scale, double& above, double& at) {
  uint64_t prefix = 0;
  double acc = 0;
  lo = lo > 1 ? lo : 1;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const uint64_t high = shift == 56 ? 0 : ~((uint64_t(1) << (shift + 8)) - 1);
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.mass[d] = 0;
    __syncthreads();
    for (int i = r.begin; i < r.end; ++i) {
      const uint64_t key = key_of(x[i], i);
      if (key >= lo && (key & high) == prefix)
        atomicAdd(&sh.mass[(key >> shift) & 255], double(weight_of(x[i], max, scale)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      for (; d >= 0 && acc + sh.mass[d] < need; --d) acc += sh.mass[d];
      sh.done = d < 0;
      if (d >= 0) sh.prefix = prefix | (uint64_t(d) << shift), sh.at = sh.mass[d];
      sh.above = acc;
    }
    __syncthreads();
    if (sh.done) return 0;
    prefix = sh.prefix;
    acc = sh.above;
    at = sh.at;
    __syncthreads();
  }
  above = acc;
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int vocab, StepView step, int* sampled, int* flags) {
  __shared__ Shared sh;
  const int row = blockIdx.x;
  if (row >= step.counts[StepLayout::kRows]) return;
  const float* x = logits + size_t(row) * size_t(vocab);
  const Range range(vocab);
  auto finish = [&](int id, bool unsure) {
    if (threadIdx.x == 0) {
      sampled[row] = unsure || id == INT_MAX ? -1 : id;
      flags[row] = unsure || id == INT_MAX ? 1 : 0;
    }
  };

  float m = -INFINITY;  // the largest non-NaN logit, as max_value() finds it
  for (int i = range.begin; i < range.end; ++i) m = x[i] > m ? x[i] : m;
  m = cub::BlockReduce<float, kThreads>(sh.cub.f).Reduce(m, MaxOp{});
  if (threadIdx.x == 0) sh.value = m;
  __syncthreads();
  m = sh.value;
  __syncthreads();

  const float temperature = step.temperature[row];
  const float scale = float(1.4426950408889634 / double(temperature));
  // Greedy, all masked, +inf, or a temperature so small it is greedy: the
  // lowest id holding the maximum (all NaN: none, and the host decides).
  if (!(temperature > 0) || m == INFINITY || m == -INFINITY || !isfinite(scale))
    return finish(first_equal(sh, x, range, m), false);

  const int top_k = step.top_k[row];
  const float top_p = step.top_p[row];
  const bool use_k = top_k > 0 && top_k < vocab, use_p = top_p < 1.0f;
  // Both implementations' f64 sums of at most `vocab` weights lie within
  // (vocab - 1) units of 2^-53 of the exact sum, relative to the total; a
  // margin of twice that (and a little for the products) is safe.
  const double margin = (4.0 * double(vocab) + 8.0) * 0x1p-53;
  bool unsure = false;

  uint64_t kept = 0;  // ids with key >= kept take part; 0: every id
  if (use_k) kept = kth_best_key(sh, x, range, top_k);
  if (use_p) {
    double local = 0;
    for (int i = range.begin; i < range.end; ++i)
      if (key_of(x[i], i) >= kept) local += weight_of(x[i], m, scale);
    const double mass = block_sum(sh, local);
    const double need = double(top_p) * mass;
    double above = 0, at = 0;
    const uint64_t key = top_p_key(sh, x, range, kept, need, m, scale, above, at);
    if (key == 0 || !(need - above > margin * mass && above + at - need > margin * mass))
      unsure = true;
    kept = key == 0 ? kept : key;
  }

  // The walk: ascending ids, running weight against coin * kept weight.
  double local = 0;
  for (int i = range.begin; i < range.end; ++i)
    if (key_of(x[i], i) >= kept) local += weight_of(x[i], m, scale);
  const double total = block_sum(sh, local);
  double base = 0;
  cub::BlockScan<double, kThreads>(sh.cub.scan).ExclusiveSum(local, base);
  __syncthreads();
  const double r = step.coin[row] * total;
  int found = INT_MAX;
  double before = 0, after = 0;
  double acc = base;
  for (int i = range.begin; i < range.end; ++i) {
    if (key_of(x[i], i) < kept) continue;
    const float w = weight_of(x[i], m, scale);
    if (w == 0) continue;
    before = acc;
    acc += w;
    if (r < acc) {
      found = i;
      after = acc;
      break;
    }
  }
  const int id = block_min(sh, found);
  if (found == id && id != INT_MAX) sh.before = before, sh.after = after;
  __syncthreads();
  if (id == INT_MAX || !(r - sh.before > margin * total && sh.after - r > margin * total))
    unsure = true;
  finish(id, unsure);
}

}  // namespace

void sample_rows(const float* logits, int rows, int vocab, const StepView& step, int* sampled,
                 int* flags, cudaStream_t stream) {
  if (rows < 1) return;
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, step, sampled, flags);
  check_launch("sample_rows");
}

}  // namespace troupe::cu
