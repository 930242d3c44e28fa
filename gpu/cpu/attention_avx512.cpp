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
  static vec bcast8(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
  static vec set1(float v) { return _mm512_set1_ps(v); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static void groups(vec v, __m256* out) {
    out[0] = _mm512_castps512_ps256(v);
    out[1] = _mm512_extractf32x8_ps(v, 1);
  }
};

void scores_avx512(const HeadTile& t, int hd, float scale, const PagedKv& kv, size_t head_off,
                   float* scratch) {
  // 4 vectors of 2 queries x 4 keys = 16 accumulators of 32 zmm registers.
  scores_tile<Zmm, 4>(t, hd, scale, kv, head_off, scratch);
}

void values_avx512(const HeadTile& t, int hd, const PagedKv& kv, size_t head_off) {
  // 4 queries x 64 elements = 16 accumulators.
  values_tile<Zmm, 4, 4>(t, hd, kv, head_off);
}

}  // namespace

namespace detail {
TileFns attention_avx512() {
  return {&scores_avx512, &values_avx512};
}
}  // namespace detail
}  // namespace troupe::kernels
