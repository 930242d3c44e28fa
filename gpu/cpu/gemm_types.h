#pragma once
// Plain data shared with the per-ISA kernel files. Those files are compiled
// with wider ISA flags, so they must not instantiate inline library code that
// the linker could merge into baseline code: they see only this POD.
#include <cstddef>
#include <cstdint>

#include "gpu/dtype.h"

namespace troupe {

constexpr int kPanel = 16;

struct PanelsRef {
  const void* data;  // panel 0; panel p starts p * cols * kPanel elements later
  int rows;          // N
  int cols;          // K
  DType dtype;
  // The product as a sum over pieces of k: piece p covers [piece_k[p],
  // piece_k[p + 1]), each output is one FMA chain per piece, and the pieces'
  // chains are added in order. 0 pieces: one chain over all of k.
  const int* piece_k = nullptr;
  int pieces = 0;
};

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
}  // namespace detail

}  // namespace troupe
