#pragma once
// The regular expressions of Hugging Face tokenizers' pre-tokenizers (GPT-2's,
// Llama 3's, Qwen2's, ...), over code points, with the semantics of the
// Oniguruma engine the tokenizers library uses: leftmost match, alternatives
// tried in order, greedy quantifiers that backtrack.
//
// The syntax is the subset those patterns are written in: literals, `.`,
// classes `[...]` `[^...]` with ranges, `\s \S \d \D \w \W \p{..} \P{..}`
// (general categories: `L`, `Lu`, `N`, `Nd`, ... and `LC`), `\r \n \t \f \v`,
// `\xHH \x{H..} \uHHHH`, escaped punctuation, groups `(..)` `(?:..)`,
// `(?i:..)` (ASCII case folding), lookahead `(?=..)` `(?!..)`, alternation
// and the quantifiers `? * + {n} {n,} {n,m}` (lazy with a trailing `?`).
// Anything else (anchors, backreferences, lookbehind, possessive
// quantifiers) is refused when the pattern is compiled, with the place named.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class PretokenRegex {
 public:
  // Throws std::invalid_argument naming the pattern, what is not supported or
  // malformed, and where.
  explicit PretokenRegex(std::string_view pattern);

  struct Match {
    size_t begin = 0, end = 0;  // code points, [begin, end)
  };
  // The leftmost match that starts at or after `from`.
  std::optional<Match> find(std::u32string_view text, size_t from) const;

  const std::string& pattern() const { return pattern_; }

  struct ClassItem {
    enum class Kind : uint8_t { Range, Categories, WhiteSpace, AnyButNewline } kind;
    bool negated = false;
    char32_t lo = 0, hi = 0;
    uint32_t categories = 0;  // bits of unicode::GeneralCategory
    bool matches(char32_t c) const;
  };
  struct CharSet {
    std::vector<ClassItem> items;
    bool negated = false;
    bool matches(char32_t c) const;
  };
  struct Inst {
    enum class Op : uint8_t { Set, Split, Jump, Look, Match } op;
    bool negative = false;  // Look: (?!..) rather than (?=..)
    int a = 0;              // Set: the set; Split/Jump: the preferred target; Look: its program
    int b = 0;              // Split: the other target
  };

 private:
  std::optional<size_t> match_at(int pc, std::u32string_view text, size_t at) const;

  std::string pattern_;
  std::vector<CharSet> sets_;
  std::vector<Inst> program_;  // the pattern from 0; lookaheads' programs after it
};

}  // namespace troupe
