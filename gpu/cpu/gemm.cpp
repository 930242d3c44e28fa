#include "gpu/cpu/gemm.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

namespace troupe {

namespace {

// vdpbf16ps against its emulation on products built to expose a different
// order or rounding (cancellations, sums that sit between two floats), with
// an odd piece and one row block and several. The emulation defines the
// values everywhere else, so an instruction that disagrees is not used.
bool bf16_instruction_matches_emulation() {
  const int N = 48, K = 301, M = 13;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(size_t(N) * K), x(size_t(M) * K);
  for (auto& v : w) v = normal(rng);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(normal(rng), int(i % 7) * 3 - 9);
  PackedMatrix packed =
      PackedMatrix::pack({Tensor::view(w.data(), {N, K}, DType::F32)}, DType::BF16);
  packed.set_pieces({0, 31, 200, K});
  for (int rows : {1, M}) {
    std::vector<float> native(size_t(rows) * N), emulated(size_t(rows) * N);
    detail::gemm_avx512_bf16()(x.data(), rows, K, packed.ref(), 0, packed.panels(), native.data(),
                               N, 0, 0);
    detail::gemm_avx512()(x.data(), rows, K, packed.ref(), 0, packed.panels(), emulated.data(), N,
                          0, 0);
    if (std::memcmp(native.data(), emulated.data(), native.size() * sizeof(float)) != 0)
      return false;
  }
  // Quantized weights reach the instruction through vcvtne2ps2bf16's
  // rounding (gemm_avx512_bf16.cpp), which must be bf16_for_product's: q8_0
  // blocks (a half-precision scale, 32 signed bytes) of seeded values.
  const int KQ = 320;
  std::vector<uint8_t> blocks(size_t(N) * KQ / 32 * 34);
  std::uniform_int_distribution<int> byte(-128, 127);
  for (size_t b = 0; b < blocks.size(); b += 34) {
    const uint16_t d = f32_to_f16(std::ldexp(normal(rng), int(b / 34 % 9) - 12));
    std::memcpy(&blocks[b], &d, 2);
    for (int i = 0; i < 32; ++i) blocks[b + 2 + size_t(i)] = uint8_t(byte(rng));
  }
  PackedMatrix quantized =
      PackedMatrix::pack({Tensor::blocks_view(blocks.data(), {N, KQ}, 8, nullptr)}, DType::BF16);
  quantized.set_pieces({0, 64, KQ});
  std::vector<float> xq(size_t(M) * KQ);
  for (auto& v : xq) v = normal(rng);
  for (int rows : {1, M}) {
    std::vector<float> native(size_t(rows) * N), emulated(size_t(rows) * N);
    detail::gemm_avx512_bf16()(xq.data(), rows, KQ, quantized.ref(), 0, quantized.panels(),
                               native.data(), N, 0, 0);
    detail::gemm_avx512()(xq.data(), rows, KQ, quantized.ref(), 0, quantized.panels(),
                          emulated.data(), N, 0, 0);
    if (!quantized.quantized() ||
        std::memcmp(native.data(), emulated.data(), native.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

Isa detect_isa() {
  __builtin_cpu_init();
  // The AVX-512 files are compiled with F, BW, VL and DQ (every AVX-512 CPU
  // but the Xeon Phi has all four).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    if (!__builtin_cpu_supports("avx512bf16")) return Isa::Avx512;
    if (bf16_instruction_matches_emulation()) return Isa::Avx512Bf16;
    spdlog::warn(
        "this CPU's vdpbf16ps differs from its documented rounding; bf16 products use the "
        "f32 emulation (same values, slower)");
    return Isa::Avx512;
  }
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

// Lane `lane` of panel p times row xm over piece `piece`: one chain.
float chain(const float* xm, const PackedMatrix& w, int p, int lane, int piece) {
  const int k0 = w.piece_bounds()[size_t(piece)], k1 = w.piece_bounds()[size_t(piece) + 1];
  float acc = 0.0f;
  if (w.quantized() && w.dtype() == DType::F32) {
    for (int k = k0; k < k1; ++k) acc = std::fma(xm[k], w.quant_weight(p, lane, k), acc);
    return acc;
  }
  if (w.quantized()) {  // bf16 pairs (k, k + 1): pieces are of even length
    auto bf16 = [](float v) { return bf16_to_f32(bf16_for_product(v)); };
    for (int k = k0; k < k1; k += 2) {
      acc = std::fma(bf16(xm[k + 1]), bf16(w.quant_weight(p, lane, k + 1)), acc);
      acc = std::fma(bf16(xm[k]), bf16(w.quant_weight(p, lane, k)), acc);
    }
    return acc;
  }
  if (w.dtype() != DType::BF16) {
    for (int k = k0; k < k1; ++k)
      acc = std::fma(xm[k], load_weight(w, p, size_t(k) * kPanel + size_t(lane)), acc);
    return acc;
  }
  // Pairs (k, k + 1), the odd product first; an odd piece's last pair has a
  // zero odd half.
  for (int s = w.piece_step(piece); s < w.piece_step(piece + 1); ++s) {
    const int k = k0 + 2 * (s - w.piece_step(piece));
    const size_t at = (size_t(s) * kPanel + size_t(lane)) * 2;
    const float x_odd = k + 1 < k1 ? bf16_to_f32(bf16_for_product(xm[k + 1])) : 0.0f;
    acc = std::fma(x_odd, load_weight(w, p, at + 1), acc);
    acc = std::fma(bf16_to_f32(bf16_for_product(xm[k])), load_weight(w, p, at), acc);
  }
  return acc;
}

// x's rows quantized for integer products (gemm_types.h), as the kernels
// quantize them.
struct Int8Copy {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
  Int8Rows rows;
  Int8Copy(const float* x, int M, int ldx, const PackedMatrix& w)
      : q(size_t(M) * size_t(w.cols())),
        d(size_t(M) * size_t(w.cols() / 16)),
        sum(d.size()),
        rows{q.data(), d.data(), sum.data(), w.cols()} {
    const PanelsRef ref = w.ref();
    for (int m = 0; m < M; ++m)
      quantize_int8_row(x + size_t(m) * size_t(ldx), ref.x_piece_k, ref.pieces, rows, m);
  }
};

// The integer products' chain (gemm_int8.inl) of lane `lane` of panel p and
// x8's row m over piece `piece`, a group at a time.
float int8_chain(const Int8Rows& x8, int m, const PackedMatrix& w, int p, int lane, int piece) {
  const int k0 = w.piece_bounds()[size_t(piece)], k1 = w.piece_bounds()[size_t(piece) + 1];
  const int8_t* xq = x8.q + size_t(m) * size_t(x8.K);
  const float* xd = x8.d + size_t(m) * size_t(x8.K / 16);
  const QuantPanel& qp = w.ref().quant[p];
  const int group = qp.group;
  float acc = 0.0f;
  for (int k = k0; k < k1; k += group) {
    int32_t i = 0, b = 0;
    float s = 0.0f, o = 0.0f;
    for (int j = 0; j < group; ++j) {
      const PackedMatrix::QuantValue v = w.quant_value(p, lane, k + j);
      i += v.q * xq[k + j];
      b += xq[k + j];
      s = v.s;
      o = v.o;
    }
    const float d = xd[k / 16];
    acc = std::fma(float(i), s * d, acc);
    if (qp.offset) acc = std::fma(o, d * float(b), acc);
  }
  return acc;
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
    case Isa::Avx512Bf16:
      return "avx512_bf16";
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

bool uses_vnni() {
  // The instruction where the CPU has it and the kernels are not held below
  // its best ISA (a test or benchmark forcing AVX-512 gets the emulation).
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  const Isa isa = active_isa();
  return has && isa == best_isa() && int(isa) >= int(Isa::Avx512);
}

void force_isa(Isa isa) {
  if (int(isa) > int(best_isa()))
    throw std::invalid_argument(std::string("this CPU does not support ") + isa_name(isa));
  active().store(isa);
}

void gemm_panels_scalar(const float* x, int M, int ldx, const PackedMatrix& w, int p0, int p1,
                        float* y, int ldy, size_t piece_stride) {
  const auto x8 = w.int8() ? std::make_unique<Int8Copy>(x, M, ldx, w) : nullptr;
  for (int p = p0; p < p1; ++p) {
    for (int lane = 0; lane < kPanel; ++lane) {
      const int n = p * kPanel + lane;
      if (n >= w.rows()) break;
      for (int m = 0; m < M; ++m) {
        for (int piece = 0; piece < w.pieces(); ++piece) {
          const float acc = x8 ? int8_chain(x8->rows, m, w, p, lane, piece)
                               : chain(x + size_t(m) * size_t(ldx), w, p, lane, piece);
          float& out = y[size_t(piece) * piece_stride + size_t(m) * size_t(ldy) + size_t(n)];
          out = piece > 0 && piece_stride == 0 ? out + acc : acc;
        }
      }
    }
  }
}

void gemm_panels(const float* x, int M, int ldx, const PackedMatrix& w, int p0, int p1, float* y,
                 int ldy, uint64_t pack_tag, size_t piece_stride) {
  if (w.int8() && uses_vnni())
    return detail::gemm_avx512_vnni()(x, M, ldx, w.ref(), p0, p1, y, ldy, pack_tag, piece_stride);
  switch (active_isa()) {
    case Isa::Avx512Bf16:
      if (w.dtype() == DType::BF16)
        return detail::gemm_avx512_bf16()(x, M, ldx, w.ref(), p0, p1, y, ldy, pack_tag,
                                          piece_stride);
      [[fallthrough]];
    case Isa::Avx512:
      return detail::gemm_avx512()(x, M, ldx, w.ref(), p0, p1, y, ldy, pack_tag, piece_stride);
    case Isa::Avx2:
      return detail::gemm_avx2()(x, M, ldx, w.ref(), p0, p1, y, ldy, pack_tag, piece_stride);
    case Isa::Scalar:
      return gemm_panels_scalar(x, M, ldx, w, p0, p1, y, ldy, piece_stride);
  }
}

// Rows per thread from which a product splits by rows: each thread then
// reads every weight, which 64 rows' multiply-adds per weight byte amortise.
constexpr int kRowSplitRows = 64;

void matmul(ThreadPool& pool, const float* x, int M, int ldx, const PackedMatrix& w, float* y,
            int ldy, size_t piece_stride) {
  const int panels = w.panels(), threads = pool.size();
  static std::atomic<uint64_t> next_tag{1};
  if (threads > 1 && M >= kRowSplitRows * threads) {
    // Many rows (prefill): each thread takes a share of them and every
    // panel, so it packs only its rows and keeps fewer of them in cache; the
    // weights are read once per thread, which at this many rows costs little.
    const uint64_t tag = next_tag.fetch_add(uint64_t(threads), std::memory_order_relaxed);
    const int share = (M + threads - 1) / threads;
    pool.parallel_for(threads, [&](int t, int) {
      const int m0 = t * share, m1 = std::min(M, m0 + share);
      if (m0 < m1)
        gemm_panels(x + size_t(m0) * size_t(ldx), m1 - m0, ldx, w, 0, panels,
                    y + size_t(m0) * size_t(ldy), ldy, tag + uint64_t(t), piece_stride);
    });
    return;
  }
  // Few rows (decode): chunks of 4 panels, many more than threads, so fast
  // threads take over slow ones. More: each chunk packs its copy of x, so
  // one chunk per thread, of equal size (the kernels take what is not a
  // multiple of their 4-panel group as one narrower group).
  const int chunk = M > 16 ? std::max(4, (panels + threads - 1) / threads) : 4;
  const int chunks = (panels + chunk - 1) / chunk;
  const uint64_t tag = next_tag.fetch_add(1, std::memory_order_relaxed);
  pool.parallel_for(chunks, [&](int c, int) {
    const int p0 = c * chunk, p1 = std::min(panels, p0 + chunk);
    gemm_panels(x, M, ldx, w, p0, p1, y, ldy, tag, piece_stride);
  });
}

}  // namespace troupe
