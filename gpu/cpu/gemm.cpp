#include "gpu/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace troupe {

namespace {

Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
  return Isa::Scalar;
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}

float load_weight(const PackedMatrix& w, int p, size_t index) {
  switch (w.dtype()) {
    case DType::F32:
      return static_cast<const float*>(w.panel(p))[index];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(w.panel(p))[index]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(w.panel(p))[index]);
  }
  return 0;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

Isa best_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

Isa active_isa() {
  return active().load(std::memory_order_relaxed);
}

void force_isa(Isa isa) {
  if (int(isa) > int(best_isa()))
    throw std::invalid_argument(std::string("this CPU does not support ") + isa_name(isa));
  active().store(isa);
}

void gemm_panels_scalar(const float* x, int M, int ldx, const PackedMatrix& w, int p0, int p1,
                        float* y, int ldy, size_t piece_stride) {
  const std::vector<int> bounds =
      w.piece_bounds().empty() ? std::vector<int>{0, w.cols()} : w.piece_bounds();
  for (int p = p0; p < p1; ++p) {
    for (int lane = 0; lane < kPanel; ++lane) {
      const int n = p * kPanel + lane;
      if (n >= w.rows()) break;
      for (int m = 0; m < M; ++m) {
        for (size_t piece = 0; piece + 1 < bounds.size(); ++piece) {
          float acc = 0.0f;
          for (int k = bounds[piece]; k < bounds[piece + 1]; ++k)
            acc = std::fma(x[size_t(m) * size_t(ldx) + size_t(k)],
                           load_weight(w, p, size_t(k) * kPanel + size_t(lane)), acc);
          float& out = y[piece * piece_stride + size_t(m) * size_t(ldy) + size_t(n)];
          out = piece > 0 && piece_stride == 0 ? out + acc : acc;
        }
      }
    }
  }
}

void gemm_panels(const float* x, int M, int ldx, const PackedMatrix& w, int p0, int p1, float* y,
                 int ldy, uint64_t pack_tag, size_t piece_stride) {
  switch (active_isa()) {
    case Isa::Avx512:
      return detail::gemm_avx512()(x, M, ldx, w.ref(), p0, p1, y, ldy, pack_tag, piece_stride);
    case Isa::Avx2:
      return detail::gemm_avx2()(x, M, ldx, w.ref(), p0, p1, y, ldy, pack_tag, piece_stride);
    case Isa::Scalar:
      return gemm_panels_scalar(x, M, ldx, w, p0, p1, y, ldy, piece_stride);
  }
}

void matmul(ThreadPool& pool, const float* x, int M, int ldx, const PackedMatrix& w, float* y,
            int ldy, size_t piece_stride) {
  const int panels = w.panels();
  // Small M (decode): chunks of 4 panels, many more than threads, so fast
  // threads take over slow ones. Large M (prefill): each chunk packs its copy
  // of x, so use one large chunk per thread (a multiple of 4 panels).
  const int per_thread_chunks = M <= 16 ? 0 : 1;
  int chunk = 4;
  if (per_thread_chunks > 0) {
    const int want = pool.size() * per_thread_chunks;
    chunk = std::max(4, (panels + want - 1) / want + 3) / 4 * 4;
  }
  const int chunks = (panels + chunk - 1) / chunk;
  static std::atomic<uint64_t> next_tag{1};
  const uint64_t tag = next_tag.fetch_add(1, std::memory_order_relaxed);
  pool.parallel_for(chunks, [&](int c, int) {
    const int p0 = c * chunk, p1 = std::min(panels, p0 + chunk);
    gemm_panels(x, M, ldx, w, p0, p1, y, ldy, tag, piece_stride);
  });
}

}  // namespace troupe
