#include "gpu/loaders/ggml_quants.h"

#include <cstring>
#include <iterator>
#include <stdexcept>

#include "gpu/dtype.h"

namespace troupe {
namespace {

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = float((qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 0x0F) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

// q5_0 (d, qh[4], qs[16]; values offset by 16) and q5_1 (d, m, qh[4],
// qs[16]): the fifth bit of element j is bit j of qh.
void q5(const uint8_t* b, float* y, bool with_min) {
  const float d = half(b), m = with_min ? half(b + 2) : 0.0f;
  const uint8_t* qh_bytes = b + (with_min ? 4 : 2);
  const uint8_t* qs = qh_bytes + 4;
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0F) | int(((qh >> j) << 4) & 0x10);
    const int x1 = (qs[j] >> 4) | int((qh >> (j + 12)) & 0x10);
    if (with_min) {
      y[j] = float(x0) * d + m;
      y[j + 16] = float(x1) * d + m;
    } else {
      y[j] = float(x0 - 16) * d;
      y[j + 16] = float(x1 - 16) * d;
    }
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = float(qs[j]) * d;
}

// Layout: scales[16], qs[64], d, dmin.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half(b + 80), min = half(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int half_block = 0; half_block < 2; ++half_block) {
        const uint8_t sc = scales[is++];
        const float dl = d * float(sc & 0xF), ml = min * float(sc >> 4);
        const uint8_t* qq = q + 16 * half_block;
        for (int l = 0; l < 16; ++l) *y++ = dl * float((qq[l] >> shift) & 3) - ml;
      }
}

// Layout: hmask[32], qs[64], scales[12] (sixteen 6-bit scales), d.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const float d_all = half(b + 108);
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 256; n += 128, q += 32)
    for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1))
      for (int half_block = 0; half_block < 2; ++half_block) {
        const float dl = d_all * float(scales[is++] - 32);
        const int o = 16 * half_block;
        for (int l = 0; l < 16; ++l)
          *y++ = dl * float(int((q[o + l] >> shift) & 3) - ((hm[o + l] & m) ? 0 : 4));
      }
}

// The j-th of eight 6-bit (scale, min) pairs packed in 12 bytes (q4_K, q5_K).
void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// q4_K: d, dmin, scales[12], qs[128]; q5_K adds qh[32] before qs.
void q45_k(const uint8_t* b, float* y, bool five) {
  const float d = half(b), min = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = five ? b + 48 : b + 16;
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2, ql += 32, u1 = uint8_t(u1 << 2), u2 = uint8_t(u2 << 2)) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * float(sc), m1 = min * float(m);
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * float(sc), m2 = min * float(m);
    for (int l = 0; l < 32; ++l)
      *y++ = d1 * float((ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ = d2 * float((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
  }
}

// Layout: ql[128], qh[64], scales[16] (int8), d.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
}

// The sixteen non-linear levels of iq4_nl and iq4_xs.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// Layout: d, qs[16].
void iq4_nl(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(kIq4Levels[qs[j] & 0xf]);
    y[j + 16] = d * float(kIq4Levels[qs[j] >> 4]);
  }
}

// Layout: d, scales_h (u16), scales_l[4], qs[128]: eight sub-blocks of 32
// with 6-bit scales.
void iq4_xs(const uint8_t* b, float* y) {
  const float d = half(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, y += 32, qs += 16) {
    const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
    const float dl = d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * float(kIq4Levels[qs[j] & 0xf]);
      y[j + 16] = dl * float(kIq4Levels[qs[j] >> 4]);
    }
  }
}

// One block to f32, by ggml type id.
using BlockFn = void (*)(const uint8_t*, float*);
constexpr BlockFn kBlockKernels[] = {
    nullptr,                                                 // 0 f32
    nullptr,                                                 // 1 f16
    q4_0,                                                    // 2
    q4_1,                                                    // 3
    nullptr,                                                 // 4
    nullptr,                                                 // 5
    [](const uint8_t* b, float* y) { q5(b, y, false); },     // 6 q5_0
    [](const uint8_t* b, float* y) { q5(b, y, true); },      // 7 q5_1
    q8_0,                                                    // 8
    nullptr,                                                 // 9 q8_1
    q2_k,                                                    // 10
    q3_k,                                                    // 11
    [](const uint8_t* b, float* y) { q45_k(b, y, false); },  // 12 q4_K
    [](const uint8_t* b, float* y) { q45_k(b, y, true); },   // 13 q5_K
    q6_k,                                                    // 14
    nullptr,                                                 // 15 q8_K
    nullptr,                                                 // 16 iq2_xxs
    nullptr,                                                 // 17 iq2_xs
    nullptr,                                                 // 18 iq3_xxs
    nullptr,                                                 // 19 iq1_s
    iq4_nl,                                                  // 20
    nullptr,                                                 // 21 iq3_s
    nullptr,                                                 // 22 iq2_s
    iq4_xs,                                                  // 23
};

}  // namespace

void dequantize_row(uint32_t id, const uint8_t* src, float* dst, int64_t n) {
  const GgmlType* t = ggml_type(id);
  if (!t || !t->dequantizable)
    throw std::invalid_argument("dequantize_row: " + ggml_type_name(id) + " is not dequantizable");
  if (id == kGgmlF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  if (id == kGgmlF16 || id == kGgmlBF16) {
    convert_to_f32(src, id == kGgmlF16 ? DType::F16 : DType::BF16, dst, size_t(n));
    return;
  }
  const BlockFn kernel = id < std::size(kBlockKernels) ? kBlockKernels[id] : nullptr;
  if (!kernel) throw std::logic_error("dequantize_row: no kernel for " + ggml_type_name(id));
  for (int64_t i = 0; i < n / t->block; ++i, src += t->bytes, dst += t->block) kernel(src, dst);
}

}  // namespace troupe
