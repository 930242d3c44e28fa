#pragma once
// Dequantization of ggml's block-quantized tensors (util/gguf_file.h lists
// the types) to f32, bit for bit as ggml's own
// dequantize_row_* computes them (the same products and sums in the same
// order), so that a quantized checkpoint gives the weights llama.cpp uses.
#include <cstddef>
#include <cstdint>
#include <string>

#include "util/gguf_file.h"

namespace troupe {

// Every block-quantized type read here stores a weight as a small integer q
// (4 bits unsigned or 8 bits signed) times a scale s, plus an offset o in
// some types, with one s (and o) per group of consecutive elements:
// weight = q * s + o. The products q * s are exact in f32, so that sum
// rounds once, whether computed as a product then a sum or as one fused
// multiply-add. The CPU kernels keep weights in this form
// (gpu/cpu/packed_matrix.h).
struct QuantForm {
  int bits = 0;         // 4 (q in [0, 15]) or 8 (q in [-128, 127])
  int group = 0;        // elements per scale: 16 or 32
  bool offset = false;  // whether o is there (else 0)
  // Every kind's s (and o) is a half-precision factor of its block times a
  // small integer: s = d * a, o = e * b, a and b in [-128, 127]; d and e lie
  // at these bytes of the block (e: -1 without offsets). The products are
  // exact in f32, so the parts can be stored as d, e and the integers.
  int d_at = 0, e_at = -1;
};
// Null for types without such a form (f32, f16, bf16, unsupported kinds).
const QuantForm* quant_form(uint32_t id);
// The parts of n elements (a multiple of the type's block) at src: q[n],
// s[n / group] and, where the form has offsets, o[n / group] (o may be
// null otherwise).
void quant_parts(uint32_t id, const uint8_t* src, int8_t* q, float* s, float* o, int64_t n);

// n elements (a multiple of the type's block) at src to f32 at dst.
// Requires ggml_type(id)->dequantizable.
void dequantize_row(uint32_t id, const uint8_t* src, float* dst, int64_t n);

}  // namespace troupe
