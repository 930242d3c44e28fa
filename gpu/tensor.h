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

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
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
  // that is every column).
  Tensor cols(int64_t begin, int64_t end) const;
  // Copy converted to f32 (any dtype in).
  std::vector<float> to_f32() const;

  std::string shape_str() const;  // "[192, 512]"

 private:
  const void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  std::shared_ptr<const void> owner_;
};

}  // namespace troupe
