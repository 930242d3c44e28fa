#include "gpu/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace troupe::kernels {

namespace {
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
// exp on 8 lanes (Cephes' expf polynomial, ~1 ulp); inputs are clamped to
// [-87.3, 88.7], so tiny results flush to about 1e-38 instead of 0.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Four dot products of q with k0..k3 (n values each), sharing q's loads.
inline void dot4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3,
                 int n, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
  }
  // Transpose-add: lane j of the result is the sum of a_j.
  const __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
  const __m256 s = _mm256_hadd_ps(s01, s23);
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  _mm_storeu_ps(out, r);
  for (; i < n; ++i) {
    out[0] = std::fma(q[i], k0[i], out[0]);
    out[1] = std::fma(q[i], k1[i], out[1]);
    out[2] = std::fma(q[i], k2[i], out[2]);
    out[3] = std::fma(q[i], k3[i], out[3]);
  }
}

inline float exp1(float x) {
  alignas(32) float v[8];
  _mm256_store_ps(v, exp8(_mm256_set1_ps(x)));
  return v[0];
}

}  // namespace

float exp_approx(float x) {
  return exp1(x);
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
  float s = hsum(_mm256_add_ps(acc0, acc1));
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
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) {
    x[i] = exp1(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int j = 0; j < n; ++j) x[j] *= inv;
}

void silu_mul(const float* gate, const float* up, float* out, int n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(
        out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp1(-g)) * up[i];
  }
}

namespace {
template <int CHUNKS>
void accumulate_values(const float* scores, const PagedKv& kv, size_t off, int n, float* out) {
  __m256 acc[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) acc[c] = _mm256_setzero_ps();
  for (int j0 = 0, b = 0; j0 < n; j0 += kv.block_tokens, ++b) {
    const float* row = kv.values + size_t(kv.blocks[b]) * kv.block_stride + off;
    const int end = std::min(n - j0, kv.block_tokens);
    for (int o = 0; o < end; ++o, row += kv.row_stride) {
      const __m256 w = _mm256_set1_ps(scores[j0 + o]);
#pragma GCC unroll 8
      for (int c = 0; c < CHUNKS; ++c)
        acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * c), acc[c]);
    }
  }
  for (int c = 0; c < CHUNKS; ++c) _mm256_storeu_ps(out + 8 * c, acc[c]);
}
}  // namespace

void attend_head(const float* q, int hd, float scale, const PagedKv& kv, size_t head_off, int n,
                 float* scores, float* out) {
  for (int j0 = 0, b = 0; j0 < n; j0 += kv.block_tokens, ++b) {
    const float* row = kv.keys + size_t(kv.blocks[b]) * kv.block_stride + head_off;
    const int end = std::min(n - j0, kv.block_tokens);
    int o = 0;
    // Keys in fours within a block; which keys share a group depends only on
    // the position, so a query's scores never depend on the batch.
    for (; o + 4 <= end; o += 4, row += 4 * kv.row_stride) {
      float d[4];
      dot4(q, row, row + kv.row_stride, row + 2 * kv.row_stride, row + 3 * kv.row_stride, hd, d);
      for (int u = 0; u < 4; ++u) scores[j0 + o + u] = d[u] * scale;
    }
    for (; o < end; ++o, row += kv.row_stride) scores[j0 + o] = dot(q, row, hd) * scale;
  }
  softmax(scores, n);
  // Register-blocked over 32 then 8 values of the head; every element is the
  // same FMA chain over positions whatever the blocking.
  int d = 0;
  for (; d + 32 <= hd; d += 32) accumulate_values<4>(scores, kv, head_off + size_t(d), n, out + d);
  for (; d + 8 <= hd; d += 8) accumulate_values<1>(scores, kv, head_off + size_t(d), n, out + d);
  for (; d < hd; ++d) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float* row = kv.values + size_t(kv.blocks[j / kv.block_tokens]) * kv.block_stride +
                         size_t(j % kv.block_tokens) * kv.row_stride + head_off;
      acc = std::fma(scores[j], row[d], acc);
    }
    out[d] = acc;
  }
}

RopeTable::RopeTable(int max_pos, int head_dim, float theta) : half_(head_dim / 2) {
  cos_.resize(size_t(max_pos) * size_t(half_));
  sin_.resize(cos_.size());
  for (int pos = 0; pos < max_pos; ++pos) {
    for (int i = 0; i < half_; ++i) {
      const float freq = 1.0f / std::pow(theta, float(2 * i) / float(head_dim));
      const float val = float(pos) * freq;
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
