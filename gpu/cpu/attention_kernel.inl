// Attention over a paged KV cache for a tile of query heads that share one
// kv head, written once over a vector-traits type V and compiled per ISA
// (attention_avx2.cpp, attention_avx512.cpp). Include inside an anonymous
// namespace, after <immintrin.h> and attention_types.h.
//
// Every value is computed with 8-lane arithmetic in one fixed order, whatever
// the ISA, the tile's size or its other queries, so a query's output is the
// same bit for bit in decode, in a prompt chunk and on any machine:
// - a score q . k is an 8-lane FMA chain over the head, reduced as
//   ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the head's last
//   (head_dim % 8) values in order; except that within a cache block the last
//   (positions % 4) keys a query sees are reduced as kernels::dot reduces;
// - an output element is one FMA chain over positions 0..n-1.
// Keys and values are read as T: float, or the 16-bit F16Bits/Bf16Bits
// widened exactly on load, so a 16-bit cache gives the values an f32 cache
// holding the same (rounded) numbers would.
// A V vector holds V::kQueries groups of 8 lanes. Scores put one query in
// each group (so wide vectors score several queries against one key);
// values put consecutive head elements of one query in them.
//
// V provides: vec, kQueries, kLanes (= 8 * kQueries), zero(), load(const
// T*), bcast8(const T*) (8 values into every group), set1(float),
// fma(a, b, c), store(float*, vec), reduce_keys4(const vec acc[4], float*
// out): query p's accumulators against keys u = 0..3 reduced in reduce4's
// order, into out[4p + u]; store_keys4(acc, scale, float* const* dst): the
// same sums times scale, query p's four at dst[p].

inline int min_int(int a, int b) {
  return a < b ? a : b;
}

// The reduction of four 8-lane accumulators, lane u of the result from a_u.
inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
  const __m256 s = _mm256_hadd_ps(s01, s23);
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
inline void reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float* out) {
  _mm_storeu_ps(out, reduce4(a0, a1, a2, a3));
}

// Eight cache values widened to f32, and one.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const F16Bits* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const Bf16Bits* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float elem(const float* p, int i) {
  return p[i];
}
inline float elem(const F16Bits* p, int i) {
  return _cvtsh_ss(p[i].bits);
}
inline float elem(const Bf16Bits* p, int i) {
  const unsigned bits = unsigned(p[i].bits) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// One query against keys k0..k3.
template <class T>
void dot4(const float* q, const T* k0, const T* k1, const T* k2, const T* k3, int n, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, load8(k0 + i), a0);
    a1 = _mm256_fmadd_ps(qv, load8(k1 + i), a1);
    a2 = _mm256_fmadd_ps(qv, load8(k2 + i), a2);
    a3 = _mm256_fmadd_ps(qv, load8(k3 + i), a3);
  }
  reduce4(a0, a1, a2, a3, out);
  for (; i < n; ++i) {
    out[0] = __builtin_fmaf(q[i], elem(k0, i), out[0]);
    out[1] = __builtin_fmaf(q[i], elem(k1, i), out[1]);
    out[2] = __builtin_fmaf(q[i], elem(k2, i), out[2]);
    out[3] = __builtin_fmaf(q[i], elem(k3, i), out[3]);
  }
}

// One query against one key in kernels::dot's order: two accumulators over
// 16 values, one over a last 8, their sum reduced as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the tail.
template <class T>
float dot1(const float* q, const T* k, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), a0);
  const __m256 a = _mm256_add_ps(a0, a1);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  float s = _mm_cvtss_f32(lo);
  for (; i < n; ++i) s = __builtin_fmaf(q[i], elem(k, i), s);
  return s;
}

template <class T>
const T* key_row(const PagedKv& kv, int block, size_t head_off) {
  return static_cast<const T*>(kv.keys) + size_t(kv.blocks[block]) * kv.block_stride + head_off;
}
template <class T>
const T* value_row(const PagedKv& kv, int block, size_t head_off) {
  return static_cast<const T*>(kv.values) + size_t(kv.blocks[block]) * kv.block_stride + head_off;
}
// Position j's value row.
template <class T>
const T* value_at(const PagedKv& kv, int j, size_t head_off) {
  return value_row<T>(kv, j / kv.block_tokens, head_off) +
         size_t(j % kv.block_tokens) * kv.row_stride;
}

// Keys [o, end) of one block for one query: fours, then the remainder.
template <class T>
void score_keys(const float* q, int hd, float scale, const T* row, size_t rs, int o, int end,
                float* scores) {
  for (; o + 4 <= (end & ~3); o += 4) {
    float d[4];
    const T* k = row + size_t(o) * rs;
    dot4(q, k, k + rs, k + 2 * rs, k + 3 * rs, hd, d);
    for (int u = 0; u < 4; ++u) scores[o + u] = d[u] * scale;
  }
  for (; o < end; ++o) scores[o] = dot1(q, row + size_t(o) * rs, hd) * scale;
}

// G vectors of V::kQueries queries each (q[0..G*kQueries), padded by the
// caller) against the keys, four at a time where every query sees all four.
template <class V, int G, class T>
void scores_group(const float* const* q, const int* n, float* const* scores, int hd, float scale,
                  const PagedKv& kv, size_t head_off, float* qpack) {
  constexpr int P = V::kQueries, Q = G * P, L = V::kLanes;
  const int chunks = hd / 8;
  // Query g * P + p's chunk c is lanes [8p, 8p + 8) of vector (g, c).
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < chunks; ++c)
      for (int p = 0; p < P; ++p)
        for (int l = 0; l < 8; ++l)
          qpack[(size_t(g) * chunks + c) * L + size_t(p) * 8 + l] = q[g * P + p][c * 8 + l];
  int n_max = 0;
  for (int i = 0; i < Q; ++i) n_max = n[i] > n_max ? n[i] : n_max;
  const size_t rs = kv.row_stride;
  for (int j0 = 0, b = 0; j0 < n_max; j0 += kv.block_tokens, ++b) {
    const T* row = key_row<T>(kv, b, head_off);
    int end[Q], shared = kv.block_tokens;
    for (int i = 0; i < Q; ++i) {
      end[i] = n[i] - j0 < kv.block_tokens ? n[i] - j0 : kv.block_tokens;
      if (end[i] < 0) end[i] = 0;
      shared = min_int(shared, end[i] & ~3);
    }
    int o = 0;
    for (; o + 4 <= shared; o += 4) {
      const T* k[4];
      for (int u = 0; u < 4; ++u) k[u] = row + size_t(o + u) * rs;
      typename V::vec acc[G][4];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[g][u] = V::zero();
      for (int c = 0; c < chunks; ++c) {
        typename V::vec kb[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) kb[u] = V::bcast8(k[u] + c * 8);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const typename V::vec qv = V::load(qpack + (size_t(g) * chunks + c) * L);
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) acc[g][u] = V::fma(qv, kb[u], acc[g][u]);
        }
      }
      // Unrolled, so that acc stays in registers (an indexed acc[g] would be
      // kept in memory for the whole loop above).
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        float* dst[P];
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) dst[p] = scores[g * P + p] + j0 + o;
        if (chunks * 8 == hd) {
          V::store_keys4(acc[g], scale, dst);
          continue;
        }
        float d[P][4];
        V::reduce_keys4(acc[g], d[0]);
        for (int p = 0; p < P; ++p) {
          for (int e = chunks * 8; e < hd; ++e)
            for (int u = 0; u < 4; ++u)
              d[p][u] = __builtin_fmaf(q[g * P + p][e], elem(k[u], e), d[p][u]);
          for (int u = 0; u < 4; ++u) dst[p][u] = d[p][u] * scale;
        }
      }
    }
    for (int i = 0; i < Q; ++i)
      if (end[i] > o) score_keys(q[i], hd, scale, row, rs, o, end[i], scores[i] + j0);
  }
}

template <class V, int G, class T>
void scores_tile(const HeadTile& t, int hd, float scale, const PagedKv& kv, size_t head_off,
                 float* qpack) {
  if (t.count == 1) {
    for (int j0 = 0, b = 0; j0 < t.n[0]; j0 += kv.block_tokens, ++b)
      score_keys(t.q[0], hd, scale, key_row<T>(kv, b, head_off), kv.row_stride, 0,
                 min_int(t.n[0] - j0, kv.block_tokens), t.scores[0] + j0);
    return;
  }
  constexpr int P = V::kQueries;
  for (int first = 0; first < t.count; first += G * P) {
    const int left = t.count - first;
    // A short last group repeats its last query: the same values are written
    // twice to the same place.
    const float* q[G * P];
    int n[G * P];
    float* s[G * P];
    for (int i = 0; i < G * P; ++i) {
      const int src = first + min_int(i, left - 1);
      q[i] = t.q[src];
      n[i] = t.n[src];
      s[i] = t.scores[src];
    }
    const int groups = (min_int(left, G * P) + P - 1) / P;
    if constexpr (G > 1) {
      if (groups < G) {
        // Fewer queries than a full group: a smaller instantiation, so the
        // padding costs at most one vector's worth of queries.
        HeadTile rest = t;
        rest.count = left;
        for (int i = 0; i < left; ++i) {
          rest.q[i] = t.q[first + i];
          rest.n[i] = t.n[first + i];
          rest.scores[i] = t.scores[first + i];
        }
        return scores_tile<V, G - 1, T>(rest, hd, scale, kv, head_off, qpack);
      }
    }
    scores_group<V, G, T>(q, n, s, hd, scale, kv, head_off, qpack);
  }
}

// Output elements [d0, d0 + C * W::kLanes) of B queries: W's lanes are
// consecutive elements of one query.
template <class W, int B, int C, class T>
void values_pass(const float* const* scores, const int* n, float* const* out, const PagedKv& kv,
                 size_t off) {
  constexpr int L = W::kLanes;
  int n_min = n[0];
  for (int i = 1; i < B; ++i) n_min = min_int(n_min, n[i]);
  typename W::vec acc[B][C];
#pragma GCC unroll 8
  for (int i = 0; i < B; ++i)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[i][c] = W::zero();
  for (int j0 = 0, b = 0; j0 < n_min; j0 += kv.block_tokens, ++b) {
    const T* row = value_row<T>(kv, b, off);
    const int end = min_int(n_min - j0, kv.block_tokens);
    for (int o = 0; o < end; ++o, row += kv.row_stride) {
      typename W::vec v[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) v[c] = W::load(row + c * L);
#pragma GCC unroll 8
      for (int i = 0; i < B; ++i) {
        const typename W::vec w = W::set1(scores[i][j0 + o]);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[i][c] = W::fma(w, v[c], acc[i][c]);
      }
    }
  }
  // Positions only some queries see (later tokens of a chunk), query by query.
#pragma GCC unroll 8
  for (int i = 0; i < B; ++i) {
    for (int j = n_min; j < n[i]; ++j) {
      const T* row = value_at<T>(kv, j, off);
      const typename W::vec w = W::set1(scores[i][j]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[i][c] = W::fma(w, W::load(row + c * L), acc[i][c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) W::store(out[i] + c * L, acc[i][c]);
  }
}

struct Ymm {
  using vec = __m256;
  static constexpr int kQueries = 1, kLanes = 8;
  static vec zero() { return _mm256_setzero_ps(); }
  template <class T>
  static vec load(const T* p) {
    return load8(p);
  }
  template <class T>
  static vec bcast8(const T* p) {
    return load8(p);
  }
  static vec set1(float v) { return _mm256_set1_ps(v); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static void reduce_keys4(const vec* a, float* out) { reduce4(a[0], a[1], a[2], a[3], out); }
  static void store_keys4(const vec* a, float scale, float* const* dst) {
    _mm_storeu_ps(dst[0], _mm_mul_ps(reduce4(a[0], a[1], a[2], a[3]), _mm_set1_ps(scale)));
  }
};

// B queries' outputs [d0, d0 + W::kLanes * C) and so on down: passes of C
// vectors, of one vector, of 8 lanes, then element by element.
template <class W, int B, int C, class T>
void values_queries(const float* const* scores, const int* n, float* const* out, int hd,
                    const PagedKv& kv, size_t head_off) {
  constexpr int L = W::kLanes;
  float* o[B];
  int d = 0;
  auto at = [&](int d0) {
    for (int i = 0; i < B; ++i) o[i] = out[i] + d0;
    return head_off + size_t(d0);
  };
  for (; d + C * L <= hd; d += C * L) values_pass<W, B, C, T>(scores, n, o, kv, at(d));
  for (; d + L <= hd; d += L) values_pass<W, B, 1, T>(scores, n, o, kv, at(d));
  if constexpr (L > 8)
    for (; d + 8 <= hd; d += 8) values_pass<Ymm, B, 1, T>(scores, n, o, kv, at(d));
  for (; d < hd; ++d)
    for (int i = 0; i < B; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < n[i]; ++j)
        acc = __builtin_fmaf(scores[i][j], elem(value_at<T>(kv, j, head_off), d), acc);
      out[i][d] = acc;
    }
}

// Queries in sets of B (a smaller instantiation for the rest).
template <class W, int B, int C, class T>
void values_tile(const HeadTile& t, int hd, const PagedKv& kv, size_t head_off) {
  int first = 0;
  for (; first + B <= t.count; first += B)
    values_queries<W, B, C, T>(t.scores + first, t.n + first, t.out + first, hd, kv, head_off);
  if constexpr (B > 1) {
    if (first < t.count) {
      HeadTile rest = t;
      rest.count = t.count - first;
      for (int i = 0; i < rest.count; ++i) {
        rest.scores[i] = t.scores[first + i];
        rest.n[i] = t.n[first + i];
        rest.out[i] = t.out[first + i];
      }
      values_tile<W, B - 1, C, T>(rest, hd, kv, head_off);
    }
  }
}

// The tile kernels of one ISA for the cache's element type: K<T>::scores
// and K<T>::values.
template <template <class> class K>
detail::TileFns tile_fns_for(KvType type) {
  switch (type) {
    case KvType::F16:
      return {&K<F16Bits>::scores, &K<F16Bits>::values};
    case KvType::BF16:
      return {&K<Bf16Bits>::scores, &K<Bf16Bits>::values};
    case KvType::F32:
      break;
  }
  return {&K<float>::scores, &K<float>::values};
}
