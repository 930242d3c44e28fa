#include "gpu/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Strict total order on (logit, id): higher logit first, then lower id. With
// ties broken by id, the kept set and its order do not depend on how the
// standard library implements nth_element / partial_sort.
bool better(const std::pair<float, int>& a, const std::pair<float, int>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Xoshiro256::Xoshiro256(uint64_t seed) {
  // splitmix64 spreads any seed (0 included) over the state, which must not
  // be all zeros.
  uint64_t sm = seed;
  for (auto& word : s_) word = splitmix64(sm);
}

uint64_t Xoshiro256::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

int argmax(std::span<const float> logits) {
  int best = -1;
  float best_value = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > best_value) {
      best = int(i);
      best_value = v;
    }
  }
  if (best < 0) {
    throw std::invalid_argument(logits.empty() ? "argmax: empty logits"
                                               : "argmax: all logits are NaN");
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  // Written so that NaN fails each check.
  if (!(params.temperature >= 0)) {
    throw std::invalid_argument("sampler: temperature must be >= 0, got " +
                                std::to_string(params.temperature));
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {
    throw std::invalid_argument("sampler: top_p must be in (0, 1], got " +
                                std::to_string(params.top_p));
  }
  if (params.top_k < 0) {
    throw std::invalid_argument("sampler: top_k must be >= 0 (0 = off), got " +
                                std::to_string(params.top_k));
  }
}

int Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("sampler: empty logits");
  if (params_.temperature <= 0) return argmax(logits);

  // Drawn before any early return so that every non-greedy call advances the
  // RNG by exactly one step (what makes a sampler resumable from its seed).
  const double coin = rng_.next_double();

  // Candidates: the finite logits; -inf is a masked token, NaN is treated so.
  cand_.clear();
  float max_logit = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == -std::numeric_limits<float>::infinity()) continue;
    // softmax(inf / t) is all mass on the +inf entries; take the lowest id.
    if (v == std::numeric_limits<float>::infinity()) return int(i);
    cand_.emplace_back(v, int(i));
    max_logit = std::max(max_logit, v);
  }
  if (cand_.empty()) return argmax(logits);  // all masked: as greedy would

  // Top-k, then sorted best-first: the order the nucleus needs, and a
  // machine-independent order for the walk below.
  bool sorted = false;
  const size_t k = size_t(params_.top_k);
  if (k > 0 && k < cand_.size()) {
    std::nth_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(k), cand_.end(), better);
    cand_.resize(k);
    std::sort(cand_.begin(), cand_.end(), better);
    sorted = true;
  }

  // exp((l - max) / t) in double: the largest weight is exactly 1, so there is
  // no overflow, and the sums below lose nothing that matters at 32k entries.
  const double inv_t = 1.0 / double(params_.temperature);
  const double m = max_logit;
  weight_.resize(cand_.size());
  double total = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    weight_[i] = std::exp((double(cand_[i].first) - m) * inv_t);
    total += weight_[i];
  }

  size_t kept = cand_.size();
  double kept_mass = total;
  if (params_.top_p < 1) {
    // Smallest best-first prefix whose mass reaches top_p. Sort only as far as
    // needed, in growing chunks: peaked distributions stop after a few dozen
    // entries instead of sorting the whole vocabulary.
    const double target = double(params_.top_p) * total;
    size_t ready = sorted ? cand_.size() : 0;
    double acc = 0;
    size_t i = 0;
    while (i < cand_.size()) {
      if (i == ready) {
        const size_t next = std::min(cand_.size(), std::max<size_t>(2 * ready, 64));
        std::partial_sort(cand_.begin() + std::ptrdiff_t(ready),
                          cand_.begin() + std::ptrdiff_t(next), cand_.end(), better);
        ready = next;
      }
      // Weights were computed before sorting; recompute for the sorted prefix.
      weight_[i] = std::exp((double(cand_[i].first) - m) * inv_t);
      acc += weight_[i];
      ++i;
      if (acc >= target) break;
    }
    kept = i;
    kept_mass = acc;
  }

  const double r = coin * kept_mass;
  double acc = 0;
  for (size_t i = 0; i < kept; ++i) {
    acc += weight_[i];
    if (r < acc) return cand_[i].second;
  }
  // Rounding can leave r a hair above the last partial sum; the last kept
  // entry with any weight is the one the coin landed on.
  for (size_t i = kept; i-- > 0;) {
    if (weight_[i] > 0) return cand_[i].second;
  }
  return cand_[0].second;
}

}  // namespace troupe
