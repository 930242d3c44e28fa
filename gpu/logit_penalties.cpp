#include "gpu/logit_penalties.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "gpu/sampler.h"

namespace troupe {

namespace {
constexpr float kMasked = -std::numeric_limits<float>::infinity();
constexpr size_t kKeptGrammars = 16;
}  // namespace

LogitPenalties::LogitPenalties(const SamplingParams& params, std::span<const int> eos_ids,
                               int generated, GrammarContext grammar)
    : params_(params), grammar_(std::move(grammar)), generated_(generated) {
  // Written so that NaN fails each check.
  auto check = [](bool ok, const char* name, float v, const char* range) {
    if (!ok)
      throw std::invalid_argument(std::string("sampler: ") + name + " must be in " + range +
                                  ", got " + std::to_string(v));
  };
  const SamplingParams& p = params;
  check(p.presence_penalty >= -2 && p.presence_penalty <= 2, "presence_penalty", p.presence_penalty,
        "[-2, 2]");
  check(p.frequency_penalty >= -2 && p.frequency_penalty <= 2, "frequency_penalty",
        p.frequency_penalty, "[-2, 2]");
  check(p.repetition_penalty > 0 && p.repetition_penalty <= 2, "repetition_penalty",
        p.repetition_penalty, "(0, 2]");
  for (const auto& [id, bias] : p.logit_bias)
    check(bias >= -100 && bias <= 100, "a logit_bias value", bias, "[-100, 100]");
  if (p.min_tokens < 0)
    throw std::invalid_argument("sampler: min_tokens must be >= 0, got " +
                                std::to_string(p.min_tokens));
  for (const auto& word : p.bad_words) {
    if (word.empty()) throw std::invalid_argument("sampler: a bad word has no tokens");
    recent_kept_ = std::max(recent_kept_, word.size() - 1);
  }
  end_ids_.assign(eos_ids.begin(), eos_ids.end());
  end_ids_.insert(end_ids_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  if (p.min_tokens > 0) ends_ = end_ids_;
  if (grammar_.unavailable) grammar_failed_ = true;
  if (grammar_.grammar && grammar_.vocab) start_grammar();
}

void LogitPenalties::start_grammar() {
  grammar_failed_ = grammar_.unavailable;
  phase_ = params_.reasoning == ReasoningStart::None ? Phase::Reply : Phase::Reasoning;
  reasoning_.reset();
  if (phase_ == Phase::Reasoning) reasoning_.emplace(params_.reasoning);
  try {
    matcher_.emplace(grammar_.grammar, grammar_.cache);
  } catch (const grammar::GrammarError& e) {
    spdlog::error("structured output: {}; the sequence is ended", e.what());
    grammar_failed_ = true;
  }
}

bool LogitPenalties::is_end(int id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

void LogitPenalties::advance_grammar(int id) {
  if (!matcher_ || grammar_failed_ || is_end(id)) return;
  if (id < 0 || id >= grammar_.vocab->size() || grammar_.vocab->is_control(id)) return;
  std::string_view bytes = grammar_.vocab->bytes(id);
  std::string reply;
  if (phase_ == Phase::Reasoning) {
    reply = reasoning_->push(bytes).content;
    if (!reasoning_->in_content()) return;
    reasoning_.reset();
    phase_ = Phase::Reply;
    bytes = reply;
  }
  try {
    matcher_->accept(bytes);
  } catch (const grammar::GrammarError& e) {
    // Too ambiguous to follow any further: end the sequence rather than
    // let it go on unconstrained.
    spdlog::error("structured output: {}; the sequence is ended", e.what());
    grammar_failed_ = true;
  }
}

bool LogitPenalties::takes_undecided(std::string_view bytes) const {
  // What the filter holds (whitespace, or the first bytes of "<think>" the
  // grammar took as text) goes on with the token, as reasoning or reply.
  const std::string text = std::string(reasoning_->held()).append(bytes);
  const size_t first = text.find_first_not_of(" \n\t\r");
  const std::string_view rest =
      first == std::string::npos ? std::string_view() : std::string_view(text).substr(first);
  // "<think>" comes whole, as reasoning models have it (one token), unless
  // the grammar took its first bytes: a model that merely leans to "<" is
  // not led into reasoning by it.
  if (rest.starts_with(kReasoningOpen)) return true;
  if (!reasoning_->held_after_space().empty() && kReasoningOpen.starts_with(rest)) return true;
  return matcher_->allows(text);
}

void LogitPenalties::apply_grammar(std::vector<float>& out) const {
  const size_t n = out.size();
  auto ends_only = [&] {
    for (size_t id = 0; id < n; ++id)
      if (!is_end(int(id))) out[id] = kMasked;
  };
  if (grammar_failed_ || !matcher_) return ends_only();
  // The reasoning itself is free.
  if (phase_ == Phase::Reasoning && !reasoning_->undecided()) return;
  const grammar::TokenVocabulary& vocab = *grammar_.vocab;
  const bool complete = matcher_->is_complete();
  const bool undecided = phase_ == Phase::Reasoning;
  auto takes = [&](int id) {
    if (id >= vocab.size() || vocab.is_control(id)) return false;
    return undecided ? takes_undecided(vocab.bytes(id)) : matcher_->allows(vocab.bytes(id));
  };
  // Greedy needs only the best token: when the grammar takes it, it is also
  // the best of those the grammar takes (and the lowest id among equals).
  if (params_.temperature <= 0) {
    const int best = argmax(out);
    if ((is_end(best) ? complete : takes(best)) && out[size_t(best)] != kMasked) return;
  }
  try {
    matcher_->allowed_tokens(vocab, allowed_);
  } catch (const grammar::GrammarError& e) {
    spdlog::error("structured output: {}; the sequence is ended", e.what());
    grammar_failed_ = true;
    return ends_only();
  }
  if (undecided) {
    // The trie walk found the tokens the grammar takes as they are, which is
    // right when nothing is held: to them come those that open the
    // reasoning. With something held, each token is judged after it.
    const bool held = !reasoning_->held().empty();
    for (size_t id = 0; id < allowed_.size(); ++id) {
      if (vocab.is_control(int(id))) continue;
      const std::string& b = vocab.bytes(int(id));
      if (held) {
        allowed_[id] = takes_undecided(b) ? 1 : 0;
      } else if (!allowed_[id] && !b.empty() && (b[0] == '<' || is_reasoning_space(b[0]))) {
        const size_t first = b.find_first_not_of(" \n\t\r");
        if (first != std::string::npos &&
            b.compare(first, kReasoningOpen.size(), kReasoningOpen) == 0)
          allowed_[id] = 1;
      }
    }
  }
  bool any = false;
  for (size_t id = 0; id < n; ++id) {
    if (is_end(int(id))) continue;
    if (id >= allowed_.size() || !allowed_[id]) {
      out[id] = kMasked;
    } else if (out[id] != kMasked) {
      any = true;
    }
  }
  // The end ids only once the text is a whole match; and when nothing else
  // can follow (a grammar the vocabulary cannot spell on), they end it.
  if (complete || !any) return;
  for (int id : end_ids_)
    if (id >= 0 && size_t(id) < n) out[size_t(id)] = kMasked;
}

void LogitPenalties::reset(std::span<const int> tokens, int generated) {
  if (generated < 0 || size_t(generated) > tokens.size())
    throw std::invalid_argument("penalties: " + std::to_string(generated) +
                                " generated tokens in a history of " +
                                std::to_string(tokens.size()));
  generated_ = generated;
  if (matcher_) {
    start_grammar();
    for (size_t i = tokens.size() - size_t(generated); i < tokens.size(); ++i)
      advance_grammar(tokens[i]);
  }
  output_.clear();
  for (size_t i = tokens.size() - size_t(generated); i < tokens.size(); ++i) ++output_[tokens[i]];
  const size_t recent = std::min(recent_kept_, size_t(generated));
  recent_.assign(tokens.end() - std::ptrdiff_t(recent), tokens.end());
  seen_.clear();
  if (params_.repetition_penalty == 1) return;  // only the repetition penalty reads the prompt
  seen_.assign(tokens.begin(), tokens.end());
  std::sort(seen_.begin(), seen_.end());
  seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
}

void LogitPenalties::record(int id) {
  ++generated_;
  advance_grammar(id);
  ++output_[id];
  if (recent_kept_ > 0) {
    recent_.push_back(id);
    if (recent_.size() > recent_kept_) recent_.erase(recent_.begin());
  }
  if (params_.repetition_penalty == 1) return;
  const auto at = std::lower_bound(seen_.begin(), seen_.end(), id);
  if (at == seen_.end() || *at != id) seen_.insert(at, id);
}

int LogitPenalties::output_count(int id) const {
  const auto it = output_.find(id);
  return it == output_.end() ? 0 : it->second;
}

void LogitPenalties::apply(std::span<const float> logits, std::vector<float>& out) const {
  out.assign(logits.begin(), logits.end());
  const size_t n = out.size();
  auto inside = [n](int id) { return id >= 0 && size_t(id) < n; };
  for (const auto& [id, bias] : params_.logit_bias)
    if (inside(id)) out[size_t(id)] += bias;
  const float r = params_.repetition_penalty;
  if (r != 1)
    for (int id : seen_)
      if (inside(id)) {
        float& l = out[size_t(id)];
        l = l > 0 ? l / r : l * r;
      }
  const float freq = params_.frequency_penalty, presence = params_.presence_penalty;
  if (freq != 0 || presence != 0)
    for (const auto& [id, count] : output_)
      if (inside(id)) {
        float& l = out[size_t(id)];
        l -= freq * float(count);
        l -= presence;
      }
  // Last, so that no bias or penalty brings them back (vLLM's order).
  if (generated_ < params_.min_tokens)
    for (int id : ends_)
      if (inside(id)) out[size_t(id)] = kMasked;
  for (const auto& word : params_.bad_words) {
    const size_t before = word.size() - 1;
    if (before > recent_.size() ||
        !std::equal(word.begin(), word.end() - 1, recent_.end() - std::ptrdiff_t(before)))
      continue;
    if (inside(word.back())) out[size_t(word.back())] = kMasked;
  }
  if (!params_.allowed_token_ids.empty()) {
    auto allowed = params_.allowed_token_ids.begin();
    for (size_t id = 0; id < n; ++id) {
      while (allowed != params_.allowed_token_ids.end() && size_t(*allowed) < id) ++allowed;
      if (allowed == params_.allowed_token_ids.end() || size_t(*allowed) != id) out[id] = kMasked;
    }
  }
  if (matcher_ || grammar_failed_) apply_grammar(out);
}

std::span<const float> SequencePenalties::adjust(const StepItem& item,
                                                 std::span<const float> logits) {
  if (!item.sampling.adjusts_logits()) return logits;
  auto it = seqs_.find(item.seq);
  if (it == seqs_.end()) {
    GrammarContext g;
    if (!item.sampling.grammar.empty()) g = grammar_for(item.sampling.grammar);
    it = seqs_
             .emplace(item.seq,
                      LogitPenalties(item.sampling, eos_ids_, item.generated, std::move(g)))
             .first;
  }
  if (!item.history.empty()) it->second.reset(item.history, item.generated);
  it->second.apply(logits, row_);
  return row_;
}

GrammarContext SequencePenalties::grammar_for(const std::string& text) {
  for (size_t i = 0; i < grammars_.size(); ++i)
    if (grammars_[i].first == text) {
      std::rotate(grammars_.begin() + long(i), grammars_.begin() + long(i) + 1, grammars_.end());
      return grammars_.back().second;
    }
  GrammarContext g;
  if (!vocab_ && vocabulary_source_) {
    try {
      vocab_ = vocabulary_source_();
    } catch (const std::exception& e) {
      spdlog::error("structured output: the model's vocabulary could not be read: {}", e.what());
    }
  }
  if (!vocab_) {
    spdlog::error(
        "structured output: a sequence asks for a grammar, but this engine has no vocabulary (the "
        "model's tokenizer); it is ended");
    g.unavailable = true;
    return g;
  }
  try {
    g.grammar = std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(text));
  } catch (const grammar::GrammarError& e) {
    spdlog::error("structured output: {}; the sequence is ended", e.what());
    g.unavailable = true;
    return g;
  }
  g.cache = std::make_shared<grammar::MaskCache>();
  g.vocab = vocab_;
  if (grammars_.size() >= kKeptGrammars) grammars_.erase(grammars_.begin());
  grammars_.emplace_back(text, g);
  return g;
}

void SequencePenalties::record(uint64_t seq, int id) {
  const auto it = seqs_.find(seq);
  if (it != seqs_.end()) it->second.record(id);
}

}  // namespace troupe
