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
  // a[u] = [query 0's 8 lanes | query 1's 8 lanes] against key u; each
  // 128-bit quarter holds four lanes of one query. In-lane shuffles pair the
  // lanes as reduce4's hadd does, l0 + l1, then (l0 + l1) + (l2 + l3), in
  // every quarter at once; one cross-lane shuffle then adds a query's two
  // quarters. Quarter 0 of the result holds query 0's four sums (key u in
  // lane u), quarter 2 query 1's.
  static __m512 reduce_quarters(const vec* a) {
    auto pairs = [](__m512 x, __m512 y) {
      return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
    };
    // Per quarter: [k0 l01, k0 l23, k1 l01, k1 l23], then [k0..k3 l0123].
    const __m512 t = pairs(pairs(a[0], a[1]), pairs(a[2], a[3]));
    return _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  }
  static void reduce_keys4(const vec* a, float* out) {
    const __m512 r = reduce_quarters(a);
    _mm_storeu_ps(out, _mm512_castps512_ps128(r));
    _mm_storeu_ps(out + 4, _mm512_extractf32x4_ps(r, 2));
  }
  static void store_keys4(const vec* a, float scale, float* const* dst) {
    const __m512 s = _mm512_mul_ps(reduce_quarters(a), _mm512_set1_ps(scale));
    _mm_storeu_ps(dst[0], _mm512_castps512_ps128(s));
    _mm_storeu_ps(dst[1], _mm512_extractf32x4_ps(s, 2));
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
