#include "text/pretoken_regex.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>

#include "text/unicode.h"

namespace troupe {

namespace {

using unicode::category_bit;
using unicode::GeneralCategory;
using Item = PretokenRegex::ClassItem;
using Kind = Item::Kind;

uint32_t bits(std::initializer_list<GeneralCategory> cats) {
  uint32_t m = 0;
  for (auto c : cats) m |= category_bit(c);
  return m;
}

using G = GeneralCategory;
const uint32_t kLetter = bits({G::Lu, G::Ll, G::Lt, G::Lm, G::Lo});
const uint32_t kMark = bits({G::Mn, G::Mc, G::Me});
const uint32_t kNumber = bits({G::Nd, G::Nl, G::No});
const uint32_t kPunct = bits({G::Pc, G::Pd, G::Ps, G::Pe, G::Pi, G::Pf, G::Po});
const uint32_t kSymbol = bits({G::Sm, G::Sc, G::Sk, G::So});
const uint32_t kSeparator = bits({G::Zs, G::Zl, G::Zp});
const uint32_t kOther = bits({G::Cc, G::Cf, G::Cs, G::Co, G::Cn});

// A \p{..} name: a category's two letters, its group's one letter, LC, or
// the group's long name.
uint32_t category_mask(const std::string& name) {
  static const char* const kTwo[] = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl",
                                     "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
                                     "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};
  for (unsigned i = 0; i < std::size(kTwo); ++i)
    if (name == kTwo[i]) return 1u << i;
  const std::pair<const char*, uint32_t> groups[] = {{"L", kLetter},
                                                     {"Letter", kLetter},
                                                     {"M", kMark},
                                                     {"Mark", kMark},
                                                     {"N", kNumber},
                                                     {"Number", kNumber},
                                                     {"P", kPunct},
                                                     {"Punctuation", kPunct},
                                                     {"S", kSymbol},
                                                     {"Symbol", kSymbol},
                                                     {"Z", kSeparator},
                                                     {"Separator", kSeparator},
                                                     {"C", kOther},
                                                     {"Other", kOther},
                                                     {"LC", bits({G::Lu, G::Ll, G::Lt})},
                                                     {"L&", bits({G::Lu, G::Ll, G::Lt})}};
  for (const auto& [n, m] : groups)
    if (name == n) return m;
  return 0;
}

struct Node {
  enum class Type { Set, Seq, Alt, Repeat, Look };
  explicit Node(Type t = Type::Seq) : type(t) {}
  Type type;
  int set = -1;
  std::vector<Node> children;
  int min = 0, max = -1;  // Repeat; max -1: unbounded
  bool greedy = true;
  bool negative = false;  // Look
};

bool nullable(const Node& n) {
  switch (n.type) {
    case Node::Type::Set:
      return false;
    case Node::Type::Seq:
      for (const Node& c : n.children)
        if (!nullable(c)) return false;
      return true;
    case Node::Type::Alt:
      for (const Node& c : n.children)
        if (nullable(c)) return true;
      return false;
    case Node::Type::Repeat:
      return n.min == 0 || nullable(n.children[0]);
    case Node::Type::Look:
      return true;
  }
  return true;
}

class Parser {
 public:
  Parser(std::string_view pattern, std::vector<PretokenRegex::CharSet>& sets)
      : source_(pattern), p_(unicode::decode_utf8(pattern).points), sets_(sets) {}

  Node parse() {
    Node n = alternation();
    if (at_ < p_.size()) fail("an unmatched ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("pre-tokenizer regex '" + std::string(source_) + "': " + what +
                                " at character " + std::to_string(at_));
  }
  bool more() const { return at_ < p_.size(); }
  char32_t peek() const { return more() ? p_[at_] : 0; }
  bool eat(char32_t c) {
    if (peek() != c || !more()) return false;
    ++at_;
    return true;
  }
  char32_t next() {
    if (!more()) fail("an unexpected end");
    return p_[at_++];
  }

  Node alternation() {
    Node alt(Node::Type::Alt);
    alt.children.push_back(sequence());
    while (eat('|')) alt.children.push_back(sequence());
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  Node sequence() {
    Node seq(Node::Type::Seq);
    while (more() && peek() != '|' && peek() != ')') seq.children.push_back(quantified(atom()));
    return seq;
  }

  Node quantified(Node atom) {
    for (;;) {
      int min = 0, max = -1;
      if (eat('?')) {
        max = 1;
      } else if (eat('*')) {
      } else if (eat('+')) {
        min = 1;
      } else if (peek() == '{') {
        ++at_;
        min = number();
        max = min;
        if (eat(',')) max = peek() == '}' ? -1 : number();
        if (!eat('}')) fail("a malformed {n,m}");
        if (max != -1 && max < min) fail("{n,m} with m < n");
        if (min > 1000 || max > 1000) fail("a repeat count over 1000");
      } else {
        return atom;
      }
      if (atom.type == Node::Type::Look) fail("a quantified lookahead");
      Node rep(Node::Type::Repeat);
      rep.min = min;
      rep.max = max;
      if (eat('?'))
        rep.greedy = false;
      else if (peek() == '+')
        fail("a possessive quantifier (not supported)");
      if (max == -1 && nullable(atom)) fail("an unbounded repeat of what may match nothing");
      rep.children.push_back(std::move(atom));
      atom = std::move(rep);
    }
  }

  int number() {
    int v = 0;
    bool any = false;
    while (peek() >= '0' && peek() <= '9' && more()) {
      v = v * 10 + int(next() - '0');
      if (v > 100000) fail("a number too large");
      any = true;
    }
    if (!any) fail("a missing number in {n,m}");
    return v;
  }

  Node set_node(PretokenRegex::CharSet set) {
    sets_.push_back(std::move(set));
    Node n(Node::Type::Set);
    n.set = int(sets_.size()) - 1;
    return n;
  }

  // c, and under (?i) its other ASCII case.
  void add_char(PretokenRegex::CharSet& set, char32_t c) const {
    set.items.push_back({Kind::Range, false, c, c});
    if (case_insensitive_ && c < 128 && std::isalpha(int(c))) {
      const char32_t o = std::islower(int(c)) ? c - 32 : c + 32;
      set.items.push_back({Kind::Range, false, o, o});
    }
  }

  void add_range(PretokenRegex::CharSet& set, char32_t lo, char32_t hi) const {
    set.items.push_back({Kind::Range, false, lo, hi});
    if (!case_insensitive_) return;
    const auto fold = [&](char32_t a, char32_t z, int shift) {
      const char32_t l = std::max(lo, a), h = std::min(hi, z);
      if (l <= h)
        set.items.push_back({Kind::Range, false, char32_t(l + shift), char32_t(h + shift)});
    };
    fold('a', 'z', -32);
    fold('A', 'Z', 32);
  }

  Node atom() {
    const char32_t c = next();
    switch (c) {
      case '(':
        return group();
      case '[':
        return set_node(char_class());
      case '.':
        return set_node({{{Kind::AnyButNewline}}});
      case '\\': {
        PretokenRegex::CharSet set;
        escape(set, false);
        return set_node(std::move(set));
      }
      case '^':
      case '$':
        fail("an anchor (not supported)");
      case '*':
      case '+':
      case '?':
      case '{':
        fail("a quantifier with nothing to repeat");
      default: {
        PretokenRegex::CharSet set;
        add_char(set, c);
        return set_node(std::move(set));
      }
    }
  }

  Node group() {
    const bool saved = case_insensitive_;
    Node n;
    if (eat('?')) {
      if (eat(':')) {
        n = alternation();
      } else if (eat('=') || peek() == '!') {
        const bool negative = eat('!');
        n = Node(Node::Type::Look);
        n.negative = negative;
        n.children.push_back(alternation());
      } else if (eat('i')) {
        if (eat(')')) fail("(?i) without a group (write (?i:...))");
        if (!eat(':')) fail("an unsupported group option");
        case_insensitive_ = true;
        n = alternation();
      } else {
        fail("an unsupported group (only (?:, (?i:, (?= and (?! are)");
      }
    } else {
      n = alternation();
    }
    case_insensitive_ = saved;
    if (!eat(')')) fail("a '(' without its ')'");
    return n;
  }

  PretokenRegex::CharSet char_class() {
    PretokenRegex::CharSet set;
    set.negated = eat('^');
    bool first = true;
    for (;;) {
      if (!more()) fail("a '[' without its ']'");
      char32_t c = next();
      if (c == ']' && !first) break;
      first = false;
      if (c == '[') fail("a nested class or class operation (not supported)");
      if (c == '\\') {
        const auto single = escape(set, true);
        if (!single) continue;
        c = *single;
      }
      if (peek() == '-' && at_ + 1 < p_.size() && p_[at_ + 1] != ']') {
        ++at_;
        char32_t hi = next();
        if (hi == '\\') {
          const auto single = escape(set, true);
          if (!single) fail("a range that ends in a class");
          hi = *single;
        }
        if (hi < c) fail("a range whose end is before its start");
        add_range(set, c, hi);
      } else {
        add_char(set, c);
      }
    }
    return set;
  }

  // After a backslash: a class escape adds its item to `set` and returns
  // nothing; a character escape returns the character (outside a class, it
  // is added too).
  std::optional<char32_t> escape(PretokenRegex::CharSet& set, bool in_class) {
    const char32_t c = next();
    const auto item = [&](Item it) -> std::optional<char32_t> {
      set.items.push_back(it);
      return std::nullopt;
    };
    const auto single = [&](char32_t ch) -> std::optional<char32_t> {
      if (!in_class) add_char(set, ch);
      return ch;
    };
    switch (c) {
      case 's':
      case 'S':
        return item({Kind::WhiteSpace, c == 'S'});
      case 'd':
      case 'D':
        return item({Kind::Categories, c == 'D', 0, 0, category_bit(G::Nd)});
      case 'w':
      case 'W':
        return item({Kind::Categories, c == 'W', 0, 0,
                     kLetter | kMark | category_bit(G::Nd) | category_bit(G::Pc)});
      case 'p':
      case 'P': {
        if (!eat('{')) fail("\\p without {name}");
        std::string name;
        while (more() && peek() != '}') name += char(next());
        if (!eat('}')) fail("\\p{ without its }");
        const bool negated = (c == 'P') != (!name.empty() && name[0] == '^');
        if (!name.empty() && name[0] == '^') name.erase(0, 1);
        const uint32_t mask = category_mask(name);
        if (mask == 0) fail("an unknown property \\p{" + name + "}");
        return item({Kind::Categories, negated, 0, 0, mask});
      }
      case 'r':
        return single('\r');
      case 'n':
        return single('\n');
      case 't':
        return single('\t');
      case 'f':
        return single('\f');
      case 'v':
        return single('\v');
      case 'x':
      case 'u': {
        const bool braced = eat('{');
        const int digits = braced ? 8 : (c == 'x' ? 2 : 4);
        char32_t v = 0;
        int n = 0;
        for (; n < digits && more() && std::isxdigit(int(peek() < 128 ? peek() : 0)); ++n) {
          const char32_t d = next();
          v = v * 16 + char32_t(d <= '9' ? d - '0' : (d | 32) - 'a' + 10);
        }
        if (n == 0 || (braced && !eat('}')) || v > 0x10FFFF)
          fail("a malformed \\" + std::string(1, char(c)));
        return single(v);
      }
      default:
        if (c < 128 && std::isalnum(int(c)))
          fail(std::string("an unsupported escape \\") + char(c));
        return single(c);  // an escaped punctuation mark stands for itself
    }
  }

  std::string_view source_;
  std::u32string p_;
  size_t at_ = 0;
  bool case_insensitive_ = false;
  std::vector<PretokenRegex::CharSet>& sets_;
};

class Compiler {
 public:
  explicit Compiler(std::vector<PretokenRegex::Inst>& program) : prog_(program) {}

  void compile_program(const Node& root) {
    emit(root);
    prog_.push_back({PretokenRegex::Inst::Op::Match});
    // Lookaheads' bodies follow as programs of their own, each ending in Match.
    for (size_t i = 0; i < looks_.size(); ++i) {
      const auto [inst, node] = looks_[i];
      prog_[inst].a = int(prog_.size());
      emit(node->children[0]);
      prog_.push_back({PretokenRegex::Inst::Op::Match});
    }
  }

 private:
  using Op = PretokenRegex::Inst::Op;
  int here() const { return int(prog_.size()); }
  int push(PretokenRegex::Inst in) {
    prog_.push_back(in);
    return here() - 1;
  }

  void emit(const Node& n) {
    switch (n.type) {
      case Node::Type::Set:
        push({Op::Set, false, n.set});
        return;
      case Node::Type::Seq:
        for (const Node& c : n.children) emit(c);
        return;
      case Node::Type::Alt: {
        std::vector<int> jumps;
        for (size_t i = 0; i + 1 < n.children.size(); ++i) {
          const int split = push({Op::Split});
          prog_[size_t(split)].a = here();
          emit(n.children[i]);
          jumps.push_back(push({Op::Jump}));
          prog_[size_t(split)].b = here();
        }
        emit(n.children.back());
        for (int j : jumps) prog_[size_t(j)].a = here();
        return;
      }
      case Node::Type::Repeat: {
        const Node& body = n.children[0];
        for (int i = 0; i < n.min; ++i) emit(body);
        if (n.max == -1) {
          const int split = push({Op::Split});
          emit(body);
          push({Op::Jump, false, split});
          choose(split, split + 1, here(), n.greedy);
        } else {
          std::vector<int> splits;
          for (int i = n.min; i < n.max; ++i) {
            splits.push_back(push({Op::Split}));
            emit(body);
          }
          for (int s : splits) choose(s, s + 1, here(), n.greedy);
        }
        return;
      }
      case Node::Type::Look:
        looks_.emplace_back(size_t(push({Op::Look, n.negative})), &n);
        return;
    }
  }

  void choose(int split, int take, int skip, bool greedy) {
    prog_[size_t(split)].a = greedy ? take : skip;
    prog_[size_t(split)].b = greedy ? skip : take;
  }

  std::vector<PretokenRegex::Inst>& prog_;
  std::vector<std::pair<size_t, const Node*>> looks_;
};

}  // namespace

bool PretokenRegex::ClassItem::matches(char32_t c) const {
  bool in = false;
  switch (kind) {
    case Kind::Range:
      in = c >= lo && c <= hi;
      break;
    case Kind::Categories:
      in = (categories & category_bit(unicode::general_category(c))) != 0;
      break;
    case Kind::WhiteSpace:
      in = unicode::is_white_space(c);
      break;
    case Kind::AnyButNewline:
      in = c != '\n';
      break;
  }
  return in != negated;
}

bool PretokenRegex::CharSet::matches(char32_t c) const {
  bool in = false;
  for (const ClassItem& item : items)
    if (item.matches(c)) {
      in = true;
      break;
    }
  return in != negated;
}

PretokenRegex::PretokenRegex(std::string_view pattern) : pattern_(pattern) {
  const Node root = Parser(pattern, sets_).parse();
  Compiler(program_).compile_program(root);
}

std::optional<size_t> PretokenRegex::match_at(int pc0, std::u32string_view text, size_t at) const {
  // Backtracking in the order of preference: a Split tries its first target
  // and keeps the second for when that fails, so the first Match reached is
  // the one Oniguruma (and every Perl-style engine) reports.
  std::vector<std::pair<int, size_t>> stack{{pc0, at}};
  while (!stack.empty()) {
    auto [pc, pos] = stack.back();
    stack.pop_back();
    for (bool alive = true; alive;) {
      const Inst& in = program_[size_t(pc)];
      switch (in.op) {
        case Inst::Op::Set:
          if (pos < text.size() && sets_[size_t(in.a)].matches(text[pos])) {
            ++pc;
            ++pos;
          } else {
            alive = false;
          }
          break;
        case Inst::Op::Split:
          stack.emplace_back(in.b, pos);
          pc = in.a;
          break;
        case Inst::Op::Jump:
          pc = in.a;
          break;
        case Inst::Op::Look:
          if (match_at(in.a, text, pos).has_value() != in.negative)
            ++pc;
          else
            alive = false;
          break;
        case Inst::Op::Match:
          return pos;
      }
    }
  }
  return std::nullopt;
}

std::optional<PretokenRegex::Match> PretokenRegex::find(std::u32string_view text,
                                                        size_t from) const {
  for (size_t start = from; start <= text.size(); ++start)
    if (const auto end = match_at(0, text, start)) return Match{start, *end};
  return std::nullopt;
}

}  // namespace troupe
