#include "grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

#include "grammar/utf8.h"

namespace troupe::grammar {

bool CharSet::intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto& [a, b] : ranges)
      if (a <= hi && lo <= b) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range.
  std::vector<std::pair<uint32_t, uint32_t>> sorted = ranges;
  std::sort(sorted.begin(), sorted.end());
  uint32_t next = lo;  // the lowest code point not yet known to be covered
  for (const auto& [a, b] : sorted) {
    if (a > next) break;
    if (b >= next) {
      if (b >= hi) return false;
      next = b + 1;
    }
  }
  return next <= hi;
}

// Bounds on what one grammar may grow to: a request's grammar is compiled
// on the engine, so its size must not be the client's to choose freely.
constexpr size_t kMaxElements = 1 << 20;
constexpr int kMaxRepeat = 4096;
constexpr int kMaxNesting = 256;

// Rules as sequences of symbols while parsing; flattened at the end.
struct Symbol {
  bool is_rule = false;
  int index = 0;  // rule or character set
};
using Sequence = std::vector<Symbol>;

class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view text) : text_(text) {}

  Grammar build() {
    skip_space(true);
    while (pos_ < text_.size()) {
      parse_rule();
      skip_space(true);
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || !defined_[size_t(root->second)])
      throw GrammarError("grammar: no rule named 'root' (the start)");
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r])
        throw GrammarError("grammar: rule '" + names_[r] + "' is used (line " +
                           std::to_string(first_use_line_[r]) + ") but never defined");
    check_left_recursion();
    return flatten(root->second);
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  std::map<std::string, int, std::less<>> ids_;
  std::vector<std::vector<Sequence>> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<int> first_use_line_;
  std::vector<CharSet> sets_;
  size_t symbols_ = 0;
  int depth_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError("grammar: line " + std::to_string(line) + ", column " + std::to_string(col) +
                       ": " + what);
  }
  int line() const { return int(std::count(text_.begin(), text_.begin() + long(pos_), '\n')) + 1; }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }

  // Spaces and comments; newlines too where `newlines` (inside groups,
  // after ::= and |, between rules).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }
  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(peek())) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  int rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int id = int(rules_.size());
    ids_.emplace(name, id);
    rules_.emplace_back();
    names_.push_back(name);
    defined_.push_back(false);
    first_use_line_.push_back(line());
    return id;
  }
  int new_rule(const std::string& base, std::vector<Sequence> alts) {
    std::string name = base + "-" + std::to_string(rules_.size());
    const int id = rule_id(name);
    rules_[size_t(id)] = std::move(alts);
    defined_[size_t(id)] = true;
    return id;
  }

  void parse_rule() {
    const std::string name = parse_name();
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    const int id = rule_id(name);
    if (defined_[size_t(id)]) fail("rule '" + name + "' is defined twice");
    defined_[size_t(id)] = true;
    auto alts = parse_alternatives(name, false);
    rules_[size_t(id)] = std::move(alts);
    if (!at_end() && peek() != '\n') fail("unexpected '" + std::string(1, peek()) + "'");
  }

  std::vector<Sequence> parse_alternatives(const std::string& rule, bool nested) {
    if (++depth_ > kMaxNesting) fail("groups nested too deeply");
    std::vector<Sequence> alts;
    skip_space(true);
    alts.push_back(parse_sequence(rule, nested));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(rule, nested));
    }
    --depth_;
    return alts;
  }

  void add(Sequence& seq, Symbol s) {
    if (++symbols_ > kMaxElements) fail("the grammar is too large");
    seq.push_back(s);
  }

  int add_set(CharSet set) {
    sets_.push_back(std::move(set));
    return int(sets_.size()) - 1;
  }

  Sequence parse_sequence(const std::string& rule, bool nested) {
    Sequence seq;
    size_t last_start = 0;  // where the last item's symbols begin in seq
    for (;;) {
      skip_space(nested);
      if (at_end()) break;
      const char c = peek();
      if (c == '"') {
        ++pos_;
        last_start = seq.size();
        while (!at_end() && peek() != '"') {
          const uint32_t cp = parse_char();
          add(seq, {false, add_set(CharSet{{{cp, cp}}, false})});
        }
        if (at_end()) fail("unterminated string literal");
        ++pos_;
        if (seq.size() > last_start + 1) {  // a repetition applies to the whole literal
          Sequence lit(seq.begin() + long(last_start), seq.end());
          seq.resize(last_start);
          if (is_repeat(peek())) {
            seq.push_back({true, new_rule(rule, {std::move(lit)})});
          } else {
            seq.insert(seq.end(), lit.begin(), lit.end());
          }
        }
      } else if (c == '[') {
        ++pos_;
        CharSet set;
        if (peek() == '^') {
          set.negated = true;
          ++pos_;
        }
        while (!at_end() && peek() != ']') {
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
            ++pos_;
            hi = parse_char();
            if (hi < lo) fail("character range out of order");
          }
          set.ranges.emplace_back(lo, hi);
        }
        if (at_end()) fail("unterminated character class");
        ++pos_;
        last_start = seq.size();
        add(seq, {false, add_set(std::move(set))});
      } else if (c == '.') {
        ++pos_;
        last_start = seq.size();
        add(seq, {false, add_set(CharSet{{}, true})});
      } else if (name_char(c)) {
        const std::string name = parse_name();
        skip_space(nested);
        if (text_.substr(pos_, 3) == "::=") fail("expected a newline before rule '" + name + "'");
        last_start = seq.size();
        add(seq, {true, rule_id(name)});
        continue;  // spaces are skipped; a repetition may follow
      } else if (c == '(') {
        ++pos_;
        auto alts = parse_alternatives(rule, true);
        skip_space(true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        last_start = seq.size();
        add(seq, {true, new_rule(rule, std::move(alts))});
      } else if (is_repeat(c)) {
        if (seq.empty() || last_start >= seq.size()) fail("a repetition needs something before it");
        apply_repeat(rule, seq, last_start);
      } else {
        break;
      }
    }
    return seq;
  }

  static bool is_repeat(char c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

  int parse_int() {
    const size_t start = pos_;
    long v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) fail("repetition count over " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) fail("expected a number");
    return int(v);
  }

  // The item seq[last_start..] repeated as the operator at pos_ says.
  void apply_repeat(const std::string& rule, Sequence& seq, size_t last_start) {
    const Sequence item(seq.begin() + long(last_start), seq.end());
    seq.resize(last_start);
    int min = 0, max = -1;  // -1: unbounded
    const char op = peek();
    ++pos_;
    if (op == '*') {
      min = 0;
    } else if (op == '+') {
      min = 1;
    } else if (op == '?') {
      max = 1;
    } else {
      skip_space(true);
      min = parse_int();
      skip_space(true);
      max = min;
      if (peek() == ',') {
        ++pos_;
        skip_space(true);
        max = (peek() == '}') ? -1 : parse_int();
        skip_space(true);
      }
      if (peek() != '}') fail("expected '}'");
      ++pos_;
      if (max >= 0 && max < min) fail("repetition {m,n} with n < m");
    }
    for (int i = 0; i < min; ++i)
      for (const Symbol& s : item) add(seq, s);
    if (max < 0) {
      // star ::= item star | (empty)
      const int star = new_rule(rule, {});
      Sequence loop = item;
      loop.push_back({true, star});
      rules_[size_t(star)] = {loop, {}};
      add(seq, {true, star});
    } else if (max > min) {
      // opt_k ::= item opt_{k+1} | (empty), innermost last
      int next = -1;
      for (int k = max - min; k > 0; --k) {
        Sequence more = item;
        if (next >= 0) more.push_back({true, next});
        symbols_ += more.size();
        if (symbols_ > kMaxElements) fail("the grammar is too large");
        next = new_rule(rule, {more, {}});
      }
      add(seq, {true, next});
    }
  }

  // One code point of a literal or class, escapes resolved.
  uint32_t parse_char() {
    if (peek() != '\\') {
      size_t len = 0;
      const uint32_t cp = decode_utf8(text_.substr(pos_), &len);
      if (len == 0) fail("invalid UTF-8");
      pos_ += len;
      return cp;
    }
    ++pos_;
    if (at_end()) fail("unfinished escape");
    const char e = peek();
    ++pos_;
    auto hex = [&](int digits) {
      uint32_t v = 0;
      if (!read_hex(text_, &pos_, digits, &v))
        fail("expected " + std::to_string(digits) + " hex digits");
      if (v > 0x10FFFF) fail("code point out of range");
      return v;
    };
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '0':
        return 0;
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
      case '.':
      case '\'':
        return uint32_t(static_cast<unsigned char>(e));
      default:
        --pos_;
        fail(std::string("unknown escape '\\") + e + "'");
    }
  }

  // A rule that can reach itself before consuming a character would make the
  // matcher loop; refuse it here, naming the rule.
  void check_left_recursion() {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Sequence& alt : rules_[r]) {
          bool all = true;
          for (const Symbol& s : alt)
            if (!s.is_rule || !nullable[size_t(s.index)]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Edges r -> s where s can start r's match; a cycle is left recursion.
    std::vector<std::vector<int>> first(n);
    for (size_t r = 0; r < n; ++r)
      for (const Sequence& alt : rules_[r])
        for (const Symbol& s : alt) {
          if (!s.is_rule) break;
          first[r].push_back(s.index);
          if (!nullable[size_t(s.index)]) break;
        }
    std::vector<int> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::function<void(int)> visit = [&](int r) {
      state[size_t(r)] = 1;
      for (int s : first[size_t(r)]) {
        if (state[size_t(s)] == 1)
          throw GrammarError("grammar: rule '" + names_[size_t(s)] +
                             "' is left-recursive (it can reach itself before any character)");
        if (state[size_t(s)] == 0) visit(s);
      }
      state[size_t(r)] = 2;
    };
    for (size_t r = 0; r < n; ++r)
      if (state[r] == 0) visit(int(r));
  }

  Grammar flatten(int root) {
    Grammar g;
    g.sets_ = std::move(sets_);
    g.names_ = std::move(names_);
    g.root_ = root;
    g.alternatives_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (const Sequence& alt : rules_[r]) {
        g.alternatives_[r].push_back(int32_t(g.elements_.size()));
        for (const Symbol& s : alt)
          g.elements_.push_back(
              {s.is_rule ? Grammar::Kind::Rule : Grammar::Kind::Chars, int32_t(s.index)});
        g.elements_.push_back({Grammar::Kind::End, 0});
      }
    return g;
  }
};

Grammar Grammar::parse(std::string_view gbnf) {
  return GrammarBuilder(gbnf).build();
}

std::string gbnf_literal(std::string_view utf8) {
  std::string out = "\"";
  for (const char c : utf8) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static const char* digits = "0123456789ABCDEF";
          out += "\\x";
          out += digits[(c >> 4) & 0xF];
          out += digits[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace troupe::grammar
