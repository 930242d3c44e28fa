#include "gpu/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "gpu/loaders/ggml_quants.h"

namespace troupe {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return data_ || !shape_.empty() ? n : 0;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  const size_t bytes = (t.nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  t.owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  t.data_ = p;
  return t;
}

Tensor Tensor::view(const void* data, std::vector<int64_t> shape, DType dtype,
                    std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.owner_ = std::move(keepalive);
  return t;
}

Tensor Tensor::blocks_view(const void* data, std::vector<int64_t> shape, uint32_t ggml_type,
                           std::shared_ptr<const void> keepalive) {
  const GgmlType* type = troupe::ggml_type(ggml_type);
  if (!type || !type->dequantizable || shape.empty() || shape.back() % type->block != 0)
    throw std::invalid_argument("Tensor::blocks_view: " + ggml_type_name(ggml_type) +
                                " blocks cannot make rows of " +
                                std::to_string(shape.empty() ? 0 : shape.back()));
  Tensor t = view(data, std::move(shape), DType::F32, std::move(keepalive));
  t.block_type_ = int32_t(ggml_type);
  return t;
}

int64_t Tensor::row_elements() const {
  int64_t row = 1;
  for (size_t i = 1; i < shape_.size(); ++i) row *= shape_[i];
  return row;
}

size_t Tensor::row_bytes() const {
  if (!is_blocks()) return size_t(row_elements()) * dtype_size(dtype_);
  const GgmlType* type = ggml_type(uint32_t(block_type_));
  return size_t(stored_row_elements() / type->block) * type->bytes;
}

size_t Tensor::nbytes() const {
  if (!is_blocks()) return size_t(numel()) * dtype_size(dtype_);
  return shape_.empty() ? 0 : size_t(shape_[0]) * row_bytes();
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end > shape_[0] || begin > end)
    throw std::out_of_range("Tensor::rows(" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") out of " + shape_str());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<const char*>(data_) + size_t(begin) * row_bytes();
  return t;
}

void Tensor::row_to_f32(int64_t r, float* out) const {
  if (shape_.empty() || r < 0 || r >= shape_[0])
    throw std::out_of_range("Tensor::row_to_f32(" + std::to_string(r) + ") out of " + shape_str());
  const auto* src = static_cast<const uint8_t*>(data_) + size_t(r) * row_bytes();
  if (!is_blocks()) {
    convert_to_f32(src, dtype_, out, size_t(row_elements()));
  } else if (!stored_row_) {
    dequantize_row(uint32_t(block_type_), src, out, row_elements());
  } else {
    const BlockSpan span = block_span(r);
    std::vector<float> row(static_cast<size_t>(span.elements));
    dequantize_row(uint32_t(block_type_), span.data, row.data(), span.elements);
    std::memcpy(out, row.data() + span.col0, size_t(row_elements()) * sizeof(float));
  }
}

Tensor::BlockSpan Tensor::block_span(int64_t r) const {
  const GgmlType* type = ggml_type(uint32_t(block_type_));
  const int64_t first = block_col0_ / type->block;
  const int64_t end = (block_col0_ + row_elements() + type->block - 1) / type->block;
  return {
      static_cast<const uint8_t*>(data_) + size_t(r) * row_bytes() + size_t(first) * type->bytes,
      (end - first) * type->block, block_col0_ - first * type->block};
}

Tensor Tensor::cols(int64_t begin, int64_t end) const {
  if (shape_.size() != 2 || begin < 0 || end > shape_[1] || begin > end)
    throw std::out_of_range("Tensor::cols(" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") out of " + shape_str());
  if (begin == 0 && end == shape_[1]) return *this;
  if (is_blocks()) {
    const GgmlType* type = ggml_type(uint32_t(block_type_));
    const int64_t b = block_col0_ + begin, e = block_col0_ + end;  // in the stored rows
    if (b % type->block == 0 && e % type->block == 0) {
      const size_t skip = size_t(b / type->block) * type->bytes;
      const size_t width = size_t((e - b) / type->block) * type->bytes;
      auto copy = std::make_shared<std::vector<uint8_t>>(size_t(shape_[0]) * width);
      for (int64_t r = 0; r < shape_[0]; ++r)
        std::memcpy(copy->data() + size_t(r) * width,
                    static_cast<const uint8_t*>(data_) + size_t(r) * row_bytes() + skip, width);
      return blocks_view(copy->data(), {shape_[0], e - b}, uint32_t(block_type_), copy);
    }
    Tensor t = *this;  // a window on the same blocks
    t.stored_row_ = stored_row_elements();
    t.block_col0_ = b;
    t.shape_[1] = end - begin;
    return t;
  }
  Tensor out = zeros({shape_[0], end - begin}, dtype_);
  const size_t esz = dtype_size(dtype_), width = size_t(end - begin) * esz;
  for (int64_t r = 0; r < shape_[0]; ++r)
    std::memcpy(static_cast<char*>(out.raw_mut()) + size_t(r) * width,
                static_cast<const char*>(data_) + size_t(r * shape_[1] + begin) * esz, width);
  return out;
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  if (is_blocks() && stored_row_)
    for (int64_t r = 0; r < shape_[0]; ++r) row_to_f32(r, out.data() + r * row_elements());
  else if (is_blocks())
    dequantize_row(uint32_t(block_type_), static_cast<const uint8_t*>(data_), out.data(), numel());
  else
    convert_to_f32(data_, dtype_, out.data(), out.size());
  return out;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

}  // namespace troupe
