#include "gpu/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "gpu/cpu/gemm.h"

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
  // The maximum is the same in any order (a -0/+0 tie changes no x - max).
  __m256 vmax = _mm256_set1_ps(x[0]);
  int k = 0;
  for (; k + 8 <= n; k += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + k));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (int l = 1; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  for (; k < n; ++k) mx = x[k] > mx ? x[k] : mx;
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
  const __m256 vinv = _mm256_set1_ps(inv);
  int j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), vinv));
  for (; j < n; ++j) x[j] *= inv;
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
detail::TileFns tile_fns() {
  return active_isa() >= Isa::Avx512 ? detail::attention_avx512() : detail::attention_avx2();
}
}  // namespace

void attend_tile(const HeadTile& tile, int hd, float scale, const PagedKv& kv, size_t head_off,
                 float* scratch) {
  const detail::TileFns fns = tile_fns();
  fns.scores(tile, hd, scale, kv, head_off, scratch);
  for (int i = 0; i < tile.count; ++i) softmax(tile.scores[i], tile.n[i]);
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
