#pragma once
// Strict UTF-8 validation, for text that is written back out as YAML or JSON
// (both Unicode; nlohmann's dump() throws on invalid UTF-8).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace troupe {

// Strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t n = lead < 0x80                   ? 1
                     : lead >= 0xC2 && lead < 0xE0 ? 2
                     : lead >= 0xE0 && lead < 0xF0 ? 3
                     : lead >= 0xF0 && lead < 0xF5 ? 4
                                                   : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? lead : lead & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = cp << 6 | (c & 0x3F);
    }
    const uint32_t min = n == 3 ? 0x800 : n == 4 ? 0x10000 : 0;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace troupe
