#pragma once
// A context-free grammar over Unicode code points, read from GBNF (the
// grammar notation llama.cpp and vLLM's xgrammar accept):
//
//   root   ::= "{" ws pair ("," ws pair)* "}"     # a comment
//   pair   ::= [a-z]+ ":" ws ( "true" | "false" )
//   ws     ::= [ \t\n]*
//
// Literals "...", character classes [a-z0-9_] and [^"\\], `.` (any code
// point), rule names, groups ( ... ), alternatives |, and the repetitions
// * + ? {m} {m,} {m,n}. Repetitions and groups become rules of their own, so
// what the matcher walks is only rule references and character sets.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::grammar {

// A GBNF text that cannot be read, or a grammar that cannot be matched (an
// undefined rule, no `root`, left recursion); the message names the line and
// column, or the rule.
class GrammarError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One code point out of a set of ranges, or out of their complement.
struct CharSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive
  bool negated = false;

  bool contains(uint32_t cp) const {
    bool in = false;
    for (const auto& [lo, hi] : ranges)
      if (cp >= lo && cp <= hi) {
        in = true;
        break;
      }
    return in != negated;
  }
  // Whether some code point in [lo, hi] is in the set.
  bool intersects(uint32_t lo, uint32_t hi) const;
};

// The grammar, flat: every alternative of every rule is a run of elements
// ending with an End element, so a position in `elements` is a place in one
// alternative and the matcher's stacks are plain integers.
class Grammar {
 public:
  enum class Kind : uint8_t { End, Rule, Chars };
  struct Element {
    Kind kind = Kind::End;
    int32_t arg = 0;  // Rule: the rule's index; Chars: the set's index
  };

  // Reads GBNF; the rule named `root` is the start. Throws GrammarError.
  static Grammar parse(std::string_view gbnf);

  const std::vector<Element>& elements() const { return elements_; }
  // Where each alternative of rule r starts in elements().
  const std::vector<int32_t>& alternatives(int r) const { return alternatives_[size_t(r)]; }
  const CharSet& chars(int i) const { return sets_[size_t(i)]; }
  int root() const { return root_; }
  int rules() const { return int(alternatives_.size()); }
  const std::string& rule_name(int r) const { return names_[size_t(r)]; }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<std::vector<int32_t>> alternatives_;
  std::vector<CharSet> sets_;
  std::vector<std::string> names_;
  int root_ = -1;
};

// A string as a GBNF literal: "..." with quotes, backslashes and control
// characters escaped.
std::string gbnf_literal(std::string_view utf8);

}  // namespace troupe::grammar
