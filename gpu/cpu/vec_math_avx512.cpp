// vec_math.inl's row kernels on 16 lanes: the same values as the baseline's
// 8 (see there), twice as many a step. Compiled with AVX-512 flags; only
// called after a run-time CPU check.
#include <immintrin.h>

#include "gpu/cpu/vec_math_types.h"

namespace troupe::kernels {
namespace {

#include "gpu/cpu/vec_math.inl"

struct Lanes16 {
  using vec = __m512;
  static constexpr int kLanes = 16;
  static vec set1(float v) { return _mm512_set1_ps(v); }
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static vec min(vec a, vec b) { return _mm512_min_ps(a, b); }
  static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
  static vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static vec fnmadd(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }
  static vec round(vec v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static vec pow2(vec n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static float reduce_max(vec v) { return _mm512_reduce_max_ps(v); }
  // The low 8 lanes, then the high 8: the order Lanes8 adds them in.
  static __m256 add_groups(__m256 acc, vec v) {
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(v));
    return _mm256_add_ps(acc, _mm512_extractf32x8_ps(v, 1));
  }
};

}  // namespace

namespace detail {
RowFns row_fns_avx512() {
  return {&softmax_lanes<Lanes16>, &silu_mul_lanes<Lanes16>, &gelu_tanh_mul_lanes<Lanes16>};
}
}  // namespace detail
}  // namespace troupe::kernels
