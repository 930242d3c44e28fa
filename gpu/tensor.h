#pragma once
// A typed n-dimensional array that owns its memory or views memory kept
// alive by someone else (a memory-mapped checkpoint, a parent tensor).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/dtype.h"

namespace troupe {

class Tensor {
 public:
  Tensor() = default;

  // Owning, zero-filled, 64-byte aligned.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype);
  // Non-owning view; `keepalive` (may be null) holds the memory's owner.
  static Tensor view(const void* data, std::vector<int64_t> shape, DType dtype,
                     std::shared_ptr<const void> keepalive = nullptr);
  // A view of ggml's block-quantized data (a GGUF's q4_K, q8_0, ...; the
  // blocks run along the last dimension, none across a row). To every
  // reader its elements are f32: read them through to_f32(), row_to_f32()
  // or cols(), which dequantize; raw() is the blocks. So a quantized file
  // stays mapped, not copied, until the model packs it.
  static Tensor blocks_view(const void* data, std::vector<int64_t> shape, uint32_t ggml_type,
                            std::shared_ptr<const void> keepalive);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  int64_t numel() const;
  size_t nbytes() const;
  bool is_blocks() const { return block_type_ >= 0; }
  // The ggml type of a blocks_view's blocks (is_blocks() only).
  uint32_t block_type() const { return uint32_t(block_type_); }
  // The blocks of row r (r < dim(0)) that a blocks view's columns lie in
  // (cols() of a blocks view may cut blocks): where they start, the
  // elements they hold, and the view's first column among those.
  struct BlockSpan {
    const uint8_t* data;
    int64_t elements;
    int64_t col0;
  };
  BlockSpan block_span(int64_t r) const;
  bool empty() const { return data_ == nullptr; }

  const void* raw() const { return data_; }
  void* raw_mut() { return const_cast<void*>(data_); }
  template <class T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  template <class T>
  T* data_mut() {
    return static_cast<T*>(const_cast<void*>(data_));
  }

  // Rows [begin, end) of the first dimension, as a view sharing ownership.
  Tensor rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) of a 2-D tensor, as an owning copy (itself when
  // that is every column). Of a blocks view: a copy of the blocks where the
  // slice cuts none, else a view of the rows' blocks that reads only the
  // slice's columns.
  Tensor cols(int64_t begin, int64_t end) const;
  // Copy converted to f32 (any dtype in, block-quantized too).
  std::vector<float> to_f32() const;
  // Row r of the first dimension (its other dimensions flattened) as f32.
  void row_to_f32(int64_t r, float* out) const;

  std::string shape_str() const;  // "[192, 512]"

 private:
  const void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  int32_t block_type_ = -1;  // the ggml type of a blocks_view
  int64_t stored_row_ = 0;   // a column window's stored row elements (0: no window)
  int64_t block_col0_ = 0;   // and its first column in them
  int64_t stored_row_elements() const { return stored_row_ ? stored_row_ : row_elements(); }
  std::shared_ptr<const void> owner_;
  size_t row_bytes() const;  // of the first dimension's rows
  int64_t row_elements() const;
};

}  // namespace troupe
