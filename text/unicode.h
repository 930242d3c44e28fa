#pragma once
// The little of Unicode the tokenizers need: UTF-8 in and out, general
// categories and White_Space, for pre-tokenizer regexes such as
// `\p{L}+|\p{N}{1,3}|\s+(?!\S)`.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::unicode {

// clang-format off
enum class GeneralCategory : uint8_t {
  Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No,
  Pc, Pd, Ps, Pe, Pi, Pf, Po, Sm, Sc, Sk, So,
  Zs, Zl, Zp, Cc, Cf, Cs, Co, Cn,
};
// clang-format on
constexpr uint32_t category_bit(GeneralCategory c) {
  return 1u << static_cast<unsigned>(c);
}

GeneralCategory general_category(char32_t cp);
// The White_Space property (what `\s` matches in Unicode regex engines).
bool is_white_space(char32_t cp);

// A text as code points, each with the byte offset where it starts; a byte
// that does not start a valid UTF-8 sequence is one code point of its own,
// U+FFFD, so that offsets always cover the input.
struct CodePoints {
  std::u32string points;
  std::vector<uint32_t> offsets;  // points.size() + 1 entries; the last is the text's size
};
CodePoints decode_utf8(std::string_view text);

void append_utf8(std::string& out, char32_t cp);

// `bytes` as valid UTF-8: each maximal invalid subsequence becomes one U+FFFD,
// as Unicode recommends and Hugging Face's tokenizers (Rust's
// String::from_utf8_lossy) decode, so that decode(prefix) + decode(rest) ==
// decode(whole) when the cut is before a lead byte.
std::string utf8_lossy(std::string_view bytes);

// Unicode Normalization Form C (canonical decomposition, then composition),
// as Hugging Face's NFC normalizer computes it. Invalid UTF-8 comes out as
// U+FFFD.
std::string nfc(std::string_view text);

// How many bytes at the end of `bytes` are the valid start of a UTF-8
// sequence still waiting for its continuation bytes (0 if none).
size_t incomplete_utf8_tail(std::string_view bytes);

}  // namespace troupe::unicode
