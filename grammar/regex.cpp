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
  RegexConverter(std::string_view re, bool json) : re_(re), json_(json) {}

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
    return out.empty() ? "\"\"" : out;
  }

 private:
  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
  size_t end_ = std::string_view::npos;
  bool nullable_ = false;

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
    while (peek() == '|') {
      ++pos_;
      alts.push_back(concat(depth));
      nullable = nullable || nullable_;
    }
    nullable_ = nullable;
    if (alts.size() == 1) return alts[0];
    std::string out;
    for (const std::string& a : alts) out += (out.empty() ? "" : " | ") + (a.empty() ? "\"\"" : a);
    return "(" + out + ")";
  }

  std::string concat(int depth) {
    std::string out;
    bool nullable = true;
    while (!at_end() && peek() != '|' && peek() != ')') {
      std::string a = atom(depth);
      a = quantified(std::move(a));
      nullable = nullable && nullable_;
      out += (out.empty() ? "" : " ") + a;
    }
    nullable_ = nullable;
    return out;
  }

  std::string quantified(std::string a) {
    const char q = peek();
    std::string op;
    bool unbounded = false, may_skip = false;
    if (q == '*' || q == '+' || q == '?') {
      ++pos_;
      op = std::string(1, q);
      unbounded = q != '?';
      may_skip = q != '+';
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
      if (comma != std::string_view::npos && comma + 1 < inside.size() &&
          number(inside.substr(comma + 1)) < m)
        fail("a repetition {m,n} with n < m");
      unbounded = comma != std::string_view::npos && comma + 1 == inside.size();
      may_skip = m == 0;
      op.assign(1, '{').append(inside).append(1, '}');
      pos_ = close + 1;
    } else {
      return a;
    }
    if (peek() == '?') ++pos_;  // lazy: the same strings
    if (peek() == '+') fail("possessive quantifiers are not supported");
    if (peek() == '*' || peek() == '+' || peek() == '{' || peek() == '?')
      fail("a quantifier after a quantifier");
    if (unbounded && nullable_)
      fail("an unbounded repetition of something that can match nothing (such as (a|)+)");
    nullable_ = nullable_ || may_skip;
    return std::string(1, '(').append(a).append(1, ')').append(op);
  }

  std::string atom(int depth) {
    const char c = peek();
    nullable_ = false;
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

std::string regex_to_gbnf(std::string_view regex, bool json_string) {
  return RegexConverter(regex, json_string).convert();
}

}  // namespace troupe::grammar
