#include "gpu/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "gpu/cpu/gemm.h"
#include "gpu/cpu/vec_math_types.h"

namespace troupe::kernels {

namespace {

#include "gpu/cpu/vec_math.inl"

// The row kernels for the active ISA: the same values on every one.
detail::RowFns row_fns() {
  if (active_isa() >= Isa::Avx512) return detail::row_fns_avx512();
  return {&softmax_lanes<Lanes8>, &silu_mul_lanes<Lanes8>, &gelu_tanh_mul_lanes<Lanes8>};
}

}  // namespace

float exp_approx(float x) {
  return exp_one(x);
}

float dot(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum8(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

void axpy(float alpha, const float* x, float* y, int n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(alpha, x[i], y[i]);
}

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  const float ss = dot(x, x, n) / float(n) + eps;
  const float inv = 1.0f / std::sqrt(ss);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (inv * x[i]);
}

void softmax(float* x, int n) {
  row_fns().softmax(x, n);
}

void silu_mul(const float* gate, const float* up, float* out, int n) {
  row_fns().silu_mul(gate, up, out, n);
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int n) {
  row_fns().gelu_tanh_mul(gate, up, out, n);
}

namespace {
detail::TileFns tile_fns(KvType type) {
  return active_isa() >= Isa::Avx512 ? detail::attention_avx512(type)
                                     : detail::attention_avx2(type);
}
}  // namespace

void attend_tile(const HeadTile& tile, int hd, float scale, const PagedKv& kv, size_t head_off,
                 float* scratch) {
  const detail::TileFns fns = tile_fns(kv.type);
  fns.scores(tile, hd, scale, kv, head_off, scratch);
  for (int i = 0; i < tile.count; ++i) {
    // Positions before a sliding window's start weigh exactly 0: each
    // value element's chain over them adds 0 * v, which changes nothing.
    const int from = tile.from[i];
    softmax(tile.scores[i] + from, tile.n[i] - from);
    std::fill(tile.scores[i], tile.scores[i] + from, 0.0f);
  }
  fns.values(tile, hd, kv, head_off);
}

void attend_head(const float* q, int hd, float scale, const PagedKv& kv, size_t head_off, int n,
                 float* scores, float* out) {
  HeadTile tile;
  tile.count = 1;
  tile.q[0] = q;
  tile.n[0] = n;
  tile.scores[0] = scores;
  tile.out[0] = out;
  attend_tile(tile, hd, scale, kv, head_off, nullptr);
}

RopeTable::RopeTable(int max_pos, int head_dim, float theta, const RopeScaling& scaling)
    : half_(head_dim / 2) {
  cos_.resize(size_t(max_pos) * size_t(half_));
  sin_.resize(cos_.size());
  const std::vector<float> freq = rope_frequencies(head_dim, theta, scaling);
  for (int pos = 0; pos < max_pos; ++pos) {
    for (int i = 0; i < half_; ++i) {
      const float val = float(pos) * freq[size_t(i)];
      cos_[size_t(pos) * size_t(half_) + size_t(i)] = std::cos(val);
      sin_[size_t(pos) * size_t(half_) + size_t(i)] = std::sin(val);
    }
  }
}

void rope(float* v, int n_heads, int head_dim, int pos, const RopeTable& table, RopeLayout layout) {
  const float* c = table.cos(pos);
  const float* s = table.sin(pos);
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* x = v + size_t(h) * size_t(head_dim);
    for (int i = 0; i < half; ++i) {
      // Interleaved pairs (2i, 2i+1) or halves (i, i + half): same rotation.
      const int a = layout == RopeLayout::Interleaved ? 2 * i : i;
      const int b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half;
      const float x0 = x[a], x1 = x[b];
      x[a] = x0 * c[i] - x1 * s[i];
      x[b] = x0 * s[i] + x1 * c[i];
    }
  }
}

}  // namespace troupe::kernels
