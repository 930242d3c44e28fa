// Compiled with AVX-512 and AVX512_BF16 flags; only called after a run-time
// CPU check (and a check that the instruction gives the emulated values).
#include <immintrin.h>

#include <cstdlib>
#include <type_traits>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

#include "gpu/cpu/gemm_avx512_traits.h"

struct Avx512Bf16 : Avx512 {
  // One instruction per pair: the weight vector stays whole, as for f32.
  static constexpr int kPairRows = 6, kPairPanels = 4;
  static constexpr bool kNativeBf16 = true;
  static vec dot_pair(vec acc, vec x, vec w) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(x), reinterpret_cast<__m512bh>(w));
  }
  // Lane i's weights at an even k and the next odd k as one bf16 pair (the
  // even k low), rounded to nearest even.
  static vec pair(vec even, vec odd) {
    // Even values in the low sixteen halves, odd ones in the high sixteen.
    const __m512i halves = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
    const __m512i interleave =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_castsi512_ps(_mm512_permutexvar_epi16(interleave, halves));
  }
};

#include "gpu/cpu/gemm_kernel.inl"

void gemm_avx512_bf16_impl(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1,
                           float* y, int ldy, uint64_t pack_tag, size_t piece_stride) {
  if (w.dtype != DType::BF16) std::abort();  // gemm.cpp routes only bf16 here
  if (w.quant)
    return gemm_quant_pairs<Avx512Bf16, Avx512Bf16::kPairRows, Avx512Bf16::kPairPanels, 512>(
        x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
  gemm_typed<Avx512Bf16, DType::BF16, Avx512Bf16::kPairRows, Avx512Bf16::kPairPanels, 512>(
      x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
}

}  // namespace

namespace detail {
GemmFn gemm_avx512_bf16() {
  return &gemm_avx512_bf16_impl;
}
}  // namespace detail
}  // namespace troupe
