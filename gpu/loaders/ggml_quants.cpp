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

// Each block is written as its parts (ggml_quants.h): q, one scale per
// group and, for the forms with one, one offset per group. The products
// q * s are those ggml's dequantize_row_* forms, and exact, so q * s + o
// rounds once as ggml's expressions do.

void q4_0(const uint8_t* b, int8_t* q, float* s, float* o) {
  // ggml's (q - 8) * d is exact, and so is q * d - 8 * d.
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t(qs[j] & 0x0F);
    q[j + 16] = int8_t(qs[j] >> 4);
  }
  s[0] = d;
  o[0] = -8.0f * d;
}

void q4_1(const uint8_t* b, int8_t* q, float* s, float* o) {
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t(qs[j] & 0x0F);
    q[j + 16] = int8_t(qs[j] >> 4);
  }
  s[0] = half(b);
  o[0] = half(b + 2);
}

// q5_0 (d, qh[4], qs[16]; values offset by 16) and q5_1 (d, m, qh[4],
// qs[16]): the fifth bit of element j is bit j of qh.
void q5(const uint8_t* b, int8_t* q, float* s, float* o, bool with_min) {
  const uint8_t* qh_bytes = b + (with_min ? 4 : 2);
  const uint8_t* qs = qh_bytes + 4;
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const int bias = with_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t(((qs[j] & 0x0F) | int(((qh >> j) << 4) & 0x10)) - bias);
    q[j + 16] = int8_t(((qs[j] >> 4) | int((qh >> (j + 12)) & 0x10)) - bias);
  }
  s[0] = half(b);
  if (with_min) o[0] = half(b + 2);
}

void q8_0(const uint8_t* b, int8_t* q, float* s, float*) {
  s[0] = half(b);
  std::memcpy(q, b + 2, 32);
}

// Layout: scales[16], qs[64], d, dmin.
void q2_k(const uint8_t* b, int8_t* q, float* s, float* o) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half(b + 80), min = half(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128, qs += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int half_block = 0; half_block < 2; ++half_block, ++is) {
        s[is] = d * float(scales[is] & 0xF);
        o[is] = -(min * float(scales[is] >> 4));
        const uint8_t* qq = qs + 16 * half_block;
        for (int l = 0; l < 16; ++l) *q++ = int8_t((qq[l] >> shift) & 3);
      }
}

// Layout: hmask[32], qs[64], scales[12] (sixteen 6-bit scales), d.
void q3_k(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
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
  for (int n = 0; n < 256; n += 128, qs += 32)
    for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1))
      for (int half_block = 0; half_block < 2; ++half_block, ++is) {
        s[is] = d_all * float(scales[is] - 32);
        const int at = 16 * half_block;
        for (int l = 0; l < 16; ++l)
          *q++ = int8_t(int((qs[at + l] >> shift) & 3) - ((hm[at + l] & m) ? 0 : 4));
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
void q45_k(const uint8_t* b, int8_t* q, float* s, float* o, bool five) {
  const float d = half(b), min = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = five ? b + 48 : b + 16;
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2, ql += 32, u1 = uint8_t(u1 << 2), u2 = uint8_t(u2 << 2)) {
    for (int j = 0; j < 2; ++j) {
      uint8_t sc, m;
      scale_min_k4(is + j, scales, sc, m);
      s[is + j] = d * float(sc);
      o[is + j] = -(min * float(m));
    }
    for (int l = 0; l < 32; ++l) *q++ = int8_t((ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0));
    for (int l = 0; l < 32; ++l) *q++ = int8_t((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0));
  }
}

// Layout: ql[128], qh[64], scales[16] (int8), d. ggml's d * sc * q is
// (d * sc) * q.
void q6_k(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int i = 0; i < 16; ++i) s[i] = d * float(sc[i]);
  for (int n = 0; n < 256; n += 128, q += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      q[l] = int8_t(int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      q[l + 32] = int8_t(int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      q[l + 64] = int8_t(int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      q[l + 96] = int8_t(int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
}

// The sixteen non-linear levels of iq4_nl and iq4_xs.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// Layout: d, qs[16].
void iq4_nl(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4Levels[qs[j] & 0xf];
    q[j + 16] = kIq4Levels[qs[j] >> 4];
  }
  s[0] = half(b);
}

// Layout: d, scales_h (u16), scales_l[4], qs[128]: eight sub-blocks of 32
// with 6-bit scales.
void iq4_xs(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, q += 32, qs += 16) {
    const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
    s[ib] = d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      q[j] = kIq4Levels[qs[j] & 0xf];
      q[j + 16] = kIq4Levels[qs[j] >> 4];
    }
  }
}

// One block's parts, by ggml type id, and the form they take.
using PartsFn = void (*)(const uint8_t*, int8_t*, float*, float*);
struct Kind {
  PartsFn parts;
  QuantForm form;
};
constexpr Kind kKinds[] = {
    {nullptr, {}},                                                                    // 0 f32
    {nullptr, {}},                                                                    // 1 f16
    {q4_0, {4, 32, true, 0, 0}},                                                      // 2
    {q4_1, {4, 32, true, 0, 2}},                                                      // 3
    {nullptr, {}},                                                                    // 4
    {nullptr, {}},                                                                    // 5
    {[](const uint8_t* b, int8_t* q, float* s, float* o) { q5(b, q, s, o, false); },  // 6 q5_0
     {8, 32, false, 0}},
    {[](const uint8_t* b, int8_t* q, float* s, float* o) { q5(b, q, s, o, true); },  // 7 q5_1
     {8, 32, true, 0, 2}},
    {q8_0, {8, 32, false, 0}},                                                           // 8
    {nullptr, {}},                                                                       // 9 q8_1
    {q2_k, {4, 16, true, 80, 82}},                                                       // 10
    {q3_k, {8, 16, false, 108}},                                                         // 11
    {[](const uint8_t* b, int8_t* q, float* s, float* o) { q45_k(b, q, s, o, false); },  // 12 q4_K
     {4, 32, true, 0, 2}},
    {[](const uint8_t* b, int8_t* q, float* s, float* o) { q45_k(b, q, s, o, true); },  // 13 q5_K
     {8, 32, true, 0, 2}},
    {q6_k, {8, 16, false, 208}},  // 14
    {nullptr, {}},                // 15 q8_K
    {nullptr, {}},                // 16 iq2_xxs
    {nullptr, {}},                // 17 iq2_xs
    {nullptr, {}},                // 18 iq3_xxs
    {nullptr, {}},                // 19 iq1_s
    {iq4_nl, {8, 32, false, 0}},  // 20
    {nullptr, {}},                // 21 iq3_s
    {nullptr, {}},                // 22 iq2_s
    {iq4_xs, {8, 32, false, 0}},  // 23
};

const Kind* kind(uint32_t id) {
  return id < std::size(kKinds) && kKinds[id].parts ? &kKinds[id] : nullptr;
}

}  // namespace

const QuantForm* quant_form(uint32_t id) {
  const Kind* k = kind(id);
  return k ? &k->form : nullptr;
}

void quant_parts(uint32_t id, const uint8_t* src, int8_t* q, float* s, float* o, int64_t n) {
  const Kind* k = kind(id);
  if (!k) throw std::invalid_argument("quant_parts: " + ggml_type_name(id) + " has no parts");
  const int64_t block = ggml_type(id)->block, groups = block / k->form.group;
  const size_t bytes = ggml_type(id)->bytes;
  for (int64_t i = 0; i < n / block; ++i, src += bytes, q += block, s += groups) {
    k->parts(src, q, s, o);
    if (o) o += groups;
  }
}

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
  const Kind* k = kind(id);
  if (!k) throw std::logic_error("dequantize_row: no kernel for " + ggml_type_name(id));
  // A block at a time, so that the parts stay on the stack.
  constexpr int kMaxBlock = 256;
  int8_t q[kMaxBlock];
  float s[kMaxBlock / 16], o[kMaxBlock / 16];
  const int G = k->form.group;
  for (int64_t i = 0; i < n / t->block; ++i, src += t->bytes, dst += t->block) {
    k->parts(src, q, s, o);
    for (int64_t j = 0; j < t->block; ++j)
      dst[j] = k->form.offset ? float(q[j]) * s[j / G] + o[j / G] : float(q[j]) * s[j / G];
  }
}

}  // namespace troupe
