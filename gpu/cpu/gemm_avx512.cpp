// Compiled with AVX-512 flags; only called after a run-time CPU check.
#include <immintrin.h>

#include <cstdlib>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

struct Avx512 {
  using vec = __m512;
  static constexpr int kLanes = 16;
  static vec zero() { return _mm512_setzero_ps(); }
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static vec load_bf16(const uint16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static vec load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static vec set1(float v) { return _mm512_set1_ps(v); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
};

#include "gpu/cpu/gemm_kernel.inl"

void gemm_avx512_impl(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                      int ldy, uint64_t pack_tag, size_t piece_stride) {
  // 6 rows x 4 panels = 24 accumulators of 32 zmm registers.
  gemm_dispatch<Avx512, 6, 4, 128>(x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
}

}  // namespace

namespace detail {
GemmFn gemm_avx512() {
  return &gemm_avx512_impl;
}
}  // namespace detail
}  // namespace troupe
