#pragma once
// Picks the next token id from a row of logits: greedy, or temperature +
// top-k + top-p (nucleus) sampling driven by a seeded, portable RNG.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu/logit_penalties.h"
#include "service/request.h"
#include "service/step_item.h"
#include "util/rng.h"

namespace troupe {

// Index of the largest value, the lowest index on ties; NaN never wins.
// Throws std::invalid_argument when empty or all NaN.
int argmax(std::span<const float> logits);

// The sampled token's log-probability under `logits` (log-softmax of the raw
// values: the normalizer sums e^(l - max), computed as the sampler weighs ids
// and to about 1e-7, in double in id order, so that the same logits give the
// same figures in any layout and on any machine), and those of the `top`
// likeliest ids (higher logit
// first, then lower id). NaN logits count as -inf. Throws
// std::invalid_argument on empty logits, an id outside them or top outside
// [0, kMaxLogprobs].
TokenLogprobs token_logprobs(std::span<const float> logits, int id, int top);

// The log-probabilities of the prompt tokens an item's rows predict
// (StepItem::prompt_rows_predicting), in position order, each with
// item.sampling.prompt_logprobs alternatives; row(j) is row j's
// full-vocabulary logits.
std::vector<TokenLogprobs> prompt_token_logprobs(
    const StepItem& item, const std::function<std::span<const float>(int)>& row);

class Sampler {
 public:
  // Throws std::invalid_argument naming the parameter: temperature < 0 (or
  // NaN), top_p outside (0, 1], top_k < 0, min_p outside [0, 1].
  explicit Sampler(const SamplingParams& params = {});

  // Greedy (temperature <= 0) is argmax. Otherwise, fully specified so that
  // a seed replays anywhere: draw u = next_double(); weigh each id by
  // exp((logit - max) / temperature); drop those weighing less than min_p
  // (the likeliest weighs 1); keep the top_k best (higher logit, then
  // lower id), then the smallest best-first prefix holding top_p of the kept
  // mass; return the first kept id, in ascending id order, at which the
  // running weight exceeds u * (kept weight).
  //
  // Greedy draws no random number and every other call exactly one, so a
  // sampler rebuilt from params().seed and advanced n draws continues the
  // same sequence (set_rng() restores one directly). NaN logits count as
  // -inf; if some logits are +inf the lowest such id is returned. Throws
  // std::invalid_argument on empty input.
  int sample(std::span<const float> logits);

  // Advances the generator as if `n` tokens had been sampled: a sequence
  // resumed after n tokens continues exactly as if it had not stopped.
  void skip(uint64_t n) {
    if (params_.temperature > 0)
      for (uint64_t i = 0; i < n; ++i) rng_.next();
  }

  // A sampler for a sequence that has already generated `generated` tokens
  // (resumed on another replica, or created at its first sampled step).
  static std::unique_ptr<Sampler> resumed(const SamplingParams& params, uint64_t generated) {
    auto s = std::make_unique<Sampler>(params);
    s->skip(generated);
    return s;
  }

  const SamplingParams& params() const { return params_; }
  const Xoshiro256& rng() const { return rng_; }
  void set_rng(const Xoshiro256& rng) { rng_ = rng; }

 private:
  SamplingParams params_;
  Xoshiro256 rng_;
  // Reused between calls so sampling a 32k vocabulary allocates nothing.
  std::vector<float> weight_;                // per id, unnormalized
  std::vector<std::pair<float, int>> cand_;  // (logit, id), for top-k / top-p
  std::vector<float> masked_;                // logits less those min_p drops
};

// An engine's per-sequence samplers: made at a sequence's first sampled
// step, resumed past the draws its earlier tokens used (so a sequence resumed
// on another replica draws exactly what it would have drawn here), and
// dropped on release; with the penalties of those whose sampling has them.
class SequenceSamplers {
 public:
  // Samples the item's next token from its full-vocabulary logits, adjusted
  // first by its penalties and bias; when its sampling asks for
  // log-probabilities (SamplingParams::logprobs), those of the logits as
  // given go to *logprobs.
  int sample(const StepItem& item, std::span<const float> logits,
             std::optional<TokenLogprobs>* logprobs = nullptr);
  // The model's end-of-sequence ids (min_tokens keeps them from being drawn).
  void set_eos_ids(std::vector<int> ids) { penalties_.set_eos_ids(std::move(ids)); }
  // The model's tokens as text, for sequences with a grammar.
  void set_vocabulary(VocabularySource source) { penalties_.set_vocabulary(std::move(source)); }
  void release(uint64_t seq) {
    samplers_.erase(seq);
    penalties_.release(seq);
  }
  size_t size() const { return samplers_.size(); }

 private:
  std::unordered_map<uint64_t, std::unique_ptr<Sampler>> samplers_;
  SequencePenalties penalties_;
};

}  // namespace troupe
