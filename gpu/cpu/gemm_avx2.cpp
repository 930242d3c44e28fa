#include <immintrin.h>

#include <cstdlib>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

struct Avx2 {
  using vec = __m256;
  static constexpr int kLanes = 8;
  static vec zero() { return _mm256_setzero_ps(); }
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static vec load_bf16(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static vec load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static vec set1(float v) { return _mm256_set1_ps(v); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
};

#include "gpu/cpu/gemm_kernel.inl"

void gemm_avx2_impl(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                    int ldy, uint64_t pack_tag, size_t piece_stride) {
  // 3 rows x 2 panels = 12 accumulators of 16 ymm registers.
  gemm_dispatch<Avx2, 3, 2, 256>(x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
}

}  // namespace

namespace detail {
GemmFn gemm_avx2() {
  return &gemm_avx2_impl;
}
}  // namespace detail
}  // namespace troupe
