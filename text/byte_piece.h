#pragma once
// SentencePiece's spelling of a byte-fallback piece, "<0xNN>", which its
// tokenizer.model and llama2.c's tokenizer.bin share.
#include <charconv>
#include <string_view>

namespace troupe {

// 0..255 for a piece spelled <0xNN>, else -1.
inline int byte_piece_value(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  int v = -1;
  const auto [end, ec] = std::from_chars(p.data() + 3, p.data() + 5, v, 16);
  return ec == std::errc() && end == p.data() + 5 ? v : -1;
}

}  // namespace troupe
