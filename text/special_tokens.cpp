#include "text/special_tokens.h"

#include <utility>

#include "text/unicode.h"

namespace troupe {

namespace {

// The code point that ends just before byte `end` of `text` and where it
// starts; U+FFFD for a stray byte.
std::pair<char32_t, size_t> code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (uint8_t(text[start]) & 0xC0) == 0x80) --start;
  const auto cps = unicode::decode_utf8(text.substr(start, end - start));
  if (cps.points.size() == 1) return {cps.points[0], start};
  return {0xFFFD, end - 1};
}

char32_t code_point_at(std::string_view text, size_t at) {
  const auto cps = unicode::decode_utf8(text.substr(at, std::min<size_t>(4, text.size() - at)));
  return cps.points.empty() ? 0 : cps.points[0];
}

bool is_word_char(char32_t c) {
  using G = unicode::GeneralCategory;
  const auto cat = unicode::general_category(c);
  return c == '_' || cat <= G::Lo || (cat >= G::Nd && cat <= G::No);
}

}  // namespace

void SpecialTokens::add(Token token) {
  if (!token.spelling.empty()) tokens_.push_back(std::move(token));
}

void SpecialTokens::split(std::string_view text,
                          const std::function<void(std::string_view)>& on_text,
                          const std::function<void(int id)>& on_token) const {
  std::vector<size_t> next(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) next[i] = text.find(tokens_[i].spelling);
  // A single-word token's place that touches a word is skipped: the search
  // for that spelling goes on past it.
  const auto acceptable = [&](size_t i, size_t at) {
    const Token& t = tokens_[i];
    if (!t.single_word) return true;
    const size_t end = at + t.spelling.size();
    if (at > 0 && is_word_char(code_point_before(text, at).first)) return false;
    return end >= text.size() || !is_word_char(code_point_at(text, end));
  };
  size_t cursor = 0;
  for (;;) {
    size_t at = std::string_view::npos, len = 0;
    int chosen = -1;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      while (next[i] != std::string_view::npos && (next[i] < cursor || !acceptable(i, next[i])))
        next[i] = text.find(tokens_[i].spelling, std::max(cursor, next[i] + 1));
      const size_t p = next[i];
      if (p == std::string_view::npos) continue;
      if (p < at || (p == at && tokens_[i].spelling.size() > len)) {
        at = p;
        len = tokens_[i].spelling.size();
        chosen = int(i);
      }
    }
    if (chosen < 0) {
      if (cursor < text.size()) on_text(text.substr(cursor));
      return;
    }
    const Token& t = tokens_[size_t(chosen)];
    size_t before = at;  // the end of the text before the token
    if (t.lstrip)
      while (before > cursor) {
        const auto [c, start] = code_point_before(text, before);
        if (!unicode::is_white_space(c)) break;
        before = start;
      }
    size_t after = at + len;
    if (t.rstrip)
      while (after < text.size()) {
        const char32_t c = code_point_at(text, after);
        if (!unicode::is_white_space(c)) break;
        std::string one;
        unicode::append_utf8(one, c);
        after += one.size();
      }
    if (before > cursor) on_text(text.substr(cursor, before - cursor));
    on_token(t.id);
    cursor = after;
  }
}

}  // namespace troupe
