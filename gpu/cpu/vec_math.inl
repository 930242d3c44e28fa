// exp, softmax, SiLU x up and GELU (tanh form) x up on the lanes of a vector-traits type V, written
// once and compiled per ISA (kernels.cpp with Lanes8, vec_math_avx512.cpp
// with 16 lanes). Include inside an anonymous namespace, after
// <immintrin.h>.
//
// Every lane computes the same value whatever V's width: the same operations
// in the same order, one rounding each (explicit FMAs, nothing for the
// compiler to contract). A softmax sums its exponentials in 8-lane groups in
// order (V::add_groups), then the groups' lanes by hsum8, then the last
// (n % 8) values one by one, so that wide and narrow vectors give the same
// bits and a row's result depends on nothing but the row.
//
// V provides: vec, kLanes, set1, load, store, min, max, add, sub, mul, div,
// fmadd, fnmadd, round (to nearest), pow2 (2^n for integral n),
// reduce_max, add_groups(__m256 acc, vec) -> __m256.

struct Lanes8 {
  using vec = __m256;
  static constexpr int kLanes = 8;
  static vec set1(float v) { return _mm256_set1_ps(v); }
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static vec min(vec a, vec b) { return _mm256_min_ps(a, b); }
  static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec div(vec a, vec b) { return _mm256_div_ps(a, b); }
  static vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static vec fnmadd(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
  static vec round(vec v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static vec pow2(vec n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static float reduce_max(vec v) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    float mx = lanes[0];
    for (int l = 1; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    return mx;
  }
  static __m256 add_groups(__m256 acc, vec v) { return _mm256_add_ps(acc, v); }
};

// The 8 lanes summed in a fixed tree.
inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// e^x (Cephes' expf polynomial, ~1 ulp); inputs are clamped to
// [-87.3, 88.7], so tiny results flush to about 1e-38 instead of 0.
template <class V>
inline typename V::vec exp_lanes(typename V::vec x) {
  x = V::min(V::max(x, V::set1(-87.3f)), V::set1(88.7f));
  const typename V::vec n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  typename V::vec r = V::fnmadd(n, V::set1(0.693359375f), x);
  r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
  typename V::vec y = V::set1(1.9875691500e-4f);
  y = V::fmadd(y, r, V::set1(1.3981999507e-3f));
  y = V::fmadd(y, r, V::set1(8.3334519073e-3f));
  y = V::fmadd(y, r, V::set1(4.1665795894e-2f));
  y = V::fmadd(y, r, V::set1(1.6666665459e-1f));
  y = V::fmadd(y, r, V::set1(5.0000001201e-1f));
  y = V::fmadd(y, V::mul(r, r), V::add(r, V::set1(1.0f)));
  return V::mul(y, V::pow2(n));
}

// One value, as a lane of exp_lanes computes it.
inline float exp_one(float x) {
  alignas(32) float v[8];
  _mm256_store_ps(v, exp_lanes<Lanes8>(_mm256_set1_ps(x)));
  return v[0];
}

template <class V>
void softmax_lanes(float* x, int n) {
  // The maximum is the same in any order (a -0/+0 tie changes no x - max).
  float mx = x[0];
  int k = 0;
  if (n >= V::kLanes) {
    typename V::vec vmax = V::set1(x[0]);
    for (; k + V::kLanes <= n; k += V::kLanes) vmax = V::max(vmax, V::load(x + k));
    mx = V::reduce_max(vmax);
  }
  for (; k < n; ++k) mx = x[k] > mx ? x[k] : mx;
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::vec e = exp_lanes<V>(V::sub(V::load(x + i), V::set1(mx)));
    V::store(x + i, e);
    acc = V::add_groups(acc, e);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_lanes<Lanes8>(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(mx)));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum8(acc);
  for (; i < n; ++i) {
    x[i] = exp_one(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  int j = 0;
  for (; j + V::kLanes <= n; j += V::kLanes) V::store(x + j, V::mul(V::load(x + j), V::set1(inv)));
  for (; j < n; ++j) x[j] *= inv;
}

// out = silu(gate) * up = gate / (1 + e^-gate) * up.
template <class V>
void silu_mul_lanes(const float* gate, const float* up, float* out, int n) {
  int i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::vec g = V::load(gate + i);
    const typename V::vec e = exp_lanes<V>(V::sub(V::set1(0.0f), g));
    V::store(out + i, V::mul(V::div(g, V::add(V::set1(1.0f), e)), V::load(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_one(-g)) * up[i];
  }
}

// out = gelu(gate) * up, GELU's tanh form (Gemma's gelu_pytorch_tanh):
// 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3), which is
// g / (1 + e^(-2u)): SiLU's shape, on exp_lanes.
template <class V>
void gelu_tanh_mul_lanes(const float* gate, const float* up, float* out, int n) {
  constexpr float kMinusTwoC = -2.0f * 0.7978845608028654f, kCubic = 0.044715f;
  int i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::vec g = V::load(gate + i);
    const typename V::vec inner = V::fmadd(V::mul(V::set1(kCubic), g), V::mul(g, g), g);
    const typename V::vec e = exp_lanes<V>(V::mul(V::set1(kMinusTwoC), inner));
    V::store(out + i, V::mul(V::div(g, V::add(V::set1(1.0f), e)), V::load(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    const float inner = __builtin_fmaf(kCubic * g, g * g, g);
    out[i] = g / (1.0f + exp_one(kMinusTwoC * inner)) * up[i];
  }
}
