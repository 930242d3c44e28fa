#include "text/unicode.h"

#include <algorithm>
#include <iterator>

namespace troupe::unicode {

namespace {

struct CategoryRange {
  char32_t first, last;
  GeneralCategory category;
};

constexpr CategoryRange kCategories[] = {
#include "text/unicode_data.inc"
};

// The valid second byte's range after each lead (Unicode's table 3-7);
// later bytes are 0x80..0xBF.
struct Lead {
  int length = 0;  // 0: not a lead byte
  uint8_t lo = 0x80, hi = 0xBF;
};

Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1};
  if (b >= 0xC2 && b <= 0xDF) return {2};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {};
}

// The sequence at `i`: how many bytes of it are a valid prefix (>= 1 unless
// `i` is not a lead), and whether it is complete.
struct Sequence {
  size_t valid = 0;
  bool complete = false;
  int length = 0;
};

Sequence sequence_at(std::string_view s, size_t i) {
  const Lead lead = lead_of(uint8_t(s[i]));
  if (lead.length == 0) return {};
  size_t n = 1;
  for (; n < size_t(lead.length) && i + n < s.size(); ++n) {
    const auto b = uint8_t(s[i + n]);
    const uint8_t lo = n == 1 ? lead.lo : 0x80, hi = n == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) break;
  }
  return {n, n == size_t(lead.length), lead.length};
}

char32_t code_point(std::string_view s, size_t i, int length) {
  const auto b = [&](size_t k) { return char32_t(uint8_t(s[i + k])); };
  switch (length) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

constexpr char32_t kReplacement = 0xFFFD;

struct Decomposition {
  char32_t cp, first, second;
};
constexpr Decomposition kDecompositions[] = {
#define TROUPE_NFC_DECOMPOSITIONS
#include "text/unicode_nfc.inc"
#undef TROUPE_NFC_DECOMPOSITIONS
};
struct CombiningClass {
  char32_t first, last;
  uint8_t ccc;
};
constexpr CombiningClass kCombiningClasses[] = {
#define TROUPE_NFC_COMBINING_CLASSES
#include "text/unicode_nfc.inc"
#undef TROUPE_NFC_COMBINING_CLASSES
};
struct Composition {
  char32_t first, second, composite;
};
constexpr Composition kCompositions[] = {
#define TROUPE_NFC_COMPOSITIONS
#include "text/unicode_nfc.inc"
#undef TROUPE_NFC_COMPOSITIONS
};

// Hangul syllables decompose and compose by arithmetic (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  const auto it = std::upper_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), cp,
                                   [](char32_t c, const CombiningClass& r) { return c < r.first; });
  if (it == std::begin(kCombiningClasses)) return 0;
  const CombiningClass& r = *std::prev(it);
  return cp <= r.last ? r.ccc : 0;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount) out += kTBase + s % kTCount;
    return;
  }
  const auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                                   [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == std::end(kDecompositions) || it->cp != cp) {
    out += cp;
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

// The primary composite of a pair, or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto it =
      std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::pair{a, b},
                       [](const Composition& c, const std::pair<char32_t, char32_t>& k) {
                         return c.first != k.first ? c.first < k.first : c.second < k.second;
                       });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

GeneralCategory general_category(char32_t cp) {
  const auto it = std::upper_bound(std::begin(kCategories), std::end(kCategories), cp,
                                   [](char32_t c, const CategoryRange& r) { return c < r.first; });
  if (it == std::begin(kCategories)) return GeneralCategory::Cn;
  const CategoryRange& r = *std::prev(it);
  return cp <= r.last ? r.category : GeneralCategory::Cn;
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

CodePoints decode_utf8(std::string_view text) {
  CodePoints out;
  out.points.reserve(text.size());
  out.offsets.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    const Sequence seq = sequence_at(text, i);
    out.offsets.push_back(uint32_t(i));
    if (seq.complete) {
      out.points.push_back(code_point(text, i, seq.length));
      i += size_t(seq.length);
    } else {
      out.points.push_back(kReplacement);
      i += std::max<size_t>(seq.valid, 1);
    }
  }
  out.offsets.push_back(uint32_t(text.size()));
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Sequence seq = sequence_at(bytes, i);
    if (seq.complete) {
      out.append(bytes.substr(i, size_t(seq.length)));
      i += size_t(seq.length);
    } else {
      append_utf8(out, kReplacement);
      i += std::max<size_t>(seq.valid, 1);
    }
  }
  return out;
}

std::string nfc(std::string_view text) {
  const CodePoints in = decode_utf8(text);
  // Nothing below U+0300 decomposes into what would not compose back.
  if (std::all_of(in.points.begin(), in.points.end(), [](char32_t c) { return c < 0x300; }))
    return std::string(text);
  std::u32string d;
  d.reserve(in.points.size() + 8);
  for (char32_t c : in.points) decompose(c, d);
  // Canonical order: each run of non-starters sorted by class, stably.
  for (size_t i = 1; i < d.size(); ++i)
    for (size_t j = i; j > 0; --j) {
      const uint8_t a = combining_class(d[j - 1]), b = combining_class(d[j]);
      if (b == 0 || a <= b) break;
      std::swap(d[j - 1], d[j]);
    }
  // Composition (UAX #15): a mark composes with the last starter unless a
  // mark of the same or a higher class stands between them.
  if (!d.empty()) {
    size_t starter = 0, out = 1;
    int last_class = combining_class(d[0]) ? 256 : 0;
    for (size_t i = 1; i < d.size(); ++i) {
      const char32_t c = d[i];
      const int cls = combining_class(c);
      const char32_t composite = compose(d[starter], c);
      if (composite && (last_class < cls || last_class == 0)) {
        d[starter] = composite;
        continue;
      }
      if (cls == 0) starter = out;
      last_class = cls;
      d[out++] = c;
    }
    d.resize(out);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : d) append_utf8(result, c);
  return result;
}

size_t incomplete_utf8_tail(std::string_view bytes) {
  const size_t from = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t i = bytes.size(); i > from;) {
    --i;
    if ((uint8_t(bytes[i]) & 0xC0) == 0x80) continue;  // a continuation byte
    const Sequence seq = sequence_at(bytes, i);
    return !seq.complete && seq.valid == bytes.size() - i ? seq.valid : 0;
  }
  return 0;
}

}  // namespace troupe::unicode
