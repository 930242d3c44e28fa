#include <immintrin.h>

#include <cstdlib>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

struct Avx2 {
  using vec = __m256;
  static constexpr int kLanes = 8;
  // Rows x panels of the kernel for bf16 pairs (each weight vector is split
  // in two; 16 ymm registers).
  static constexpr int kPairRows = 3, kPairPanels = 1;
  static vec zero() { return _mm256_setzero_ps(); }
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static vec load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static vec set1(float v) { return _mm256_set1_ps(v); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  // vdpbf16ps's pair product in f32 FMAs (see gemm_avx512_traits.h).
  static vec dot_pair(vec acc, vec x, vec w) {
    const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
    const __m256i xi = _mm256_castps_si256(x), wi = _mm256_castps_si256(w);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(xi, hi)),
                          _mm256_castsi256_ps(_mm256_and_si256(wi, hi)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(xi, 16)),
                           _mm256_castsi256_ps(_mm256_slli_epi32(wi, 16)), acc);
  }
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
