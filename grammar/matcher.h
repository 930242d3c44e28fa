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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"

namespace troupe::grammar {

// The allowed tokens of the states a grammar has been in, kept for the next
// time a sequence (any sequence of the same grammar and vocabulary) is in one
// of them: inside a JSON string every step is in the same state, and
// its ~150,000-token walk is then a lookup. Bounded; safe to share between
// threads.
class MaskCache {
 public:
  // A state's allowed tokens, one bit per id: a 150,000-token vocabulary's
  // mask is 19 KB, so a full cache of a grammar holds about 1.2 MB.
  struct Mask {
    size_t tokens = 0;
    std::vector<uint64_t> bits;
  };

  explicit MaskCache(size_t max_entries = 64) : max_(max_entries) {}
  std::shared_ptr<const Mask> find(const std::vector<std::vector<int32_t>>& state);
  void put(const std::vector<std::vector<int32_t>>& state, std::shared_ptr<const Mask> mask);

 private:
  size_t max_;
  std::mutex mu_;
  std::map<std::vector<std::vector<int32_t>>, std::shared_ptr<const Mask>> map_;
  std::vector<std::vector<std::vector<int32_t>>> order_;  // oldest first
};

class Matcher {
 public:
  // Throws GrammarError when the grammar is too ambiguous to follow (more
  // than kMaxStacks readings at once). `cache` (optional) is shared by the
  // matchers of one grammar over one vocabulary.
  explicit Matcher(std::shared_ptr<const Grammar> grammar,
                   std::shared_ptr<MaskCache> cache = nullptr);

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
  struct Walk;
  void walk(const TokenVocabulary& vocab, int node, int set, Walk& w,
            std::vector<uint8_t>& allowed) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<MaskCache> cache_;
  Stacks stacks_;
  std::string pending_;  // the first bytes of a code point the next token finishes
};

// What is wrong with a grammar text as a sequence's sampling takes it (it
// parses, and a matcher can start on it), or "" when nothing is.
std::string grammar_problem(std::string_view gbnf);

}  // namespace troupe::grammar
