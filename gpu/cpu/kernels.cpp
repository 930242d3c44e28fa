#include "gpu/cpu/kernels.h"

#include <immintrin.h>

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
}  // namespace

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

void scale(float alpha, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] *= alpha;
}

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  const float ss = dot(x, x, n) / float(n) + eps;
  const float inv = 1.0f / std::sqrt(ss);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (inv * x[i]);
}

void softmax(float* x, int n) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void silu_mul(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
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

void rope(float* v, int n_heads, int head_dim, int pos, const RopeTable& table,
          RopeLayout layout) {
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
