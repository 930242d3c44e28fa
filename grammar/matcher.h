#pragma once
// Where a text stands in a grammar, and which tokens may come next.
//
// The state is a set of stacks, as in llama.cpp's grammar sampler: each stack
// is one way of reading the text so far, holding positions in the grammar's
// flat elements (the top is the character set the next code point must be
// in; those below are what follows when the rule above ends). An empty stack
// is a reading that has matched the whole of `root`. A token's bytes may end
// inside a code point; those bytes wait for the next token.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"

namespace troupe::grammar {

class Matcher {
 public:
  // Throws GrammarError when the grammar is too ambiguous to follow (more
  // than kMaxStacks readings at once).
  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  static constexpr size_t kMaxStacks = 4096;

  // Moves past `bytes` if the grammar allows them here and returns true;
  // otherwise returns false and the state is unchanged.
  bool accept(std::string_view bytes);
  // The text so far is a whole match of `root` (an end of sequence may come).
  bool is_complete() const;
  // Some text may still follow.
  bool can_continue() const;

  // allowed[id] = 1 for each non-control token of `vocab` whose bytes the
  // grammar allows next, else 0 (control tokens always 0: the caller decides
  // the end-of-sequence ids from is_complete()).
  void allowed_tokens(const TokenVocabulary& vocab, std::vector<uint8_t>& allowed) const;
  // Whether one token's bytes may come next (cheaper than allowed_tokens for
  // checking the token a sampler already chose).
  bool allows(std::string_view bytes) const;

 private:
  using Stack = std::vector<int32_t>;
  using Stacks = std::vector<Stack>;

  void expand(Stack stack, Stacks& out, int depth) const;
  // The readings after code point cp (empty when none takes it), deduplicated.
  Stacks advance(const Stacks& from, uint32_t cp) const;
  // Whether some reading's next character could start with `prefix`.
  bool takes_prefix(const Stacks& stacks, std::string_view prefix) const;
  // The readings after `bytes`, given pending bytes; false if refused.
  bool step(const Stacks& from, const std::string& pending, std::string_view bytes, Stacks* to,
            std::string* pending_out) const;
  void walk(const TokenVocabulary& vocab, int node, const Stacks& stacks,
            std::vector<uint8_t>& allowed) const;

  std::shared_ptr<const Grammar> grammar_;
  Stacks stacks_;
  std::string pending_;  // the first bytes of a code point the next token finishes
};

}  // namespace troupe::grammar
