#include "gpu/cpu/packed_matrix.h"

#include <stdexcept>
#include <string>

namespace troupe {

PackedMatrix PackedMatrix::pack(const std::vector<Tensor>& row_blocks, DType dtype) {
  if (row_blocks.empty()) throw std::invalid_argument("PackedMatrix::pack: no rows");
  PackedMatrix m;
  m.cols_ = int(row_blocks[0].dim(1));
  for (const auto& b : row_blocks) {
    if (b.ndim() != 2 || b.dim(1) != m.cols_)
      throw std::invalid_argument(
          "PackedMatrix::pack: blocks must be 2-D with equal columns, got " + b.shape_str());
    m.rows_ += int(b.dim(0));
  }
  const int64_t K = m.cols_;
  m.data_ = Tensor::zeros({int64_t(m.panels()) * kPanel, K}, dtype);
  std::vector<float> row(static_cast<size_t>(K), 0.0f);
  std::vector<uint16_t> row16(static_cast<size_t>(K));
  int n = 0;
  for (const auto& b : row_blocks) {
    const size_t esz = dtype_size(b.dtype());
    for (int64_t r = 0; r < b.dim(0); ++r, ++n) {
      convert_to_f32(static_cast<const char*>(b.raw()) + size_t(r * K) * esz, b.dtype(), row.data(),
                     size_t(K));
      const int p = n / kPanel, lane = n % kPanel;
      const size_t base = size_t(p) * size_t(K) * kPanel + size_t(lane);
      if (dtype == DType::F32) {
        float* dst = m.data_.data_mut<float>();
        for (int64_t k = 0; k < K; ++k) dst[base + size_t(k) * kPanel] = row[size_t(k)];
      } else {
        convert_from_f32(row.data(), dtype, row16.data(), size_t(K));
        uint16_t* dst = m.data_.data_mut<uint16_t>();
        for (int64_t k = 0; k < K; ++k) dst[base + size_t(k) * kPanel] = row16[size_t(k)];
      }
    }
  }
  return m;
}

void PackedMatrix::set_pieces(std::vector<int> bounds) {
  if (bounds.size() < 2 || bounds.front() != 0 || bounds.back() != cols_)
    throw std::invalid_argument("PackedMatrix::set_pieces: bounds must run from 0 to " +
                                std::to_string(cols_));
  for (size_t i = 1; i < bounds.size(); ++i)
    if (bounds[i] <= bounds[i - 1])
      throw std::invalid_argument("PackedMatrix::set_pieces: bounds must increase");
  piece_k_ = bounds.size() == 2 ? std::vector<int>{} : std::move(bounds);
}

void PackedMatrix::row_to_f32(int n, float* out) const {
  if (n < 0 || n >= rows_) throw std::out_of_range("PackedMatrix::row_to_f32: row out of range");
  const int p = n / kPanel, lane = n % kPanel;
  const size_t base = size_t(p) * size_t(cols_) * kPanel + size_t(lane);
  switch (dtype()) {
    case DType::F32: {
      const float* src = data_.data<float>();
      for (int k = 0; k < cols_; ++k) out[k] = src[base + size_t(k) * kPanel];
      return;
    }
    case DType::F16: {
      const uint16_t* src = data_.data<uint16_t>();
      for (int k = 0; k < cols_; ++k) out[k] = f16_to_f32(src[base + size_t(k) * kPanel]);
      return;
    }
    case DType::BF16: {
      const uint16_t* src = data_.data<uint16_t>();
      for (int k = 0; k < cols_; ++k) out[k] = bf16_to_f32(src[base + size_t(k) * kPanel]);
      return;
    }
  }
}

}  // namespace troupe
