#pragma once
// UTF-8 as the grammar matcher reads token bytes: whole code points, and
// the first bytes of one that the next token completes.
#include <cstdint>
#include <string_view>

namespace troupe::grammar {

// Bytes a sequence starting with `lead` has: 1-4, or 0 for a byte that
// cannot start one.
inline int utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // a continuation byte, or an overlong lead
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// The code point at the start of `s`; *len is its length in bytes, or 0 when
// the bytes are not valid UTF-8 there (also when `s` ends inside it).
inline uint32_t decode_utf8(std::string_view s, size_t* len) {
  *len = 0;
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const int n = utf8_length(b(0));
  if (n == 0 || s.size() < size_t(n)) return 0;
  if (n == 1) {
    *len = 1;
    return b(0);
  }
  uint32_t cp = b(0) & (0x7F >> n);
  for (int i = 1; i < n; ++i) {
    if ((b(size_t(i)) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(size_t(i)) & 0x3F);
  }
  // Overlong forms, surrogates and values past Unicode are not UTF-8.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  *len = size_t(n);
  return cp;
}

// The code points a sequence could be that starts with `prefix` (its first
// 1..length-1 bytes, valid so far): [*lo, *hi]. False if no code point
// starts with those bytes.
inline bool utf8_prefix_range(std::string_view prefix, uint32_t* lo, uint32_t* hi) {
  if (prefix.empty()) return false;
  const int n = utf8_length(static_cast<unsigned char>(prefix[0]));
  if (n < 2 || prefix.size() >= size_t(n)) return false;
  uint32_t v = static_cast<unsigned char>(prefix[0]) & (0x7F >> n);
  for (size_t i = 1; i < prefix.size(); ++i) {
    const auto c = static_cast<unsigned char>(prefix[i]);
    if ((c & 0xC0) != 0x80) return false;
    v = (v << 6) | (c & 0x3F);
  }
  const int missing = n - int(prefix.size());
  *lo = v << (6 * missing);
  *hi = *lo | ((1u << (6 * missing)) - 1);
  // Keep to what the lead can encode without overlong forms or overflow.
  const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
  if (*lo < min) *lo = min;
  if (*hi > 0x10FFFF) *hi = 0x10FFFF;
  return *lo <= *hi;
}

// `digits` hex digits of `text` from *pos on, read into *value (*pos moves
// past them); false, with *pos at the first that is not one, when too few.
inline bool read_hex(std::string_view text, size_t* pos, int digits, uint32_t* value) {
  uint32_t v = 0;
  for (int i = 0; i < digits; ++i, ++*pos) {
    const char h = *pos < text.size() ? text[*pos] : '\0';
    int d = -1;
    if (h >= '0' && h <= '9') d = h - '0';
    if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
    if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
    if (d < 0) return false;
    v = v * 16 + uint32_t(d);
  }
  *value = v;
  return true;
}

}  // namespace troupe::grammar
