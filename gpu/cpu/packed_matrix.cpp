#include "gpu/cpu/packed_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu/loaders/ggml_quants.h"
#include "util/gguf_file.h"

namespace troupe {

namespace {

// lay(p0, p1) for ranges of panels, on several threads for big matrices (a
// model's load time is mostly packing); each panel's bytes are the same.
template <class F>
void for_panel_ranges(int panels, int64_t elements, F&& lay) {
  constexpr int64_t kElementsPerThread = int64_t(1) << 22;
  const int threads = int(std::clamp<int64_t>(
      std::min<int64_t>(std::thread::hardware_concurrency(), elements / kElementsPerThread), 1, 8));
  if (threads == 1) return lay(0, panels);
  std::vector<std::future<void>> parts;
  const int per = (panels + threads - 1) / threads;
  for (int p = 0; p < panels; p += per)
    parts.push_back(std::async(std::launch::async, lay, p, std::min(panels, p + per)));
  for (auto& part : parts) part.get();  // rethrows a row's error
}

// Lane `lane`'s factors of group g (of the blocks at span) and its
// integers, for the integer layout (gemm_types.h): d and e copied from the
// block, a = s / d and b = o / e, which must give s and o back exactly.
void int8_factors(const Tensor& blocks, const Tensor::BlockSpan& span, size_t g, float s, float o,
                  const QuantPanel& qp, uint8_t* factors, uint8_t* ints, int lane) {
  const QuantForm& form = *quant_form(blocks.block_type());
  const GgmlType& type = *ggml_type(blocks.block_type());
  const uint8_t* block = span.data + g * size_t(qp.group) / size_t(type.block) * type.bytes;
  auto factor = [&](int at, float v, uint8_t* f16_out, uint8_t* int_out) {
    uint16_t h;
    std::memcpy(&h, block + at, 2);
    std::memcpy(f16_out + lane * 2, &h, 2);
    const float f = f16_to_f32(h);
    // A zero or infinite factor keeps the sign (or NaN) that s has.
    const float a = f != 0.0f && std::isfinite(f)        ? std::nearbyint(v / f)
                    : std::isnan(v)                      ? 0.0f
                    : std::signbit(v) == std::signbit(f) ? 1.0f
                                                         : -1.0f;
    const float back = std::clamp(a, -128.0f, 127.0f) * f;
    if (std::memcmp(&back, &v, 4) != 0 && !(std::isnan(back) && std::isnan(v)))
      throw std::logic_error(std::string("PackedMatrix: a ") + type.name +
                             " scale is not its block's factor times a small integer");
    int_out[lane] = uint8_t(int8_t(a));
  };
  factor(form.d_at, s, factors, ints);
  if (qp.offset) factor(form.e_at, o, factors + kPanel * 2, ints + kPanel);
}

// Whether the row blocks can stay quantized (PackedMatrix::pack).
bool keeps_blocks(const std::vector<Tensor>& row_blocks) {
  for (size_t i = 0; i < row_blocks.size(); ++i) {
    const Tensor& b = row_blocks[i];
    if (!b.is_blocks() || !quant_form(b.block_type())) return false;
    const int group = quant_form(b.block_type())->group;  // a column window keeps whole groups
    if (b.block_span(0).col0 % group != 0 || b.dim(1) % group != 0) return false;
    if (i + 1 < row_blocks.size() && b.dim(0) % kPanel != 0) return false;  // a panel would mix
  }
  return true;
}

}  // namespace

PackedMatrix PackedMatrix::pack(const std::vector<Tensor>& row_blocks, DType dtype,
                                QuantProducts products) {
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
  const bool int8 = products == QuantProducts::Int8;
  if ((int8 || dtype == DType::F32 || dtype == DType::BF16) && keeps_blocks(row_blocks)) {
    m.quant_dtype_ = int8 ? DType::F32 : dtype;  // int8: the steps are k, the sums f32
    m.int8_ = int8;
    m.lay_out_quantized(row_blocks);
    return m;
  }
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
  for_panel_ranges(panels(), int64_t(rows_) * cols_, lay_panels);
}

namespace {
// k steps: k, or in bf16 the pairs (pieces cut no group, so are of even length).
std::vector<int> quant_steps(std::vector<int> bounds, DType dtype) {
  if (dtype == DType::BF16)
    for (int& b : bounds) b /= 2;
  return bounds;
}
}  // namespace

void PackedMatrix::lay_out_quantized(const std::vector<Tensor>& row_blocks) {
  step_k_ = quant_steps(piece_k_, quant_dtype_);
  // Each panel takes the form of the block its rows come from; the panel
  // past the last row (if any is partial) is zero, so its weights are 0.
  quant_.resize(size_t(panels()));
  std::vector<std::pair<const Tensor*, int64_t>> source(
      static_cast<size_t>(panels()));  // block, first row
  uint64_t at = 0;
  int64_t first = 0;
  for (const Tensor& b : row_blocks) {
    const QuantForm& form = *quant_form(b.block_type());
    const int64_t block = ggml_type(b.block_type())->block;
    int shift = 0;
    while ((int64_t(form.group) << shift) < block) ++shift;
    const int skip = int(b.block_span(0).col0 % block / form.group);
    for (int64_t r = first; r < first + b.dim(0); r += kPanel) {
      const size_t p = size_t(r / kPanel);
      quant_[p] = QuantPanel{at,          uint8_t(form.bits), uint8_t(form.group),
                             form.offset, uint8_t(shift),     uint8_t(skip)};
      source[p] = {&b, first};
      at += int8_ ? quant_[p].int_bytes(cols_ / form.group)
                  : quant_[p].group_bytes() * size_t(cols_ / form.group);
    }
    first += b.dim(0);
  }
  data_ = Tensor::zeros({int64_t((at + 3) / 4)}, DType::F32);
  auto lay_panels = [&](int p0, int p1) {
    std::vector<int8_t> q;
    std::vector<float> s, o;
    for (int p = p0; p < p1; ++p) {
      const QuantPanel& qp = quant_[size_t(p)];
      const auto& [block, block_first] = source[size_t(p)];
      const size_t s_bytes = qp.head_bytes();
      for (int lane = 0; lane < kPanel; ++lane) {
        const int64_t n = int64_t(p) * kPanel + lane;
        if (n >= block_first + block->dim(0)) break;
        // The parts of the blocks the columns lie in, of which the columns
        // are whole groups.
        const Tensor::BlockSpan span = block->block_span(n - block_first);
        q.resize(size_t(span.elements));
        s.resize(size_t(span.elements / qp.group));
        o.resize(s.size());
        const size_t q0 = size_t(span.col0), g0 = q0 / qp.group;
        quant_parts(block->block_type(), span.data, q.data(), s.data(),
                    qp.offset ? o.data() : nullptr, span.elements);
        auto* panel = static_cast<uint8_t*>(data_.raw_mut()) + qp.at;
        for (int g = 0; g < cols_ / qp.group; ++g) {
          uint8_t* qs;
          if (int8_) {
            int8_factors(*block, span, g0 + size_t(g), s[g0 + size_t(g)], o[g0 + size_t(g)], qp,
                         panel + qp.factors_at(g), panel + qp.int_group_at(g), lane);
            qs = panel + qp.int_group_at(g) + qp.int_head_bytes();
          } else {
            uint8_t* gp = panel + size_t(g) * qp.group_bytes();
            std::memcpy(gp + lane * 4, &s[g0 + size_t(g)], 4);
            if (qp.offset) std::memcpy(gp + kPanel * 4 + lane * 4, &o[g0 + size_t(g)], 4);
            qs = gp + s_bytes;
          }
          for (int j = 0; j < qp.group; ++j) {
            const int v = q[q0 + size_t(g * qp.group + j)];
            const QuantPanel::QAt a = qp.q_at(lane, j, int8_);
            if (qp.bits == 8)
              qs[a.byte] = uint8_t(int8_ ? v + 128 : v);
            else
              qs[a.byte] |= uint8_t(v << a.shift);
          }
        }
      }
    }
  };
  for_panel_ranges(panels(), int64_t(rows_) * cols_, lay_panels);
}

PackedMatrix::QuantValue PackedMatrix::quant_value(int p, int lane, int k) const {
  const QuantPanel& qp = quant_[size_t(p)];
  const auto* panel = static_cast<const uint8_t*>(data_.raw()) + qp.at;
  const int g = k / qp.group;
  QuantValue v{0, 0.0f, 0.0f};
  const uint8_t* qs;
  if (int8_) {
    const uint8_t* f = panel + qp.factors_at(g);
    const uint8_t* ints = panel + qp.int_group_at(g);
    auto factor = [&](const uint8_t* f16, int8_t a) {
      uint16_t h;
      std::memcpy(&h, f16 + lane * 2, 2);
      return float(a) * f16_to_f32(h);  // exact (ggml_quants.h)
    };
    v.s = factor(f, int8_t(ints[lane]));
    if (qp.offset) v.o = factor(f + kPanel * 2, int8_t(ints[kPanel + lane]));
    qs = ints + qp.int_head_bytes();
  } else {
    const uint8_t* gp = panel + size_t(g) * qp.group_bytes();
    std::memcpy(&v.s, gp + lane * 4, 4);
    if (qp.offset) std::memcpy(&v.o, gp + kPanel * 4 + lane * 4, 4);
    qs = gp + qp.head_bytes();
  }
  const QuantPanel::QAt a = qp.q_at(lane, k % qp.group, int8_);
  const uint8_t byte = qs[a.byte];
  v.q = qp.bits == 4 ? (byte >> a.shift) & 0xF : int8_ ? int(byte) - 128 : int(int8_t(byte));
  return v;
}

float PackedMatrix::quant_weight(int p, int lane, int k) const {
  const QuantValue v = quant_value(p, lane, k);
  // q * s is exact (ggml_quants.h): the sum rounds once, fused or not.
  return quant_[size_t(p)].offset ? float(v.q) * v.s + v.o : float(v.q) * v.s;
}

void PackedMatrix::set_pieces(std::vector<int> bounds) {
  if (bounds.size() < 2 || bounds.front() != 0 || bounds.back() != cols_)
    throw std::invalid_argument("PackedMatrix::set_pieces: bounds must run from 0 to " +
                                std::to_string(cols_));
  for (size_t i = 1; i < bounds.size(); ++i)
    if (bounds[i] <= bounds[i - 1])
      throw std::invalid_argument("PackedMatrix::set_pieces: bounds must increase");
  bool cuts_groups = false;
  for (const QuantPanel& qp : quant_)
    for (int b : bounds) cuts_groups = cuts_groups || b % qp.group != 0;
  if (quantized() && !cuts_groups) {
    piece_k_ = std::move(bounds);
    step_k_ = quant_steps(piece_k_, quant_dtype_);
    return;
  }
  if (dtype() != DType::BF16 && !cuts_groups) {
    piece_k_ = std::move(bounds);
    step_k_ = piece_k_;
    return;
  }
  // Pairs restart at each piece, or the bounds cut quantized groups: lay
  // the rows out again from the old layout (the same values).
  const PackedMatrix old = *this;
  const DType dtype_now = dtype();
  piece_k_ = std::move(bounds);
  quant_.clear();
  int8_ = false;
  lay_out(dtype_now, [&](int n, float* out) { old.row_to_f32(n, out); });
}

void PackedMatrix::row_to_f32(int n, float* out) const {
  if (n < 0 || n >= rows_) throw std::out_of_range("PackedMatrix::row_to_f32: row out of range");
  if (quantized()) {
    for (int k = 0; k < cols_; ++k) {
      const float w = quant_weight(n / kPanel, n % kPanel, k);
      out[k] = quant_dtype_ == DType::BF16 ? bf16_to_f32(bf16_for_product(w)) : w;
    }
    return;
  }
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
