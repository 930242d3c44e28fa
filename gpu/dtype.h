#pragma once
// Element types of weights and activations, and scalar conversions between them.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace troupe {

enum class DType : uint8_t { F32, F16, BF16 };

constexpr size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}
const char* dtype_name(DType t);  // "f32", "f16", "bf16"
std::optional<DType> parse_dtype(std::string_view name);

// How a CPU device multiplies block-quantized weights (a GGUF's q4_K, q8_0,
// ...; gpu/cpu/packed_matrix.h). Exact: with x as it is (or rounded to bf16
// for bf16 products), giving the product over the dequantized weights.
// Int8: with x quantized to 8 bits per block of 32 and integer sums, as
// llama.cpp computes them: faster, and near the exact product, not equal.
enum class QuantProducts : uint8_t { Exact, Int8 };
const char* quant_products_name(QuantProducts p);  // "exact", "int8"

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of type `from` at src to f32 at dst.
void convert_to_f32(const void* src, DType from, float* dst, size_t n);
// Converts n f32 elements to type `to` at dst.
void convert_from_f32(const float* src, DType to, void* dst, size_t n);

}  // namespace troupe
