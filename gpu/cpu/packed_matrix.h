#pragma once
// A weight matrix W [N, K] (y = x W^T) stored in column panels of kPanel
// output rows: panel p holds rows [16p, 16p+16) interleaved by k, i.e.
// panel[k][16]. A GEMM then streams each panel once and every output is one
// sequential FMA chain over k, so its value does not depend on the batch
// size, the thread split or the vector width: batched and single runs agree
// bit for bit.
#include <cstdint>
#include <vector>

#include "gpu/cpu/gemm_types.h"
#include "gpu/tensor.h"

namespace troupe {

class PackedMatrix {
 public:
  PackedMatrix() = default;
  // Stacks the row blocks (each [n_i, K], any dtype) and packs them in `dtype`.
  static PackedMatrix pack(const std::vector<Tensor>& row_blocks, DType dtype);

  int rows() const { return rows_; }  // N
  int cols() const { return cols_; }  // K
  int panels() const { return (rows_ + kPanel - 1) / kPanel; }
  DType dtype() const { return data_.dtype(); }
  size_t bytes() const { return data_.nbytes(); }
  const void* panel(int p) const {
    return static_cast<const char*>(data_.raw()) +
           size_t(p) * size_t(cols_) * kPanel * dtype_size(dtype());
  }
  // Cuts k into pieces [bounds[i], bounds[i + 1]) (bounds run from 0 to
  // cols(), increasing): a product is then the in-order sum of one FMA chain
  // per piece (gemm.h). Tensor-parallel shards hold whole pieces, so that
  // their partial products, added piece by piece, give the one-device value.
  void set_pieces(std::vector<int> bounds);
  const std::vector<int>& piece_bounds() const { return piece_k_; }
  int pieces() const { return piece_k_.empty() ? 1 : int(piece_k_.size()) - 1; }
  PanelsRef ref() const {
    return PanelsRef{data_.raw(),
                     rows_,
                     cols_,
                     dtype(),
                     piece_k_.empty() ? nullptr : piece_k_.data(),
                     piece_k_.empty() ? 0 : int(piece_k_.size()) - 1};
  }
  // Row n as f32 (for embedding lookups from a tied classifier).
  void row_to_f32(int n, float* out) const;

 private:
  int rows_ = 0;
  int cols_ = 0;
  std::vector<int> piece_k_;  // empty: one piece
  Tensor data_;
};

}  // namespace troupe
