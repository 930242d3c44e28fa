#include "gpu/cpu/packed_matrix.h"

#include <algorithm>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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
  m.piece_k_ = {0, m.cols_};
  // Rows may be asked for from several threads, in any order.
  m.lay_out(dtype, [&](int n, float* out) {
    int64_t first = 0;  // the block's first row
    size_t block = 0;
    while (n - first >= row_blocks[block].dim(0)) first += row_blocks[block++].dim(0);
    row_blocks[block].row_to_f32(n - first, out);
  });
  return m;
}

template <class F>
void PackedMatrix::for_each_k(int lane, F&& f) const {
  for (size_t p = 0; p + 1 < piece_k_.size(); ++p)
    for (int k = piece_k_[p]; k < piece_k_[p + 1]; ++k) {
      if (dtype() != DType::BF16) {
        f(k, size_t(k) * kPanel + size_t(lane));
      } else {
        const int local = k - piece_k_[p];
        f(k, (size_t(step_k_[p] + local / 2) * kPanel + size_t(lane)) * 2 + size_t(local % 2));
      }
    }
}

template <class RowFn>
void PackedMatrix::lay_out(DType dtype, RowFn&& row_of) {
  step_k_.assign(piece_k_.size(), 0);
  for (size_t p = 1; p < piece_k_.size(); ++p) {
    const int len = piece_k_[p] - piece_k_[p - 1];
    step_k_[p] = step_k_[p - 1] + (dtype == DType::BF16 ? (len + 1) / 2 : len);
  }
  // Zeros also fill the odd halves that end odd pieces, and rows past N.
  const int64_t per_row = dtype == DType::BF16 ? 2 * int64_t(steps()) : int64_t(steps());
  data_ = Tensor::zeros({int64_t(panels()) * kPanel, per_row}, dtype);
  // Panels are laid out apart, so big matrices take several threads (a
  // model's load time is mostly this); each row's bytes are the same.
  auto lay_panels = [&](int p0, int p1) {
    std::vector<float> row(static_cast<size_t>(cols_));
    std::vector<uint16_t> row16(static_cast<size_t>(cols_));
    for (int n = p0 * kPanel; n < std::min(rows_, p1 * kPanel); ++n) {
      row_of(n, row.data());
      const int lane = n % kPanel;
      void* base = static_cast<char*>(data_.raw_mut()) +
                   size_t(n / kPanel) * size_t(steps()) * kPanel * step_bytes();
      switch (dtype) {
        case DType::F32:
          for_each_k(lane, [&](int k, size_t i) { static_cast<float*>(base)[i] = row[size_t(k)]; });
          break;
        case DType::F16:
          convert_from_f32(row.data(), dtype, row16.data(), row.size());
          for_each_k(lane,
                     [&](int k, size_t i) { static_cast<uint16_t*>(base)[i] = row16[size_t(k)]; });
          break;
        case DType::BF16:
          for_each_k(lane, [&](int k, size_t i) {
            static_cast<uint16_t*>(base)[i] = bf16_for_product(row[size_t(k)]);
          });
          break;
      }
    }
  };
  constexpr int64_t kElementsPerThread = int64_t(1) << 22;
  const int threads =
      int(std::clamp<int64_t>(std::min<int64_t>(std::thread::hardware_concurrency(),
                                                int64_t(rows_) * cols_ / kElementsPerThread),
                              1, 8));
  if (threads == 1) return lay_panels(0, panels());
  std::vector<std::future<void>> parts;
  const int per = (panels() + threads - 1) / threads;
  for (int p = 0; p < panels(); p += per)
    parts.push_back(std::async(std::launch::async, lay_panels, p, std::min(panels(), p + per)));
  for (auto& part : parts) part.get();  // rethrows a row's error
}

void PackedMatrix::set_pieces(std::vector<int> bounds) {
  if (bounds.size() < 2 || bounds.front() != 0 || bounds.back() != cols_)
    throw std::invalid_argument("PackedMatrix::set_pieces: bounds must run from 0 to " +
                                std::to_string(cols_));
  for (size_t i = 1; i < bounds.size(); ++i)
    if (bounds[i] <= bounds[i - 1])
      throw std::invalid_argument("PackedMatrix::set_pieces: bounds must increase");
  if (dtype() != DType::BF16) {
    piece_k_ = std::move(bounds);
    step_k_ = piece_k_;
    return;
  }
  // Pairs restart at each piece: lay the rows out again from the old layout.
  const PackedMatrix old = *this;
  piece_k_ = std::move(bounds);
  lay_out(DType::BF16, [&](int n, float* out) { old.row_to_f32(n, out); });
}

void PackedMatrix::row_to_f32(int n, float* out) const {
  if (n < 0 || n >= rows_) throw std::out_of_range("PackedMatrix::row_to_f32: row out of range");
  const void* base = panel(n / kPanel);
  switch (dtype()) {
    case DType::F32:
      for_each_k(n % kPanel, [&](int k, size_t i) { out[k] = static_cast<const float*>(base)[i]; });
      return;
    case DType::F16:
      for_each_k(n % kPanel, [&](int k, size_t i) {
        out[k] = f16_to_f32(static_cast<const uint16_t*>(base)[i]);
      });
      return;
    case DType::BF16:
      for_each_k(n % kPanel, [&](int k, size_t i) {
        out[k] = bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
      });
      return;
  }
}

}  // namespace troupe
