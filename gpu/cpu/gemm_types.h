#pragma once
// Plain data shared with the per-ISA kernel files. Those files are compiled
// with wider ISA flags, so they must not instantiate inline library code that
// the linker could merge into baseline code: they see only this POD.
#include <cstddef>
#include <cstdint>

#include "gpu/dtype.h"

namespace troupe {

constexpr int kPanel = 16;

// A panel of block-quantized weights (packed_matrix.h): weight = q * s + o
// with q of `bits` bits (4: unsigned, two k per byte, the even k in the low
// nibble; 8: signed) and one s, and with `offset` one o, per lane and group
// of `group` k. Group g of the panel starts group_bytes() * g bytes after
// `at`: s[16] (f32), o[16] if any, then the q of its k, kPanel lanes a row.
struct QuantPanel {
  uint64_t at;  // bytes from PanelsRef::data
  uint8_t bits, group;
  bool offset;
  size_t group_bytes() const {
    return size_t(kPanel) * 4 * (offset ? 2 : 1) + size_t(group) * kPanel * bits / 8;
  }
};

// A packed matrix as the kernels see it. Its k steps are single elements of
// k for f32 and f16 weights; bf16 weights are stored as pairs of k (see
// packed_matrix.h), and a step is one pair: 32 bits per weight lane.
struct PanelsRef {
  const void* data;  // panel 0; panel p starts p * cols * kPanel steps later
  int rows;          // N
  int cols;          // k steps: K, or the pairs of bf16 weights
  DType dtype;
  // The product as a sum over pieces of k: piece p covers steps [piece_k[p],
  // piece_k[p + 1]), each output is one FMA chain per piece, and the pieces'
  // chains are added in order. 0 pieces: one chain over all of k.
  const int* piece_k = nullptr;
  int pieces = 0;
  // x's columns (K) and, with pieces, where each piece begins in them: bf16
  // pairs start afresh at each piece, so a piece of odd length ends in a pair
  // whose second half is zero.
  int x_cols = 0;
  const int* x_piece_k = nullptr;
  // Block-quantized panels, one entry per panel (dtype is then F32, the
  // weights' values); null otherwise.
  const QuantPanel* quant = nullptr;
};

// f32 to bf16 for the bf16 product (packed_matrix.h): to nearest even, f32
// denormals to a signed zero (as vdpbf16ps reads them), NaN stays NaN.
// Static: the per-ISA files get their own copy, never one the linker could
// hand to baseline code. Branch-free, so that loops over it vectorise.
static inline uint16_t bf16_for_product(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u, zero = (u >> 16) & 0x8000u;
  const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  return uint16_t((u & 0x7f800000u) == 0 ? zero : r);
}

namespace detail {
// pack_tag: calls with the same non-zero tag pass the same x, so a thread
// may reuse the copy of x it packed for an earlier call (matmul tags each
// product; its chunks then pack x once per thread, not once per chunk).
// piece_stride: 0 sums the pieces into y; otherwise piece p's chains are
// written at y + p * piece_stride.
using GemmFn = void (*)(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1,
                        float* y, int ldy, uint64_t pack_tag, size_t piece_stride);
GemmFn gemm_avx2();
GemmFn gemm_avx512();
GemmFn gemm_avx512_bf16();  // AVX-512 with the bf16 dot-product instruction
}  // namespace detail

}  // namespace troupe
