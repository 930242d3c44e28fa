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

// n elements (a multiple of the type's block) at src to f32 at dst.
// Requires ggml_type(id)->dequantizable.
void dequantize_row(uint32_t id, const uint8_t* src, float* dst, int64_t n);

}  // namespace troupe
