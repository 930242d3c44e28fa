#include <immintrin.h>

#include <cstdlib>
#include <type_traits>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

struct Avx2 {
  using vec = __m256;
  static constexpr int kLanes = 8;
  // Rows x panels of the kernel for bf16 pairs: the f32 kernel's, for the
  // prefill-sized products that split pairs per k block; a few rows (decode,
  // bound by memory) spill the split halves.
  static constexpr int kPairRows = 3, kPairPanels = 2;
  static vec zero() { return _mm256_setzero_ps(); }
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static vec load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static vec set1(float v) { return _mm256_set1_ps(v); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  // kLanes signed bytes, as f32.
  static vec load_i8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // The low and high nibbles of kLanes bytes, as f32.
  static void load_u4(const uint8_t* p, vec& lo, vec& hi) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
  }
  static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  // bf16 pairs as in gemm_avx512_traits.h.
  static vec odd_half(vec pairs) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(pairs), _mm256_set1_epi32(int(0xffff0000u))));
  }
  static vec even_half(vec pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pairs), 16));
  }
  static constexpr bool kNativeBf16 = false;

  // Integer products (gemm_int8.inl), as in gemm_avx512_traits.h.
  using ivec = __m256i;
  static ivec izero() { return _mm256_setzero_si256(); }
  static ivec load_q(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static ivec low_nibbles(ivec b) { return _mm256_and_si256(b, _mm256_set1_epi8(15)); }
  static ivec high_nibbles(ivec b) {
    return _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(15));
  }
  static ivec bcast4(const int8_t* p) {
    // An unaligned, aliasing 32-bit load, which the compiler folds into
    // the dot product's broadcast operand.
    typedef int32_t word __attribute__((may_alias, aligned(1)));
    return _mm256_set1_epi32(*reinterpret_cast<const word*>(p));
  }
  static ivec dot4(ivec acc, ivec u, ivec s) {
    const ivec u_even = _mm256_and_si256(u, _mm256_set1_epi16(0xff));
    const ivec u_odd = _mm256_srli_epi16(u, 8);
    const ivec s_even = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8);
    const ivec s_odd = _mm256_srai_epi16(s, 8);
    return _mm256_add_epi32(
        acc, _mm256_add_epi32(_mm256_madd_epi16(u_even, s_even), _mm256_madd_epi16(u_odd, s_odd)));
  }
  static ivec sub_i32(ivec a, int32_t b) { return _mm256_sub_epi32(a, _mm256_set1_epi32(b)); }
  static vec to_f32(ivec a) { return _mm256_cvtepi32_ps(a); }
};

#include "gpu/cpu/gemm_kernel.inl"

void gemm_avx2_impl(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                    int ldy, uint64_t pack_tag, size_t piece_stride) {
  // 3 rows x 2 panels = 12 accumulators of 16 ymm registers.
  gemm_dispatch<Avx2, 3, 2, 256, 256>(x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
}

}  // namespace

namespace detail {
GemmFn gemm_avx2() {
  return &gemm_avx2_impl;
}
}  // namespace detail
}  // namespace troupe
