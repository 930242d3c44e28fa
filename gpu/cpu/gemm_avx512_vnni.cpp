// Compiled with AVX-512 and AVX512_VNNI flags; only called after a run-time
// CPU check. Integer products only (gemm_int8.inl): vpdpbusd gives exactly
// the sums its emulation in gemm_avx512_traits.h gives.
#include <immintrin.h>

#include <cstdlib>
#include <type_traits>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

#include "gpu/cpu/gemm_avx512_traits.h"

struct Avx512Vnni : Avx512 {
  static ivec dot4(ivec acc, ivec u, ivec s) { return _mm512_dpbusd_epi32(acc, u, s); }
};

#include "gpu/cpu/gemm_kernel.inl"

void gemm_avx512_vnni_impl(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1,
                           float* y, int ldy, uint64_t pack_tag, size_t piece_stride) {
  if (!w.int8) std::abort();  // gemm.cpp routes only integer products here
  gemm_int8<Avx512Vnni, kInt8Rows<Avx512Vnni>, kInt8Panels<Avx512Vnni>>(
      x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
}

}  // namespace

namespace detail {
GemmFn gemm_avx512_vnni() {
  return &gemm_avx512_vnni_impl;
}
}  // namespace detail
}  // namespace troupe
