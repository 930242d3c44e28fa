// The attention tile kernels on 16-lane vectors, each holding two groups of
// the baseline's 8 lanes: the same arithmetic as attention_avx2.cpp, twice
// as much of it per instruction. Compiled with AVX-512 flags; only called
// after a run-time CPU check.
#include <immintrin.h>

#include "gpu/cpu/attention_types.h"

namespace troupe::kernels {
namespace {

#include "gpu/cpu/attention_kernel.inl"

struct Zmm {
  using vec = __m512;
  static constexpr int kQueries = 2, kLanes = 16;
  static vec zero() { return _mm512_setzero_ps(); }
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static vec load(const F16Bits* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static vec load(const Bf16Bits* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  template <class T>
  static vec bcast8(const T* p) {
    return _mm512_broadcast_f32x8(load8(p));
  }
  static vec set1(float v) { return _mm512_set1_ps(v); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  // a[u] = [query 0's 8 lanes | query 1's 8 lanes] against key u. Each level
  // adds lanes (2i, 2i + 1) of two vectors, the even lanes gathered into one
  // vector and the odd into another (reduce4's hadd, without the extracts of
  // 8-lane halves): l0 + l1, then (l0 + l1) + (l2 + l3), then that plus
  // (l4 + l5) + (l6 + l7).
  static __m256 reduce_keys4(const vec* a) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    auto pairs = [&](__m512 x, __m512 y) {
      return _mm512_add_ps(_mm512_permutex2var_ps(x, even, y), _mm512_permutex2var_ps(x, odd, y));
    };
    // Lane 8k + 4q + i of s01: key k, query q, lanes (2i, 2i + 1) summed.
    const __m512 s01 = pairs(a[0], a[1]), s23 = pairs(a[2], a[3]);
    // Lane 4u + 2q + h of t: key u, query q, half h of the lanes summed.
    const __m512 t = pairs(s01, s23);
    // Halves apart, in out's order (4q + u): lanes 0-7 the first half.
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
    const __m512 r = _mm512_permutexvar_ps(order, t);
    return _mm256_add_ps(_mm512_castps512_ps256(r), _mm512_extractf32x8_ps(r, 1));
  }
  static void reduce_keys4(const vec* a, float* out) { _mm256_storeu_ps(out, reduce_keys4(a)); }
  static void store_keys4(const vec* a, float scale, float* const* dst) {
    const __m256 s = _mm256_mul_ps(reduce_keys4(a), _mm256_set1_ps(scale));
    _mm_storeu_ps(dst[0], _mm256_castps256_ps128(s));
    _mm_storeu_ps(dst[1], _mm256_extractf128_ps(s, 1));
  }
};

template <class T>
struct Avx512 {
  static void scores(const HeadTile& t, int hd, float scale, const PagedKv& kv, size_t head_off,
                     float* scratch) {
    // 4 vectors of 2 queries x 4 keys = 16 accumulators of 32 zmm registers.
    scores_tile<Zmm, 4, T>(t, hd, scale, kv, head_off, scratch);
  }
  static void values(const HeadTile& t, int hd, const PagedKv& kv, size_t head_off) {
    // 4 queries x 64 elements = 16 accumulators.
    values_tile<Zmm, 4, 4, T>(t, hd, kv, head_off);
  }
};

}  // namespace

namespace detail {
TileFns attention_avx512(KvType type) {
  return tile_fns_for<Avx512>(type);
}
}  // namespace detail
}  // namespace troupe::kernels
