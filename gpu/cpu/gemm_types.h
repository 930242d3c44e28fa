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
//
// For integer products (PanelsRef::int8) the parts are stored as the kind
// stores them (ggml_quants.h: s = d * a, o = e * b): per block of the
// kind's (a window's first block may start with groups that are not the
// panel's: `skip`), d[16] and e[16] in f16; then per group a[16] and
// b[16] (int8) and its q, in chunks of 64 bytes, one 32-bit word per lane
// holding four consecutive k (lane i at bytes 4i..4i+3, as vpdpbusd reads
// them): a 4-bit chunk covers 8 k, k..k+3 in the low nibbles and k+4..k+7
// in the high ones; an 8-bit chunk covers 4 k, each q stored plus 128
// (unsigned, the instruction's weight operand). A q4_K weight then takes
// 4.75 bits, a q6_K one 8.6, a q8_0 one 8.75.
struct QuantPanel {
  uint64_t at;  // bytes from PanelsRef::data
  uint8_t bits, group;
  bool offset;
  // The integer layout's groups per block, as a shift, and groups skipped.
  uint8_t block_shift = 0, skip = 0;
  size_t head_bytes() const { return size_t(kPanel) * 4 * (offset ? 2 : 1); }
  size_t group_bytes() const { return head_bytes() + size_t(group) * kPanel * bits / 8; }
  // The integer layout.
  size_t factor_bytes() const { return size_t(kPanel) * 2 * (offset ? 2 : 1); }
  size_t int_head_bytes() const { return size_t(kPanel) * (offset ? 2 : 1); }
  size_t int_group_bytes() const { return int_head_bytes() + size_t(group) * kPanel * bits / 8; }
  size_t block_bytes() const {
    return factor_bytes() + (size_t(1) << block_shift) * int_group_bytes();
  }
  // Where group g of the panel's columns finds its block's factors, and
  // its own a, b and q.
  size_t factors_at(int g) const { return size_t((g + skip) >> block_shift) * block_bytes(); }
  size_t int_group_at(int g) const {
    return factors_at(g) + factor_bytes() +
           size_t((g + skip) & ((1 << block_shift) - 1)) * int_group_bytes();
  }
  size_t int_bytes(int groups) const {
    return size_t((groups + skip + (1 << block_shift) - 1) >> block_shift) * block_bytes();
  }
  // Where q of (lane, element j of its group) lies among the group's q
  // bytes, and the shift of its nibble (4-bit q).
  struct QAt {
    size_t byte;
    int shift;
  };
  QAt q_at(int lane, int j, bool int8) const {
    if (!int8)
      return bits == 8 ? QAt{size_t(j) * kPanel + size_t(lane), 0}
                       : QAt{size_t(j / 2) * kPanel + size_t(lane), 4 * (j % 2)};
    return bits == 8 ? QAt{size_t(j / 4) * 64 + size_t(lane) * 4 + size_t(j % 4), 0}
                     : QAt{size_t(j / 8) * 64 + size_t(lane) * 4 + size_t(j % 4), 4 * (j % 8 / 4)};
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
  // Integer products (packed_matrix.h): quantized panels in the integer
  // layout, x quantized to 8 bits per block (quantize_int8_row).
  bool int8 = false;
};

// The integer products' x (packed_matrix.h): each piece of a row cut into
// blocks of 32 k from its start (the last one may be of 16), each block
// scaled into [-127, 127]: q = round(x / d) with d = max |x| / 127. Per 16
// k: d of the block they lie in and the sum of their q, so that a group of
// 16 or 32 weights (which lies in one block) finds both at k / 16.
struct Int8Rows {
  int8_t* q;     // rows of K
  float* d;      // rows of K / 16
  int32_t* sum;  // rows of K / 16
  int K;
};

// Row m of x (K elements, pieces [piece_k[p], piece_k[p + 1]) or one piece
// without them) into x8's row m. K and the pieces are multiples of 16. A NaN
// or infinity makes its block's d NaN, so that it reaches the products.
// Static, as bf16_for_product: one definition for every kernel and the
// scalar reference.
static inline void quantize_int8_row(const float* x, const int* piece_k, int pieces,
                                     const Int8Rows& x8, int m) {
  int8_t* q = x8.q + size_t(m) * size_t(x8.K);
  float* d = x8.d + size_t(m) * size_t(x8.K / 16);
  int32_t* sum = x8.sum + size_t(m) * size_t(x8.K / 16);
  for (int p = 0; p < (pieces > 0 ? pieces : 1); ++p) {
    const int kb = pieces > 0 ? piece_k[p] : 0, ke = pieces > 0 ? piece_k[p + 1] : x8.K;
    for (int b = kb; b < ke; b += 32) {
      const int e = b + 32 < ke ? b + 32 : ke;
      float amax = 0.0f;
      bool finite = true;
      for (int k = b; k < e; ++k) {
        const float a = __builtin_fabsf(x[k]);
        finite = finite && a <= 3.40282347e38f;
        amax = a > amax ? a : amax;
      }
      // A block below f32's normal range counts as zeros (its inverse
      // scale would overflow).
      const float s = amax / 127.0f;
      const bool usable = finite && s >= 1.17549435e-38f;
      const float scale = !finite ? __builtin_nanf("") : usable ? s : 0.0f;
      const float inv = usable ? 1.0f / s : 0.0f;
      for (int k = b; k < e; ++k) {
        float v = __builtin_rintf(x[k] * inv);  // to nearest even, as vcvtps2dq
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[k] = finite ? int8_t(v) : int8_t(0);
      }
      for (int c = b; c < e; c += 16) {
        int32_t total = 0;
        for (int k = c; k < c + 16; ++k) total += q[k];
        d[c / 16] = scale;
        sum[c / 16] = total;
      }
    }
  }
}

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
GemmFn gemm_avx512_vnni();  // integer products with AVX512_VNNI's vpdpbusd
}  // namespace detail

}  // namespace troupe
