#include "gpu/logit_penalties.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace troupe {

LogitPenalties::LogitPenalties(const SamplingParams& params, std::span<const int> eos_ids,
                               int generated)
    : params_(params), generated_(generated) {
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
  if (p.min_tokens > 0) {
    ends_.assign(eos_ids.begin(), eos_ids.end());
    ends_.insert(ends_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
}

void LogitPenalties::reset(std::span<const int> tokens, int generated) {
  if (generated < 0 || size_t(generated) > tokens.size())
    throw std::invalid_argument("penalties: " + std::to_string(generated) +
                                " generated tokens in a history of " +
                                std::to_string(tokens.size()));
  generated_ = generated;
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
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
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
}

std::span<const float> SequencePenalties::adjust(const StepItem& item,
                                                 std::span<const float> logits) {
  if (!item.sampling.adjusts_logits()) return logits;
  auto it = seqs_.find(item.seq);
  if (it == seqs_.end())
    it = seqs_.emplace(item.seq, LogitPenalties(item.sampling, eos_ids_, item.generated)).first;
  if (!item.history.empty()) it->second.reset(item.history, item.generated);
  it->second.apply(logits, row_);
  return row_;
}

void SequencePenalties::record(uint64_t seq, int id) {
  const auto it = seqs_.find(seq);
  if (it != seqs_.end()) it->second.record(id);
}

}  // namespace troupe
