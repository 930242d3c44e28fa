// Compiled with AVX-512 flags; only called after a run-time CPU check.
#include <immintrin.h>

#include <cstdlib>
#include <type_traits>

#include "gpu/cpu/gemm_types.h"

namespace troupe {
namespace {

#include "gpu/cpu/gemm_avx512_traits.h"
#include "gpu/cpu/gemm_kernel.inl"

void gemm_avx512_impl(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                      int ldy, uint64_t pack_tag, size_t piece_stride) {
  // 6 rows x 4 panels = 24 accumulators of 32 zmm registers.
  gemm_dispatch<Avx512, 6, 4, 512, 128>(x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
}

}  // namespace

namespace detail {
GemmFn gemm_avx512() {
  return &gemm_avx512_impl;
}
}  // namespace detail
}  // namespace troupe
