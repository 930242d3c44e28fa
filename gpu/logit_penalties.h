#pragma once
// What a sequence's sampling does to a row of logits before the draw:
// OpenAI's logit_bias, presence and frequency penalties and vLLM's repetition
// penalty, in vLLM's order (SamplingParams). Each touches only the ids it
// names or that the sequence holds, one f32 operation after another, so the
// adjusted row is the same in any layout and on any machine. The state is
// rebuilt from the sequence's tokens (StepItem::history), so a sequence
// resumed on another replica, or recomputed after preemption, continues
// exactly as if it had not stopped.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_vocabulary.h"
#include "service/reasoning_filter.h"
#include "service/request.h"
#include "service/step_item.h"

namespace troupe {

// The model's tokens as text, for structured output: made by whoever knows
// the tokenizer (the engine knows only ids), called on the first request with
// a grammar (a walk over the vocabulary), and null when there is none.
using VocabularySource = std::function<std::shared_ptr<const grammar::TokenVocabulary>()>;

// A sequence's grammar as the engine follows it: the grammar, compiled once
// for every sequence that asks for the same text, the cache of allowed-token
// masks those sequences share, and the vocabulary.
struct GrammarContext {
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<grammar::MaskCache> cache;
  std::shared_ptr<const grammar::TokenVocabulary> vocab;
  // The sequence asked for a grammar this engine cannot follow (no
  // vocabulary; a text that does not parse): it ends at once, logged. The
  // front end and the wire checks refuse such requests before they get here.
  bool unavailable = false;
};

class LogitPenalties {
 public:
  // eos_ids: the model's end-of-sequence ids, which with the request's
  // stop_token_ids are not drawn while fewer than min_tokens tokens have
  // been generated (`generated` so far: a sequence resumed elsewhere).
  // With `grammar` (the params' grammar, compiled), only tokens that keep the
  // output a prefix of the grammar's matches are drawn, and the end ids
  // (eos_ids and stop_token_ids) only when it is a whole match. With the
  // params' `reasoning`, that output is the reply after the reasoning (the
  // reasoning is free, and may end the answer).
  explicit LogitPenalties(const SamplingParams& params, std::span<const int> eos_ids = {},
                          int generated = 0, GrammarContext grammar = {});

  // The sequence so far replaces what was recorded: `tokens` is the prompt
  // followed by `generated` output tokens. Throws std::invalid_argument when
  // generated is negative or more than the tokens.
  void reset(std::span<const int> tokens, int generated);
  // A sampled id joins the output.
  void record(int id);
  // `logits` adjusted, into `out` (resized to match). Ids outside the row
  // are skipped: the front end refuses them before a request gets here.
  void apply(std::span<const float> logits, std::vector<float>& out) const;

  int output_count(int id) const;

 private:
  bool is_end(int id) const;
  // A matcher at the grammar's start (or the sequence marked to end, when
  // the grammar is too ambiguous to follow from there).
  void start_grammar();
  // The grammar's part of apply(): -inf for every id the matcher refuses.
  void apply_grammar(std::vector<float>& out) const;
  // The grammar's state after `id`; a token it refuses (one drawn when
  // nothing was allowed) leaves it where it was.
  void advance_grammar(int id);
  // Where the answer may open reasoning or start its reply: whether a token
  // with these bytes may come next.
  bool takes_undecided(std::string_view bytes) const;

  SamplingParams params_;
  std::vector<int> ends_;     // ids that end the sequence: -inf before min_tokens
  std::vector<int> end_ids_;  // all of them, for the grammar
  GrammarContext grammar_;
  std::optional<grammar::Matcher> matcher_;
  // Where the grammar stands in the answer: before its reply (in the
  // reasoning, or where the answer may still open it: told by `reasoning_`,
  // as the front end tells them apart), or following the reply.
  enum class Phase { Reasoning, Reply } phase_ = Phase::Reply;
  std::optional<ReasoningFilter> reasoning_;
  mutable bool grammar_failed_ = false;  // the grammar could not be followed: only ends
  mutable std::vector<uint8_t> allowed_;
  int generated_ = 0;
  // The output's last ids, as many as the longest bad word has before its
  // last (oldest first).
  std::vector<int> recent_;
  size_t recent_kept_ = 0;
  std::unordered_map<int, int> output_;  // id -> occurrences in the output
  std::vector<int> seen_;                // ids in the prompt or the output, ascending
};

// An engine's penalties, per sequence: made at a sequence's first sampled
// step, rebuilt wherever an item carries the sequence's history, dropped on
// release.
class SequencePenalties {
 public:
  // The model's end-of-sequence ids (min_tokens keeps them from being drawn).
  void set_eos_ids(std::vector<int> ids) { eos_ids_ = std::move(ids); }
  // Where the model's tokens as text come from, for sequences with a grammar.
  void set_vocabulary(VocabularySource source) { vocabulary_source_ = std::move(source); }
  // The row the item's sequence draws from: `logits` adjusted by its
  // penalties, or `logits` itself when its sampling adjusts nothing. The
  // adjusted row lives until the next call.
  std::span<const float> adjust(const StepItem& item, std::span<const float> logits);
  // The id the item's sequence drew joins its output (nothing for a
  // sequence whose sampling adjusts nothing).
  void record(uint64_t seq, int id);
  void release(uint64_t seq) { seqs_.erase(seq); }
  size_t size() const { return seqs_.size(); }

 private:
  // The item's grammar compiled (or found compiled), with the vocabulary;
  // `unavailable` when there is no vocabulary or the grammar does not parse.
  GrammarContext grammar_for(const std::string& text);

  std::unordered_map<uint64_t, LogitPenalties> seqs_;
  std::vector<float> row_;
  std::vector<int> eos_ids_;
  VocabularySource vocabulary_source_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  // Grammars by their text, the most recently used last; a few are kept.
  std::vector<std::pair<std::string, GrammarContext>> grammars_;
};

}  // namespace troupe
