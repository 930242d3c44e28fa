#include "grammar/regex.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "grammar/utf8.h"

namespace troupe::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr size_t kMaxRegexBytes = 64 * 1024;
constexpr int kMaxRegexNesting = 128;

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// A code point inside a GBNF class: letters and digits as they are, the rest
// as an escape, so that no character means anything to the class syntax.
std::string class_char(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9'))
    return std::string(1, char(cp));
  char buf[16];
  if (cp <= 0xFFFF)
    std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(cp));
  else
    std::snprintf(buf, sizeof buf, "\\U%08X", unsigned(cp));
  return buf;
}

std::string class_of(const Ranges& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const auto& [lo, hi] : ranges) {
    out += class_char(lo);
    if (hi != lo) {
      out += '-';
      out += class_char(hi);
    }
  }
  return out + "]";
}

// How JSON writes a character that may not appear raw in a string.
std::string json_escape(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
      return buf;
    }
  }
}

bool json_special(uint32_t cp) {
  return cp < 0x20 || cp == '"' || cp == '\\';
}

bool in_ranges(const Ranges& r, uint32_t cp) {
  for (const auto& [lo, hi] : r)
    if (cp >= lo && cp <= hi) return true;
  return false;
}

// The characters of a set (ranges, or all but them), as GBNF; inside a JSON
// string, those JSON escapes are written as their escapes.
std::string set_expr(const Ranges& ranges, bool negated, bool json) {
  if (!json) return class_of(ranges, negated);
  std::vector<uint32_t> escaped;  // specials in the set
  for (uint32_t cp = 0; cp < 0x60; ++cp)
    if (json_special(cp) && in_ranges(ranges, cp) != negated) escaped.push_back(cp);
  std::string raw;
  if (negated) {
    Ranges r = ranges;
    r.emplace_back(0, 0x1F);
    r.emplace_back('"', '"');
    r.emplace_back('\\', '\\');
    raw = class_of(r, true);
  } else {
    Ranges r;
    for (auto [lo, hi] : ranges) {
      // Cut out 0-0x1F, '"' and '\\'.
      for (uint32_t cut : {0x1Fu, uint32_t('"'), uint32_t('\\')}) {
        const uint32_t from = cut == 0x1F ? 0 : cut;
        if (hi < from || lo > cut) continue;
        if (lo < from) r.emplace_back(lo, from - 1);
        lo = cut + 1;
        if (lo > hi) break;
      }
      if (lo <= hi) r.emplace_back(lo, hi);
    }
    if (!r.empty()) raw = class_of(r, false);
  }
  std::string out = raw;
  for (uint32_t cp : escaped) out += (out.empty() ? "" : " | ") + gbnf_literal(json_escape(cp));
  if (out.empty()) return "[^\\u0000-\\U0010FFFF]";  // nothing
  return "(" + out + ")";
}

class RegexConverter {
 public:
  RegexConverter(std::string_view re, bool json, RegexLength length)
      : re_(re), json_(json), length_(length) {}

  std::string convert() {
    if (re_.size() > kMaxRegexBytes)
      throw GrammarError("regex: longer than " + std::to_string(kMaxRegexBytes) + " bytes");
    if (!re_.empty() && re_.front() == '^') ++pos_;
    std::string_view body = re_;
    // A final unescaped `$` ends the match, which is whole anyway.
    if (body.size() > pos_ && body.back() == '$') {
      size_t slashes = 0;
      for (size_t i = body.size() - 1; i-- > pos_ && body[i] == '\\';) ++slashes;
      if (slashes % 2 == 0) end_ = body.size() - 1;
    }
    const std::string out = alternation(0);
    if (!at_end()) fail(std::string("unexpected '") + re_[pos_] + "'");
    if (!within_length()) return bounded_by_length();
    return out.empty() ? "\"\"" : out;
  }

 private:
  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
  size_t end_ = std::string_view::npos;
  bool nullable_ = false;
  RegexLength length_;
  // How many characters what was last read matches, at least and at most
  // (kUnbounded: no most), as nullable_.
  static constexpr int64_t kUnbounded = int64_t(1) << 40;
  int64_t min_chars_ = 0, max_chars_ = 0;
  // The pattern's items when it is one sequence (no `|` outside groups):
  // each as its atom and quantifier, to fold a length into.
  struct Item {
    std::string atom, text;  // the atom; the item as written out
    int64_t atom_min = 0, atom_max = 0;
    int64_t times_min = 1, times_max = 1;  // the quantifier's counts (kUnbounded: no most)
  };
  std::vector<Item> items_;
  bool one_sequence_ = true;

  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError("regex: at " + std::to_string(pos_) + ": " + what);
  }
  bool at_end() const { return pos_ >= std::min(end_, re_.size()); }
  char peek() const { return at_end() ? '\0' : re_[pos_]; }

  // Each of these leaves in nullable_ whether what it returns can match the
  // empty string: an unbounded repetition of such a thing would make the
  // grammar left-recursive, so it is refused.
  std::string alternation(int depth) {
    if (depth > kMaxRegexNesting) fail("groups nested too deeply");
    std::vector<std::string> alts{concat(depth)};
    bool nullable = nullable_;
    int64_t lo = min_chars_, hi = max_chars_;
    while (peek() == '|') {
      ++pos_;
      if (depth == 0) one_sequence_ = false;
      alts.push_back(concat(depth));
      nullable = nullable || nullable_;
      lo = std::min(lo, min_chars_);
      hi = std::max(hi, max_chars_);
    }
    nullable_ = nullable;
    min_chars_ = lo;
    max_chars_ = hi;
    if (alts.size() == 1) return alts[0];
    std::string out;
    for (const std::string& a : alts) out += (out.empty() ? "" : " | ") + (a.empty() ? "\"\"" : a);
    return "(" + out + ")";
  }

  std::string concat(int depth) {
    std::string out;
    bool nullable = true;
    int64_t lo = 0, hi = 0;
    while (!at_end() && peek() != '|' && peek() != ')') {
      Item item;
      item.atom = atom(depth);
      item.atom_min = min_chars_, item.atom_max = max_chars_;
      item.text = quantified(item.atom, &item.times_min, &item.times_max);
      nullable = nullable && nullable_;
      lo = std::min(kUnbounded, lo + min_chars_);
      hi = std::min(kUnbounded, hi + max_chars_);
      out += (out.empty() ? "" : " ") + item.text;
      if (depth == 0) items_.push_back(std::move(item));
    }
    nullable_ = nullable;
    min_chars_ = lo;
    max_chars_ = hi;
    return out;
  }

  // The atom `a` with the quantifier after it, if any; its counts into
  // *times_min, *times_max.
  std::string quantified(const std::string& a, int64_t* times_min, int64_t* times_max) {
    const char q = peek();
    std::string op;
    bool unbounded = false, may_skip = false;
    int64_t at_least = 1, at_most = 1;
    if (q == '*' || q == '+' || q == '?') {
      ++pos_;
      op = std::string(1, q);
      unbounded = q != '?';
      may_skip = q != '+';
      at_least = q == '+' ? 1 : 0;
      at_most = q == '?' ? 1 : kUnbounded;
    } else if (q == '{') {
      const size_t close = re_.find('}', pos_);
      if (close == std::string_view::npos) fail("unclosed '{'");
      const std::string_view inside = re_.substr(pos_ + 1, close - pos_ - 1);
      if (inside.empty() || inside.find_first_not_of("0123456789,") != std::string_view::npos ||
          inside[0] == ',' || std::count(inside.begin(), inside.end(), ',') > 1)
        fail("a repetition {m}, {m,} or {m,n} was expected");
      const size_t comma = inside.find(',');
      auto number = [&](std::string_view digits) {
        if (digits.size() > 4) fail("a repetition count over 4096");
        int v = 0;
        for (char d : digits) v = v * 10 + (d - '0');
        if (v > 4096) fail("a repetition count over 4096");
        return v;
      };
      const int m = number(inside.substr(0, comma));
      at_least = at_most = m;
      if (comma != std::string_view::npos && comma + 1 < inside.size()) {
        at_most = number(inside.substr(comma + 1));
        if (at_most < m) fail("a repetition {m,n} with n < m");
      }
      unbounded = comma != std::string_view::npos && comma + 1 == inside.size();
      if (unbounded) at_most = kUnbounded;
      may_skip = m == 0;
      op.assign(1, '{').append(inside).append(1, '}');
      pos_ = close + 1;
    } else {
      *times_min = *times_max = 1;
      return a;
    }
    *times_min = at_least;
    *times_max = at_most;
    min_chars_ = std::min(kUnbounded, min_chars_ * at_least);
    max_chars_ = at_most == kUnbounded && max_chars_ > 0
                     ? kUnbounded
                     : std::min(kUnbounded, max_chars_ * at_most);
    if (peek() == '?') ++pos_;  // lazy: the same strings
    if (peek() == '+') fail("possessive quantifiers are not supported");
    if (peek() == '*' || peek() == '+' || peek() == '{' || peek() == '?')
      fail("a quantifier after a quantifier");
    if (unbounded && nullable_)
      fail("an unbounded repetition of something that can match nothing (such as (a|)+)");
    nullable_ = nullable_ || may_skip;
    return std::string(1, '(').append(a).append(1, ')').append(op);
  }

  bool within_length() const {
    return (length_.min < 0 || min_chars_ >= length_.min) &&
           (length_.max < 0 || max_chars_ <= length_.max);
  }

  // The pattern with minLength/maxLength folded into its one item of
  // variable length, a repeated single character (such as [a-z]+ in
  // [A-Z][a-z]+): every other item matches a fixed number of characters.
  std::string bounded_by_length() const {
    const std::string refused =
        "minLength/maxLength with this pattern: only a pattern whose one part of variable "
        "length is a repeated character (such as ^[A-Z][a-z]*$) takes them";
    if (!one_sequence_) throw GrammarError("regex: " + refused);
    int64_t fixed = 0;
    const Item* variable = nullptr;
    for (const Item& it : items_) {
      const bool fixed_width =
          it.atom_min == it.atom_max && (it.times_min == it.times_max || it.atom_max == 0);
      if (fixed_width) {
        fixed += it.atom_min * it.times_min;
      } else if (variable || it.atom_min != 1 || it.atom_max != 1) {
        throw GrammarError("regex: " + refused);
      } else {
        variable = &it;
      }
    }
    if (!variable)
      throw GrammarError("regex: its strings are never as long as minLength/maxLength ask");
    int64_t lo = variable->times_min, hi = variable->times_max;
    if (length_.min >= 0) lo = std::max(lo, int64_t(length_.min) - fixed);
    if (length_.max >= 0) hi = std::min(hi, int64_t(length_.max) - fixed);
    if (lo > hi || hi < 0)
      throw GrammarError("regex: no string of it is as long as minLength/maxLength ask");
    lo = std::max<int64_t>(lo, 0);
    std::string out;
    for (const Item& it : items_) {
      std::string text = it.text;
      if (&it == variable) {
        text = "(" + it.atom + "){" + std::to_string(lo) + "," +
               (hi >= kUnbounded ? std::string() : std::to_string(hi)) + "}";
      }
      out += (out.empty() ? "" : " ") + text;
    }
    return out;
  }

  std::string atom(int depth) {
    const char c = peek();
    nullable_ = false;
    min_chars_ = max_chars_ = 1;  // a character, a class; a group says its own
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        if (re_.substr(pos_, 2) != "?:")
          fail("only (?:...) groups are supported (no lookaround, names or flags)");
        pos_ += 2;
      }
      std::string inner = alternation(depth + 1);
      if (peek() != ')') fail("unclosed '('");
      ++pos_;
      return std::string(1, '(').append(inner.empty() ? "\"\"" : inner).append(1, ')');
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return set_expr({{'\n', '\n'}}, true, json_);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("a quantifier with nothing before it");
    if (c == '^' || c == '$') fail("anchors are supported only at the start and the end");
    if (c == '\\') {
      Ranges r;
      bool negated = false;
      const uint32_t cp = escape(&r, &negated);
      if (!r.empty()) return set_expr(r, negated, json_);
      return literal(cp);
    }
    size_t len = 0;
    const uint32_t cp = decode_utf8(re_.substr(pos_), &len);
    if (len == 0) fail("invalid UTF-8");
    pos_ += len;
    return literal(cp);
  }

  std::string literal(uint32_t cp) const {
    if (json_ && json_special(cp)) return gbnf_literal(json_escape(cp));
    return gbnf_literal(utf8_of(cp));
  }

  // After a backslash: a character (returned), or a class (*r, *negated).
  uint32_t escape(Ranges* r, bool* negated) {
    ++pos_;
    if (at_end()) fail("unfinished escape");
    const char e = re_[pos_++];
    auto hex = [&](int digits) {
      uint32_t v = 0;
      if (!read_hex(re_.substr(0, std::min(end_, re_.size())), &pos_, digits, &v))
        fail("expected " + std::to_string(digits) + " hex digits");
      return v;
    };
    switch (e) {
      case 'd':
        *r = {{'0', '9'}};
        return 0;
      case 'D':
        *r = {{'0', '9'}}, *negated = true;
        return 0;
      case 'w':
        *r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
        return 0;
      case 'W':
        *r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}, *negated = true;
        return 0;
      case 's':
        *r = {{'\t', '\r'}, {' ', ' '}};
        return 0;
      case 'S':
        *r = {{'\t', '\r'}, {' ', ' '}}, *negated = true;
        return 0;
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x':
        return hex(2);
      case 'u': {
        const uint32_t v = hex(4);
        if (v < 0xD800 || v > 0xDFFF) return v;
        // A surrogate pair, as JSON spells a character past U+FFFF.
        if (v <= 0xDBFF && re_.substr(pos_, 2) == "\\u") {
          pos_ += 2;
          const uint32_t low = hex(4);
          if (low >= 0xDC00 && low <= 0xDFFF)
            return 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
        }
        fail("a \\u escape of a lone surrogate");
      }
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
          --pos_;
          fail(std::string("the escape \\") + e + " is not supported");
        }
        return uint32_t(static_cast<unsigned char>(e));
    }
  }

  std::string char_class() {
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (!at_end() && (peek() != ']' || first)) {
      first = false;
      uint32_t lo = 0;
      if (peek() == '\\') {
        Ranges r;
        bool neg = false;
        lo = escape(&r, &neg);
        if (!r.empty()) {
          if (neg) fail("\\D, \\W and \\S inside a class are not supported");
          ranges.insert(ranges.end(), r.begin(), r.end());
          continue;
        }
      } else {
        size_t len = 0;
        lo = decode_utf8(re_.substr(pos_), &len);
        if (len == 0) fail("invalid UTF-8");
        pos_ += len;
      }
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\\') {
          Ranges r;
          bool neg = false;
          hi = escape(&r, &neg);
          if (!r.empty()) fail("a class cannot be a range's end");
        } else {
          size_t len = 0;
          hi = decode_utf8(re_.substr(pos_), &len);
          if (len == 0) fail("invalid UTF-8");
          pos_ += len;
        }
        if (hi < lo) fail("a range out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    if (peek() != ']') fail("unclosed '['");
    ++pos_;
    if (ranges.empty() && !negated) fail("an empty class matches nothing");
    return set_expr(ranges, negated, json_);
  }
};

}  // namespace

std::string regex_to_gbnf(std::string_view regex, bool json_string, RegexLength length) {
  return RegexConverter(regex, json_string, length).convert();
}

}  // namespace troupe::grammar
