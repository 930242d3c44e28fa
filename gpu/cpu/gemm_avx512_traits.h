#pragma once
// The AVX-512 vector traits of gemm_kernel.inl, shared by the files compiled
// with AVX-512 flags (gemm_avx512.cpp, gemm_avx512_bf16.cpp). Include inside
// an anonymous namespace, after <immintrin.h>.

struct Avx512 {
  using vec = __m512;
  static constexpr int kLanes = 16;
  // Rows x panels of the kernel for bf16 pairs: emulating the pair product
  // splits each weight vector in two, which takes registers from the rows.
  static constexpr int kPairRows = 4, kPairPanels = 4;
  static vec zero() { return _mm512_setzero_ps(); }
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static vec load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static vec set1(float v) { return _mm512_set1_ps(v); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  // kLanes signed bytes, as f32.
  static vec load_i8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // The low and high nibbles of kLanes bytes, as f32.
  static void load_u4(const uint8_t* p, vec& lo, vec& hi) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  }
  static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  // The halves of 32-bit lanes of bf16 pairs (the odd k high), as f32.
  static vec odd_half(vec pairs) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(pairs), _mm512_set1_epi32(int(0xffff0000u))));
  }
  static vec even_half(vec pairs) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(pairs), 16));
  }
  // No pair instruction: gemm_kernel.inl's step() emulates it.
  static constexpr bool kNativeBf16 = false;

  // Integer products (gemm_int8.inl).
  using ivec = __m512i;
  static ivec izero() { return _mm512_setzero_si512(); }
  static ivec load_q(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static ivec low_nibbles(ivec b) { return _mm512_and_si512(b, _mm512_set1_epi8(15)); }
  static ivec high_nibbles(ivec b) {
    return _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi8(15));
  }
  static ivec bcast4(const int8_t* p) {
    // An unaligned, aliasing 32-bit load, which the compiler folds into
    // the dot product's broadcast operand.
    typedef int32_t word __attribute__((may_alias, aligned(1)));
    return _mm512_set1_epi32(*reinterpret_cast<const word*>(p));
  }
  // vpdpbusd without the instruction: the even and the odd bytes of each
  // 32-bit lane widened to 16 bits, each pair's products summed by vpmaddwd
  // (exact: |product| < 2^15 * 2^8).
  static ivec dot4(ivec acc, ivec u, ivec s) {
    const ivec u_even = _mm512_and_si512(u, _mm512_set1_epi16(0xff));
    const ivec u_odd = _mm512_srli_epi16(u, 8);
    const ivec s_even = _mm512_srai_epi16(_mm512_slli_epi16(s, 8), 8);
    const ivec s_odd = _mm512_srai_epi16(s, 8);
    return _mm512_add_epi32(
        acc, _mm512_add_epi32(_mm512_madd_epi16(u_even, s_even), _mm512_madd_epi16(u_odd, s_odd)));
  }
  static ivec sub_i32(ivec a, int32_t b) { return _mm512_sub_epi32(a, _mm512_set1_epi32(b)); }
  static vec to_f32(ivec a) { return _mm512_cvtepi32_ps(a); }
};
