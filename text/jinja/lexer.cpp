#include "text/jinja/lexer.h"

#include <cctype>

#include "text/jinja/value.h"
#include "text/unicode.h"

namespace troupe::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Jinja reads "\r\n" and "\r" as "\n", and drops one newline at the very end.
std::string normalized(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalized(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t at = next_tag(pos_);
      std::string text = src_.substr(pos_, at - pos_);
      if (at == src_.size()) {
        emit_text(std::move(text));
        break;
      }
      const char kind = src_[at + 1];  // '{', '%' or '#'
      const char modifier = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (modifier != '+' && kind != '{') {
        lstrip(text, pos_);
      }
      emit_text(std::move(text));
      count_lines(pos_, at);
      pos_ = at + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
      if (kind == '#') {
        comment();
      } else if (kind == '%' && raw_block()) {
        // done inside
      } else {
        tag(kind == '{');
      }
    }
    tokens_.push_back({Tok::End, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between a line's start and a block tag go.
  void lstrip(std::string& text, size_t text_start) const {
    const size_t nl = text.rfind('\n');
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos && !(text_start == 0 || src_[text_start - 1] == '\n')) return;
    for (size_t i = from; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return;
    text.resize(from);
  }

  void emit_text(std::string text) {
    if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), line_});
  }

  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i)
      if (src_[i] == '\n') ++line_;
  }

  // After a tag's close: "-" takes all white space, trim_blocks one newline.
  void after_close(char modifier, bool block) {
    if (modifier == '-') {
      const size_t start = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      count_lines(start, pos_);
    } else if (block && modifier != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("line " + std::to_string(line_) + ": " + what);
  }

  void comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("unclosed comment");
    const char modifier = end > pos_ ? src_[end - 1] : '\0';
    count_lines(pos_, end);
    pos_ = end + 2;
    after_close(modifier == '-' || modifier == '+' ? modifier : '\0', true);
  }

  // `{% raw %}...{% endraw %}`: the text between, untouched.
  bool raw_block() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    char open_modifier = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) open_modifier = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    pos_ = p + 2;
    after_close(open_modifier, true);
    for (size_t at = src_.find("{%", pos_); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t q = at + 2;
      const char close_modifier = q < src_.size() ? src_[q] : '\0';
      if (close_modifier == '-' || close_modifier == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char end_modifier = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_modifier = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, at - pos_);
      if (close_modifier == '-')
        while (!text.empty() && is_space(text.back())) text.pop_back();
      emit_text(std::move(text));
      count_lines(pos_, q);
      pos_ = q + 2;
      after_close(end_modifier, true);
      return true;
    }
    fail("{% raw %} without {% endraw %}");
  }

  void tag(bool output) {
    tokens_.push_back({output ? Tok::OutputOpen : Tok::BlockOpen, "", line_});
    const char closer = output ? '}' : '%';
    int depth = 0;  // open brackets: "{'a': {}}}" closes at the third brace, as Jinja balances
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(output ? "unclosed {{" : "unclosed {%");
      const char c = src_[pos_];
      // A close, with its modifier: "-}}", "+%}", "}}".
      if (depth == 0 && (c == '-' || c == '+') &&
          src_.compare(pos_ + 1, 2, std::string{closer, '}'}) == 0) {
        pos_ += 3;
        tokens_.push_back({Tok::Close, "", line_});
        after_close(c, !output);
        return;
      }
      if (depth == 0 && c == closer && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
        pos_ += 2;
        tokens_.push_back({Tok::Close, "", line_});
        after_close('\0', !output);
        return;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t start = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        tokens_.push_back({Tok::Name, src_.substr(start, pos_ - start), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        op();
      }
    }
  }

  void number() {
    const size_t start = pos_;
    bool is_float = false;
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '_') {
        ++pos_;
      } else if (c == '.' && !is_float && pos_ + 1 < src_.size() &&
                 std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
        is_float = true;
        ++pos_;
      } else if ((c == 'e' || c == 'E') && pos_ + 1 < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])) ||
                  src_[pos_ + 1] == '-' || src_[pos_ + 1] == '+')) {
        is_float = true;
        pos_ += 2;
      } else {
        break;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? Tok::Float : Tok::Int, text, line_});
  }

  // Python's string literal escapes, as Jinja reads them.
  void string_literal(char quote) {
    ++pos_;
    std::string value;
    const int line = line_;
    while (true) {
      if (pos_ >= src_.size()) fail("unclosed string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (pos_ >= src_.size()) fail("unclosed string literal");
      const char e = src_[pos_++];
      const auto hex = [&](int digits) {
        uint32_t cp = 0;
        for (int d = 0; d < digits; ++d, ++pos_) {
          const char h = pos_ < src_.size() ? src_[pos_] : '\0';
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail("a \\x, \\u or \\U escape needs " + std::to_string(digits) + " hex digits");
          cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h))
                                      ? h - '0'
                                      : (h | 0x20) - 'a' + 10);
        }
        if (cp > 0x10FFFF) fail("an escape past U+10FFFF");
        unicode::append_utf8(value, char32_t(cp));
      };
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case 'a':
          value += '\a';
          break;
        case '0':
          value += '\0';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case '\n':
          ++line_;
          break;  // a continued line
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:  // Python keeps an unknown escape as it is
          value += '\\';
          value += e;
      }
    }
    tokens_.push_back({Tok::String, std::move(value), line});
  }

  void op() {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const std::string_view two : kTwo)
      if (src_.compare(pos_, 2, two) == 0) {
        tokens_.push_back({Tok::Op, std::string(two), line_});
        pos_ += 2;
        return;
      }
    const char c = src_[pos_];
    if (std::string_view("()[]{},.:|~+-*/%=<>").find(c) == std::string_view::npos)
      fail(std::string("unexpected character '") + c + "' in a tag");
    tokens_.push_back({Tok::Op, std::string(1, c), line_});
    ++pos_;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace troupe::jinja
