#pragma once
// A weight matrix W [N, K] (y = x W^T) stored in column panels of kPanel
// output rows: panel p holds rows [16p, 16p+16) interleaved by k, i.e.
// panel[k][16]. A GEMM then streams each panel once and every output is one
// sequential FMA chain over k, so its value does not depend on the batch
// size, the thread split or the vector width: batched and single runs agree
// bit for bit.
//
// bf16 weights are multiplied as bf16 hardware does it (AVX512_BF16's
// vdpbf16ps, llama.cpp's and PyTorch's bf16 CPU paths): x is rounded to bf16
// too, and k is taken in pairs, panel[k/2][16][2] with the even k in the low
// half. A pair step adds the odd k's product to the chain, then the even
// k's, each rounded to f32 (the products of two bf16 values are exact).
// Pairs start afresh at each piece (set_pieces); a piece of odd length ends
// in a pair whose odd half is zero. Values that would be f32 denormals are
// flushed to zero when x and W are rounded, as the instruction does; an
// accumulator that itself passes through the denormal range (below 1.2e-38
// without being zero) is the one case where the instruction, which flushes
// it, and the kernels without it may differ.
//
// Block-quantized weights (a GGUF's q4_K, q8_0, ...) packed in f32 or bf16
// stay quantized: each panel holds them as ggml_quants.h's parts, q with a
// scale (and offset) per group of k (QuantPanel), and the kernels dequantize
// them (in registers for one block of rows, else a panel group at a time
// into a per-thread buffer) and run the f32
// chain over the values, or in bf16 the chain of pair products over the
// values rounded to bf16. A product then equals, bit for bit, the product
// over a plain f32 or bf16 PackedMatrix of the dequantized weights, from a
// sixth to a third of the bytes. Packed in f16 they are dequantized and
// rounded like any other weights.
//
// With QuantProducts::Int8 the panels keep the same parts in the integer
// layout (gemm_types.h) and the products quantize x to 8 bits per block
// (Int8Rows) and sum q times x's q in integers (gemm_int8.inl): a few
// instructions per 64 multiply-adds instead of a dequantization per weight.
// Each output is still one fixed chain, the same in any batch, thread split,
// layout or ISA, but it is not the exact product.
#include <cstdint>
#include <vector>

#include "gpu/cpu/gemm_types.h"
#include "gpu/tensor.h"

namespace troupe {

class PackedMatrix {
 public:
  PackedMatrix() = default;
  // Stacks the row blocks (each [n_i, K], any dtype) and packs them in
  // `dtype`. In f32 or bf16, block-quantized ones stay quantized (see above) where
  // every block is of a kind with parts (ggml_quants.h), its columns cut no
  // group, and all but the last have a multiple of 16 rows; otherwise they
  // are dequantized like the rest.
  // With Int8, blocks that stay quantized take integer products (above).
  static PackedMatrix pack(const std::vector<Tensor>& row_blocks, DType dtype,
                           QuantProducts products = QuantProducts::Exact);
  bool quantized() const { return !quant_.empty(); }
  bool int8() const { return int8_; }

  int rows() const { return rows_; }  // N
  int cols() const { return cols_; }  // K
  int panels() const { return (rows_ + kPanel - 1) / kPanel; }
  // What the products compute in (a quantized matrix: F32 or BF16).
  DType dtype() const { return quantized() ? quant_dtype_ : data_.dtype(); }
  size_t bytes() const { return data_.nbytes(); }
  // k steps of a panel: K, or for bf16 the pairs over all pieces.
  int steps() const { return step_k_.back(); }
  const void* panel(int p) const {
    return static_cast<const char*>(data_.raw()) +
           (quantized() ? quant_[size_t(p)].at
                        : size_t(p) * size_t(steps()) * kPanel * step_bytes());
  }
  // Cuts k into pieces [bounds[i], bounds[i + 1]) (bounds run from 0 to
  // cols(), increasing): a product is then the in-order sum of one FMA chain
  // per piece (gemm.h). Tensor-parallel shards hold whole pieces, so that
  // their partial products, added piece by piece, give the one-device value.
  // Quantized panels whose groups the bounds would cut are laid out again in
  // f32 (the same values, so the same products).
  void set_pieces(std::vector<int> bounds);
  const std::vector<int>& piece_bounds() const { return piece_k_; }
  int pieces() const { return int(piece_k_.size()) - 1; }
  // Where piece p's steps begin (p == pieces(): steps()).
  int piece_step(int p) const { return step_k_[size_t(p)]; }
  PanelsRef ref() const {
    const bool cut = pieces() > 1;
    return PanelsRef{data_.raw(),
                     rows_,
                     steps(),
                     dtype(),
                     cut ? step_k_.data() : nullptr,
                     cut ? pieces() : 0,
                     cols_,
                     cut ? piece_k_.data() : nullptr,
                     quantized() ? quant_.data() : nullptr,
                     int8_};
  }
  // Row n as f32 (for embedding lookups from a tied classifier).
  void row_to_f32(int n, float* out) const;
  // Weight (lane, k) of quantized panel p, dequantized (before any bf16
  // rounding).
  float quant_weight(int p, int lane, int k) const;
  // Its parts: weight = q * s + o.
  struct QuantValue {
    int q;
    float s, o;
  };
  QuantValue quant_value(int p, int lane, int k) const;

 private:
  size_t step_bytes() const { return dtype() == DType::BF16 ? 4 : dtype_size(dtype()); }
  // Lays out rows_ rows, row(n, out) writing row n as K floats, in the
  // current pieces.
  template <class RowFn>
  void lay_out(DType dtype, RowFn&& row);
  // Lays the quantized row blocks out in QuantPanels (pack() has checked
  // that they can be).
  void lay_out_quantized(const std::vector<Tensor>& row_blocks);
  // f(k, i) for each k of a panel lane, i: where element (lane, k) lies in
  // its panel, in units of the dtype's storage.
  template <class F>
  void for_each_k(int lane, F&& f) const;

  int rows_ = 0;
  int cols_ = 0;
  std::vector<int> piece_k_{0, 0};  // bounds in k
  std::vector<int> step_k_{0, 0};   // the same bounds in k steps
  Tensor data_;
  std::vector<QuantPanel> quant_;  // one per panel when quantized
  DType quant_dtype_ = DType::F32;
  bool int8_ = false;  // quant_ in the integer layout
};

}  // namespace troupe
