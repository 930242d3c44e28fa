#include "actors/wire_checks.h"

#include <cmath>
#include <cstdint>
#include <unordered_set>

#include "gpu/dtype.h"
#include "grammar/matcher.h"
#include "util/utf8.h"

namespace troupe {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

std::string str(double v) {
  return std::to_string(v);
}

// Ids of the vocabulary, ascending, at most `most` of them.
std::string id_set_problem(const char* name, const std::vector<int>& ids, int most,
                           int vocab_size) {
  const std::string field = std::string("sampling.") + name;
  if (ids.size() > size_t(most))
    return field + " has " + str(int64_t(ids.size())) + " entries, more than " + str(int64_t(most));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || (vocab_size > 0 && ids[i] >= vocab_size))
      return field + " id " + str(int64_t(ids[i])) + " is outside the vocabulary";
    if (i > 0 && ids[i] <= ids[i - 1])
      return field + " are not ascending at id " + str(int64_t(ids[i]));
  }
  return {};
}

}  // namespace

std::string sampling_problem(const SamplingParams& s, int vocab_size, bool parse_grammar) {
  if (!(std::isfinite(s.temperature) && s.temperature >= 0))
    return "sampling.temperature " + str(double(s.temperature)) + " is not a number >= 0";
  if (!(s.top_p > 0 && s.top_p <= 1))
    return "sampling.top_p " + str(double(s.top_p)) + " is outside (0, 1]";
  if (s.top_k < 0) return "sampling.top_k " + str(int64_t(s.top_k)) + " is negative";
  if (s.logprobs < -1 || s.logprobs > kMaxLogprobs)
    return "sampling.logprobs " + str(int64_t(s.logprobs)) + " is outside [-1, " +
           str(int64_t(kMaxLogprobs)) + "]";
  if (s.prompt_logprobs < -1 || s.prompt_logprobs > kMaxLogprobs)
    return "sampling.prompt_logprobs " + str(int64_t(s.prompt_logprobs)) + " is outside [-1, " +
           str(int64_t(kMaxLogprobs)) + "]";
  // Written so that NaN fails each check.
  const std::pair<const char*, float> penalties[] = {{"presence_penalty", s.presence_penalty},
                                                     {"frequency_penalty", s.frequency_penalty}};
  for (const auto& [name, v] : penalties)
    if (!(v >= -2 && v <= 2))
      return std::string("sampling.") + name + " " + str(double(v)) + " is outside [-2, 2]";
  if (!(s.repetition_penalty > 0 && s.repetition_penalty <= 2))
    return "sampling.repetition_penalty " + str(double(s.repetition_penalty)) +
           " is outside (0, 2]";
  if (s.logit_bias.size() > size_t(kMaxLogitBias))
    return "sampling.logit_bias has " + str(int64_t(s.logit_bias.size())) + " entries, more than " +
           str(int64_t(kMaxLogitBias));
  for (size_t i = 0; i < s.logit_bias.size(); ++i) {
    const auto [id, bias] = s.logit_bias[i];
    if (id < 0 || (vocab_size > 0 && id >= vocab_size))
      return "sampling.logit_bias id " + str(int64_t(id)) + " is outside the vocabulary";
    if (i > 0 && id <= s.logit_bias[i - 1].first)
      return "sampling.logit_bias ids are not ascending at id " + str(int64_t(id));
    if (!(bias >= -100 && bias <= 100))
      return "sampling.logit_bias of id " + str(int64_t(id)) + " is " + str(double(bias)) +
             ", outside [-100, 100]";
  }
  if (!(s.min_p >= 0 && s.min_p <= 1))
    return "sampling.min_p " + str(double(s.min_p)) + " is outside [0, 1]";
  if (s.min_tokens < 0) return "sampling.min_tokens " + str(int64_t(s.min_tokens)) + " is negative";
  if (auto e = id_set_problem("stop_token_ids", s.stop_token_ids, kMaxStopTokenIds, vocab_size);
      !e.empty())
    return e;
  if (auto e =
          id_set_problem("allowed_token_ids", s.allowed_token_ids, kMaxAllowedTokenIds, vocab_size);
      !e.empty())
    return e;
  if (s.bad_words.size() > size_t(kMaxBadWords))
    return "sampling.bad_words has " + str(int64_t(s.bad_words.size())) + " words, more than " +
           str(int64_t(kMaxBadWords));
  for (const auto& word : s.bad_words) {
    if (word.empty() || word.size() > size_t(kMaxBadWordTokens))
      return "sampling.bad_words has a word of " + str(int64_t(word.size())) +
             " tokens, outside [1, " + str(int64_t(kMaxBadWordTokens)) + "]";
    for (int id : word)
      if (id < 0 || (vocab_size > 0 && id >= vocab_size))
        return "sampling.bad_words id " + str(int64_t(id)) + " is outside the vocabulary";
  }
  if (s.grammar.size() > kMaxGrammarBytes)
    return "sampling.grammar has " + str(int64_t(s.grammar.size())) + " bytes, more than " +
           str(int64_t(kMaxGrammarBytes));
  if (parse_grammar && !s.grammar.empty())
    if (std::string e = grammar::grammar_problem(s.grammar); !e.empty())
      return "sampling.grammar: " + e;
  if (s.reasoning < ReasoningStart::None || s.reasoning > ReasoningStart::Open)
    return "sampling.reasoning " + str(int64_t(s.reasoning)) + " is not a reasoning start";
  return {};
}

std::string replica_plan_problem(const ReplicaPlan& p) {
  if (p.replica < 0) return "replica " + str(int64_t(p.replica)) + " is negative";
  if (p.pipeline < 1 || p.tensor < 1)
    return "layout " + str(int64_t(p.pipeline)) + "x" + str(int64_t(p.tensor)) +
           ": pipeline and tensor must be >= 1";
  const int64_t devices = int64_t(p.pipeline) * p.tensor;
  if (devices > kMaxWireDevices)
    return "layout " + str(int64_t(p.pipeline)) + "x" + str(int64_t(p.tensor)) + " has " +
           str(devices) + " devices, more than " + str(int64_t(kMaxWireDevices));
  if (!p.stage_bounds.empty()) {
    if (p.stage_bounds.size() != size_t(p.pipeline) + 1)
      return "stage_bounds has " + str(int64_t(p.stage_bounds.size())) + " entries for " +
             str(int64_t(p.pipeline)) + " stages (want stages + 1)";
    if (p.stage_bounds[0] != 0) return "stage_bounds does not start at layer 0";
    for (size_t s = 0; s + 1 < p.stage_bounds.size(); ++s)
      if (p.stage_bounds[s + 1] <= p.stage_bounds[s])
        return "stage_bounds is not increasing at stage " + str(int64_t(s));
  }
  if (p.block_tokens < 1) return "block_tokens " + str(int64_t(p.block_tokens)) + " is below 1";
  if (p.blocks < 1) return "blocks " + str(int64_t(p.blocks)) + " is below 1";
  if (!parse_dtype(p.kv_dtype)) return "kv_dtype '" + p.kv_dtype + "' is not f32, f16 or bf16";
  if (p.max_batch_sequences < 1 || p.max_batch_tokens < 1 || p.prefill_chunk_tokens < 1)
    return "batch limits must be >= 1 (max_batch_sequences " + str(int64_t(p.max_batch_sequences)) +
           ", max_batch_tokens " + str(int64_t(p.max_batch_tokens)) + ", prefill_chunk_tokens " +
           str(int64_t(p.prefill_chunk_tokens)) + ")";
  if (p.prefill_chunk_tokens > p.max_batch_tokens)
    return "prefill_chunk_tokens " + str(int64_t(p.prefill_chunk_tokens)) +
           " is more than max_batch_tokens " + str(int64_t(p.max_batch_tokens));
  if (p.hosts.empty()) {
    if (p.part != 0) return "part " + str(int64_t(p.part)) + " of a replica in one part";
    if (p.part_names.size() > 1)
      return str(int64_t(p.part_names.size())) + " part names but no hosts";
    return {};
  }
  if (p.hosts.size() != size_t(devices))
    return str(int64_t(p.hosts.size())) + " hosts for " + str(devices) + " devices";
  const auto parts = int64_t(p.part_names.size());
  for (size_t d = 0; d < p.hosts.size(); ++d)
    if (p.hosts[d] < 0 || p.hosts[d] >= parts)
      return "device " + str(int64_t(d)) + "'s host " + str(int64_t(p.hosts[d])) +
             " is not one of the " + str(parts) + " parts";
  if (p.part < 0 || p.part >= parts)
    return "part " + str(int64_t(p.part)) + " is not one of the " + str(parts) + " parts";
  for (int64_t q = 0; q < parts; ++q)
    if (p.devices_of(int(q)) == 0) return "part " + str(q) + " has no devices";
  return {};
}

std::string assignment_problem(const Assignment& a, int vocab_size, int context_length) {
  if (a.tokens.empty()) return "request " + std::to_string(a.id) + " has no tokens";
  if (context_length > 0 && a.tokens.size() > size_t(context_length))
    return "request " + std::to_string(a.id) + " has " + str(int64_t(a.tokens.size())) +
           " tokens, more than the context length " + str(int64_t(context_length));
  for (size_t i = 0; i < a.tokens.size(); ++i)
    if (a.tokens[i] < 0 || (vocab_size > 0 && a.tokens[i] >= vocab_size))
      return "request " + std::to_string(a.id) + ": token " + str(int64_t(i)) + " (id " +
             str(int64_t(a.tokens[i])) + ") is outside the vocabulary";
  // tokens = prompt + delivered, and a prompt has at least one token.
  if (a.generated < 0 || size_t(a.generated) >= a.tokens.size())
    return "request " + std::to_string(a.id) + ": generated " + str(int64_t(a.generated)) +
           " is not in [0, " + str(int64_t(a.tokens.size())) + ")";
  if (a.max_tokens < 1)
    return "request " + std::to_string(a.id) + ": max_tokens " + str(int64_t(a.max_tokens)) +
           " is below 1";
  if (auto p = sampling_problem(a.sampling, vocab_size); !p.empty())
    return "request " + std::to_string(a.id) + ": " + p;
  return {};
}

std::string step_problem(const std::vector<StepItem>& items, int microbatches,
                         const StepLimits& limits) {
  if (items.empty()) return "a step with no items";
  if (limits.max_sequences > 0 && items.size() > size_t(limits.max_sequences))
    return "a step of " + str(int64_t(items.size())) + " items, more than " +
           str(int64_t(limits.max_sequences));
  if (microbatches < 1 || size_t(microbatches) > items.size())
    return "microbatches " + str(int64_t(microbatches)) + " is not in [1, " +
           str(int64_t(items.size())) + "]";
  std::unordered_set<uint64_t> seqs;
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    const std::string item =
        "item " + str(int64_t(i)) + " (sequence " + std::to_string(it.seq) + ")";
    if (!seqs.insert(it.seq).second) return item + " is in the step twice";
    if (it.tokens.empty()) return item + " has no tokens";
    total += int64_t(it.tokens.size());
    for (int t : it.tokens)
      if (t < 0 || (limits.vocab_size > 0 && t >= limits.vocab_size))
        return item + ": token id " + str(int64_t(t)) + " is outside the vocabulary";
    if (it.position < 0) return item + ": position " + str(int64_t(it.position)) + " is negative";
    const int64_t end = int64_t(it.position) + int64_t(it.tokens.size());
    if (limits.context_length > 0 && end > limits.context_length)
      return item + " ends at position " + str(end) + ", past the context length " +
             str(int64_t(limits.context_length));
    if (limits.block_tokens > 0 && int64_t(it.blocks.size()) * limits.block_tokens < end)
      return item + "'s " + str(int64_t(it.blocks.size())) + " blocks do not cover position " +
             str(end);
    for (int b : it.blocks)
      if (b < 0 || (limits.kv_blocks > 0 && b >= limits.kv_blocks))
        return item + ": KV block " + str(int64_t(b)) + " is outside the cache";
    // A new sampler skips this many draws (a prefill chunk of a resumed
    // sequence may carry more than it ends at, but never past the context).
    if (it.generated < 0 || (limits.context_length > 0 && it.generated > limits.context_length))
      return item + ": generated " + str(int64_t(it.generated)) + " is not in [0, context]";
    if (auto p = sampling_problem(it.sampling, limits.vocab_size, /*parse_grammar=*/false);
        !p.empty())
      return item + ": " + p;
    // The sequence as far as known: through this item's tokens, and ending
    // with them where the item samples (its output is the history's end).
    if (!it.history.empty()) {
      const int64_t h = int64_t(it.history.size());
      if (it.sample ? h != end : h < end)
        return item + "'s history has " + str(h) + " tokens, " +
               (it.sample ? "not the " : "fewer than the ") + str(end) + " it ends at";
      if (limits.context_length > 0 && h > limits.context_length)
        return item + "'s history has " + str(h) + " tokens, more than the context length " +
               str(int64_t(limits.context_length));
      if (int64_t(it.generated) > h)
        return item + ": generated " + str(int64_t(it.generated)) + " is more than its history";
      for (int t : it.history)
        if (t < 0 || (limits.vocab_size > 0 && t >= limits.vocab_size))
          return item + ": history token id " + str(int64_t(t)) + " is outside the vocabulary";
    }
  }
  if (limits.max_tokens > 0 && total > limits.max_tokens)
    return "a step of " + str(total) + " tokens, more than " + str(int64_t(limits.max_tokens));
  return {};
}

std::string step_events_problem(const StepEvents& ev) {
  if (ev.replica < 0) return "replica " + str(int64_t(ev.replica)) + " is negative";
  if (!(std::isfinite(ev.step_s) && ev.step_s >= 0))
    return "step_s " + str(ev.step_s) + " is not a number >= 0";
  const std::pair<const char*, int> counts[] = {
      {"batch_sequences", ev.batch_sequences}, {"batch_tokens", ev.batch_tokens},
      {"prefill_tokens", ev.prefill_tokens},   {"running", ev.running},
      {"queued_tokens", ev.queued_tokens},     {"blocks_used", ev.blocks_used},
      {"blocks_free", ev.blocks_free}};
  for (const auto& [name, v] : counts)
    if (v < 0) return std::string(name) + " " + str(int64_t(v)) + " is negative";
  if (ev.prefill_tokens > ev.batch_tokens)
    return "prefill_tokens " + str(int64_t(ev.prefill_tokens)) + " is more than batch_tokens " +
           str(int64_t(ev.batch_tokens));
  // A log-probability is <= 0 or -inf; NaN is never one.
  auto malformed = [](const TokenLogprobs& lps) -> std::string {
    auto bad = [](float lp) { return std::isnan(lp) || lp > 0; };
    if (lps.top.size() > size_t(kMaxLogprobs) || bad(lps.logprob))
      return " has malformed log-probabilities";
    for (const TopLogprob& l : lps.top)
      if (l.token < 0 || bad(l.logprob)) return " has a malformed top log-probability";
    return {};
  };
  for (const PromptLogprobsEvent& p : ev.prompts)
    for (size_t i = 0; i < p.entries.size(); ++i)
      if (auto why = malformed(p.entries[i]); !why.empty())
        return "request " + std::to_string(p.id) + ": prompt token " + str(int64_t(i + 1)) + why;
  for (const TokenEvent& t : ev.tokens) {
    if (t.index < 0 || t.token < 0)
      return "request " + std::to_string(t.id) + ": token " + str(int64_t(t.token)) + " at index " +
             str(int64_t(t.index));
    if (auto why = malformed(t.logprobs); !why.empty())
      return "request " + std::to_string(t.id) + ": token " + str(int64_t(t.token)) + why;
  }
  for (const DoneEvent& d : ev.done) {
    if (d.reason != FinishReason::Stop && d.reason != FinishReason::Length &&
        d.reason != FinishReason::Cancelled)
      return "request " + std::to_string(d.id) + ": finish reason " +
             str(int64_t(static_cast<int>(d.reason))) + " is unknown";
    if (d.completion_tokens < 0)
      return "request " + std::to_string(d.id) + ": completion_tokens " +
             str(int64_t(d.completion_tokens)) + " is negative";
  }
  return {};
}

std::string fault_order_problem(const FaultOrder& o) {
  const std::string name = "fault " + std::to_string(o.id);
  if (fault_kind_name(o.kind) == "?")
    return name + ": kind " + str(int64_t(static_cast<int>(o.kind))) + " is unknown";
  if (fault_role_name(o.role) == "?")
    return name + ": role " + str(int64_t(static_cast<int>(o.role))) + " is unknown";
  if (o.replica < 0) return name + ": replica " + str(int64_t(o.replica)) + " is negative";
  if (o.device < -1 || o.device >= kMaxWireDevices)
    return name + ": device " + str(int64_t(o.device)) + " is not in [-1, " +
           str(int64_t(kMaxWireDevices - 1)) + "]";
  if (!std::isfinite(o.factor)) return name + ": factor " + str(o.factor) + " is not a number";
  if (o.kind == FaultKind::Slow && !o.end && !(o.factor > 1 && o.factor <= kMaxSlowFactor))
    return name + ": factor " + str(o.factor) + " is not in (1, " + str(kMaxSlowFactor) + "]";
  return {};
}

std::string fault_report_problem(const FaultReport& r) {
  const std::string name = "report on fault " + std::to_string(r.id);
  if (r.outcome != FaultOutcome::Applied && r.outcome != FaultOutcome::Confirmed &&
      r.outcome != FaultOutcome::Refused && r.outcome != FaultOutcome::Withdrawn)
    return name + ": outcome " + str(int64_t(static_cast<int>(r.outcome))) + " is unknown";
  if (r.text.size() > kMaxFaultText)
    return name + ": text of " + str(int64_t(r.text.size())) + " bytes, more than " +
           str(int64_t(kMaxFaultText));
  if (!valid_utf8(r.text)) return name + ": text is not valid UTF-8";
  return {};
}

}  // namespace troupe
