#pragma once
// SentencePiece's spellings: a byte-fallback piece, "<0xNN>", which its
// tokenizer.model and llama2.c's tokenizer.bin share, and a space.
#include <charconv>
#include <string>
#include <string_view>

namespace troupe {

// 0..255 for a piece spelled <0xNN>, else -1.
inline int byte_piece_value(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  int v = -1;
  const auto [end, ec] = std::from_chars(p.data() + 3, p.data() + 5, v, 16);
  return ec == std::errc() && end == p.data() + 5 ? v : -1;
}

// U+2581, SentencePiece's spelling of a space in its pieces.
inline constexpr std::string_view kSpmSpace = "\xe2\x96\x81";

// `s` with every U+2581 made a plain space.
inline std::string spm_spaces_to_ascii(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();)
    if (s.substr(i, kSpmSpace.size()) == kSpmSpace) {
      out += ' ';
      i += kSpmSpace.size();
    } else {
      out += s[i++];
    }
  return out;
}

}  // namespace troupe
