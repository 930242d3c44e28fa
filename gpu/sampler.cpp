#include "gpu/sampler.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Up to this top_k a heap pass beats the quickselect below.
constexpr size_t kHeapTopK = 1024;

using Cand = std::pair<float, int>;  // (logit, id)

// Strict total order on (logit, id): higher logit first, then lower id. With
// ties broken by id, "the k best" is one well-defined set.
// Bitwise, not short-circuit: partitioning random logits mispredicts any branch
// on this half the time.
bool better(const Cand& a, const Cand& b) {
  return (a.first > b.first) | ((a.first == b.first) & (a.second < b.second));
}

// Largest non-NaN value, -inf when there is none. Eight independent lanes
// give the same result as a plain loop (max does not round) but let the
// compiler vectorize it.
float max_value(std::span<const float> v) {
  constexpr size_t kLanes = 8;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -kInf);
  size_t i = 0;
  for (; i + kLanes <= v.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = v[i + j] > lane[j] ? v[i + j] : lane[j];
  }
  float m = -kInf;
  for (; i < v.size(); ++i) m = v[i] > m ? v[i] : m;
  for (float x : lane) m = x > m ? x : m;
  return m;
}

// Offers c to `heap`, the k best candidates seen so far with the worst at
// the front; false when c is not among them.
bool offer_best(std::vector<Cand>& heap, size_t k, const Cand& c) {
  if (heap.size() < k) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), better);
    return true;
  }
  if (!better(c, heap.front())) return false;
  std::pop_heap(heap.begin(), heap.end(), better);
  heap.back() = c;
  std::push_heap(heap.begin(), heap.end(), better);
  return true;
}

int first_equal(std::span<const float> v, float x) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == x) return int(i);
  }
  return -1;
}

// Weights 2^((l - max) * scale) for l <= max; NaN and -inf give 0, and so do
// exponents under -126. Relative error about 1e-8 before the final rounding.
// Written out, with fma pinning each rounding step, instead of calling
// std::exp: libm's exp differs between C libraries, and the weights decide
// which id a given coin lands on. The AVX2 path (the project's baseline ISA)
// and the scalar one perform the same IEEE operations, so they agree bit for
// bit; the scalar one alone would not vectorize (compares may trap).
constexpr float kLn2 = 0.693147180559945f;
// sqrt(2) / i!, i = 7..0: 2^(k + f) = 2^k * sqrt(2) * e^u, u = (f - 1/2) ln 2
// in [-0.35, 0.35], where a degree-7 Taylor polynomial of e^u is accurate.
constexpr float kPoly[8] = {2.80597929e-4f, 1.96418550e-3f, 1.17851130e-2f, 5.89255651e-2f,
                            2.35702260e-1f, 7.07106781e-1f, 1.41421356f,    1.41421356f};

float exp2_nonpositive(float y) {
  y = y > -127.0f ? y : -127.0f;  // NaN fails the test and becomes -127 too
  const float k = std::floor(y);
  const float u = (y - k - 0.5f) * kLn2;
  float p = kPoly[0];
  for (int i = 1; i < 8; ++i) p = std::fma(p, u, kPoly[i]);
  // Biased exponent k + 127 is in [0, 127]; 0 makes the scale, and the result, +0.
  return p * std::bit_cast<float>(uint32_t(int32_t(k) + 127) << 23);
}

void softmax_weights(std::span<const float> logits, float max, float scale, float* out) {
  size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vmax = _mm256_set1_ps(max), vscale = _mm256_set1_ps(scale);
  const __m256 floor_y = _mm256_set1_ps(-127.0f), half = _mm256_set1_ps(0.5f);
  const __m256 ln2 = _mm256_set1_ps(kLn2);
  const __m256i bias = _mm256_set1_epi32(127);
  for (; i + 8 <= logits.size(); i += 8) {
    __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(&logits[i]), vmax), vscale);
    y = _mm256_max_ps(y, floor_y);  // returns the second operand for NaN
    const __m256 k = _mm256_floor_ps(y);
    const __m256 u = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(y, k), half), ln2);
    __m256 p = _mm256_set1_ps(kPoly[0]);
    for (int j = 1; j < 8; ++j) p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(kPoly[j]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), bias), 23);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }
#endif
  for (; i < logits.size(); ++i) out[i] = exp2_nonpositive((logits[i] - max) * scale);
}

// Reorders c so that c[0, K) are its K best entries (by `better`) for the
// smallest K whose weights sum to at least `need`, and returns K (c.size() if
// they never do). A quickselect that only recurses into the side holding the
// boundary, so expected O(n) where sorting would be O(n log n). It is written
// out rather than built on std::nth_element because the order it leaves
// c[0, K) in is the order sampling walks, and that must not depend on the
// standard library.
template <class Weight>
size_t select_best_prefix(std::vector<Cand>& c, double need, Weight weight) {
  size_t lo = 0, hi = c.size();
  double acc = 0;  // weight of c[0, lo), all kept; below `need` by construction
  // Median-of-3 makes bad pivots unlikely; the budget bounds the worst case.
  int budget = 2 * int(std::bit_width(c.size())) + 8;
  while (hi - lo > 16 && budget-- > 0) {
    const size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (better(c[mid], c[lo])) std::swap(c[mid], c[lo]);
    if (better(c[last], c[lo])) std::swap(c[last], c[lo]);
    if (better(c[mid], c[last])) std::swap(c[mid], c[last]);  // median now at `last`
    const Cand pivot = c[last];
    size_t store = lo;
    double upper = 0;  // weight of the entries better than the pivot
    for (size_t j = lo; j < last; ++j) {
      // Branch-free Lomuto: the swap is harmless when c[j] stays on the right.
      const bool is_better = better(c[j], pivot);
      upper += is_better ? weight(c[j]) : 0.0;
      std::swap(c[store], c[j]);
      store += is_better;
    }
    std::swap(c[store], c[last]);
    if (acc + upper >= need) {
      hi = store;  // boundary among the better ones; pivot and worse are out
    } else if (acc + upper + weight(pivot) >= need) {
      return store + 1;  // the pivot is the boundary
    } else {
      acc += upper + weight(pivot);
      lo = store + 1;
    }
  }
  std::sort(c.begin() + std::ptrdiff_t(lo), c.begin() + std::ptrdiff_t(hi), better);
  for (size_t j = lo; j < hi; ++j) {
    acc += weight(c[j]);
    if (acc >= need) return j + 1;
  }
  return hi;  // rounding: the partition sums said the range reaches `need`
}

}  // namespace

int argmax(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("argmax: empty logits");
  // Two passes (max, then its first position) vectorize; one fused pass
  // tracking the index does not.
  const int i = first_equal(logits, max_value(logits));
  if (i < 0) throw std::invalid_argument("argmax: all logits are NaN");
  return i;
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
  if (!(params.min_p >= 0 && params.min_p <= 1)) {
    throw std::invalid_argument("sampler: min_p must be in [0, 1], got " +
                                std::to_string(params.min_p));
  }
  if (params.logprobs < -1 || params.logprobs > kMaxLogprobs) {
    throw std::invalid_argument("sampler: logprobs must be in [-1, " +
                                std::to_string(kMaxLogprobs) + "] (-1 = off), got " +
                                std::to_string(params.logprobs));
  }
}

int Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("sampler: empty logits");
  if (params_.temperature <= 0) return argmax(logits);

  // Drawn before any early return so that every non-greedy call advances the
  // RNG by exactly one step (what makes a sampler resumable from its seed).
  const double coin = rng_.next_double();

  const float m = max_value(logits);
  // softmax(inf / t) puts all mass on the +inf entries; take the lowest id.
  if (m == kInf) return first_equal(logits, kInf);
  // Everything masked (-inf) or NaN: nothing to weigh, answer as greedy does.
  if (m == -kInf) return argmax(logits);

  // Unnormalized softmax weights 2^((l - max) * log2(e) / t): the best is
  // about 1, so nothing overflows; -inf and NaN logits get weight 0.
  const size_t n = logits.size();
  const float scale = float(1.4426950408889634 / double(params_.temperature));
  // A temperature so small that 1/t overflows float is greedy in all but name.
  if (!std::isfinite(scale)) return argmax(logits);
  weight_.resize(n);
  softmax_weights(logits, m, scale, weight_.data());
  if (params_.min_p > 0) {
    // The likeliest id weighs 1, so an id's weight is its probability over
    // the likeliest's: those below min_p are masked, as -inf logits are.
    masked_.assign(logits.begin(), logits.end());
    for (size_t i = 0; i < n; ++i)
      if (!(weight_[i] >= params_.min_p)) {
        weight_[i] = 0;
        masked_[i] = -kInf;
      }
    logits = masked_;
  }

  const size_t k = size_t(params_.top_k);
  const bool use_k = k > 0 && k < n;
  const bool use_p = params_.top_p < 1;
  // Summed in 8 interleaved lanes: a fixed order (so a fixed result) that
  // the compiler can still vectorize.
  auto total_weight = [this, n] {
    double lane[8] = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (size_t j = 0; j < 8; ++j) lane[j] += weight_[i + j];
    }
    double total = 0;
    for (; i < n; ++i) total += weight_[i];
    for (double x : lane) total += x;
    return total;
  };

  if (!use_k && !use_p) {
    const double r = coin * total_weight();
    double acc = 0;
    int last = 0;
    for (size_t i = 0; i < n; ++i) {
      if (weight_[i] == 0) continue;
      acc += weight_[i];
      last = int(i);
      if (r < acc) return last;
    }
    return last;  // rounding left r a hair above the final sum
  }

  auto weight_of = [this](const Cand& c) { return double(weight_[size_t(c.second)]); };
  size_t kept = 0;
  if (use_k && k <= kHeapTopK) {
    // Small k (the usual 20..100): one pass with a heap of the k best, whose
    // worst is at the front; nearly every entry fails the one test against
    // it. Sorted afterwards, because heap order differs between standard
    // libraries and the walk below must not.
    cand_.clear();
    float worst_kept = -kInf;  // once the heap is full
    for (size_t i = 0; i < n; ++i) {
      const float v = logits[i];
      if (!(v >= worst_kept) || v == -kInf) continue;  // too low, masked or NaN
      if (!offer_best(cand_, k, Cand(v, int(i)))) continue;
      if (cand_.size() == k) worst_kept = cand_.front().first;
    }
    std::sort(cand_.begin(), cand_.end(), better);
    kept = cand_.size();
    if (use_p) {
      double top_k_mass = 0;
      for (const auto& c : cand_) top_k_mass += weight_of(c);
      const double need = double(params_.top_p) * top_k_mass;
      double acc = 0;
      for (kept = 0; kept < cand_.size() && acc < need;) acc += weight_of(cand_[kept++]);
    }
  } else {
    // Candidates: entries within 8, then 24 binary orders of magnitude of
    // the best, the first band that provably holds the kept set (k entries
    // for top-k; p of the mass for top-p alone), else every finite logit.
    // Real distributions are peaked, so the selection below mostly sees tens
    // or hundreds of entries, not the vocabulary. The band is a logit
    // threshold, so the kept set is the same as without it.
    const double need_all = use_p && !use_k ? double(params_.top_p) * total_weight() : 0.0;
    for (const float band : {8.0f, 24.0f, kInf}) {
      const float threshold = band == kInf ? -kInf : m - band / scale;
      cand_.clear();
      double mass = 0;
      for (size_t i = 0; i < n; ++i) {
        const float v = logits[i];
        if (v >= threshold && v != -kInf) {  // NaN fails the first test
          cand_.emplace_back(v, int(i));
          mass += weight_[i];
        }
      }
      if (use_k ? cand_.size() >= k : mass >= need_all) break;
    }
    if (use_k && k < cand_.size()) {
      select_best_prefix(cand_, double(k), [](const Cand&) { return 1.0; });
      cand_.resize(k);
    }
    kept = cand_.size();
    if (use_p) {
      double need = need_all;
      if (use_k) {  // top-p applies to the top k's mass
        double top_k_mass = 0;
        for (const auto& c : cand_) top_k_mass += weight_of(c);
        need = double(params_.top_p) * top_k_mass;
      }
      kept = select_best_prefix(cand_, need, weight_of);
    }
  }

  // The coin walks the kept set in ascending id order, whatever order the
  // selection above left it in: one definition for every path, so top_k 1024
  // (heap) and 1025 (quickselect) differ only in what they keep.
  if (kept * 16 <= n) {
    std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(kept),
              [](const Cand& a, const Cand& b) { return a.second < b.second; });
    double kept_mass = 0;
    for (size_t i = 0; i < kept; ++i) kept_mass += weight_of(cand_[i]);
    const double r = coin * kept_mass;
    double acc = 0;
    int last = cand_[0].second;
    for (size_t i = 0; i < kept; ++i) {
      if (weight_of(cand_[i]) == 0) continue;
      acc += weight_of(cand_[i]);
      last = cand_[i].second;
      if (r < acc) return last;
    }
    return last;  // rounding left r a hair above the final sum
  }
  // Many kept: scan the ids instead of sorting them, keeping those that are
  // not worse than the worst kept entry (same set, same order, same sums).
  const Cand worst = *std::max_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(kept), better);
  auto is_kept = [&](size_t i) {
    const float v = logits[i];
    return v == v && !better(worst, Cand(v, int(i)));  // NaN would pass the second test
  };
  double kept_mass = 0;
  for (size_t i = 0; i < n; ++i) {
    if (is_kept(i)) kept_mass += weight_[i];
  }
  const double r = coin * kept_mass;
  double acc = 0;
  int last = worst.second;
  for (size_t i = 0; i < n; ++i) {
    if (weight_[i] == 0 || !is_kept(i)) continue;
    acc += weight_[i];
    last = int(i);
    if (r < acc) return last;
  }
  return last;  // rounding left r a hair above the final sum
}

int SequenceSamplers::sample(const StepItem& item, std::span<const float> logits,
                             std::optional<TokenLogprobs>* logprobs) {
  auto& s = samplers_[item.seq];
  if (!s) s = Sampler::resumed(item.sampling, uint64_t(item.generated));
  const int id = s->sample(penalties_.adjust(item, logits));
  penalties_.record(item.seq, id);
  if (logprobs && item.sampling.logprobs >= 0)
    *logprobs = token_logprobs(logits, id, item.sampling.logprobs);
  return id;
}

std::vector<TokenLogprobs> prompt_token_logprobs(
    const StepItem& item, const std::function<std::span<const float>(int)>& row) {
  std::vector<TokenLogprobs> out;
  const int n = item.prompt_rows_predicting();
  out.reserve(size_t(n));
  for (int j = 0; j < n; ++j)
    out.push_back(token_logprobs(row(j), item.history[size_t(item.position + j + 1)],
                                 item.sampling.prompt_logprobs));
  return out;
}

TokenLogprobs token_logprobs(std::span<const float> logits, int id, int top) {
  if (logits.empty()) throw std::invalid_argument("token_logprobs: no logits");
  if (id < 0 || size_t(id) >= logits.size())
    throw std::invalid_argument("token_logprobs: id " + std::to_string(id) + " is outside " +
                                std::to_string(logits.size()) + " logits");
  if (top < 0 || top > kMaxLogprobs)
    throw std::invalid_argument("token_logprobs: top " + std::to_string(top) + " is outside [0, " +
                                std::to_string(kMaxLogprobs) + "]");
  const float mx = max_value(logits);
  auto value = [](float l) { return std::isnan(l) ? -kInf : l; };
  // All -inf (or NaN): every id equally unlikely; report log(1/n).
  const bool flat = mx == -kInf;
  double sum = 0;
  if (!flat && std::isfinite(mx)) {
    // e^(l - max) as the sampler weighs ids at temperature 1 (vectorized,
    // the same on every machine), summed in id order.
    static thread_local std::vector<float> weight;
    weight.resize(logits.size());
    softmax_weights(logits, mx, 1.0f / kLn2, weight.data());
    for (float w : weight) sum += double(w);
  }
  const double log_z = flat ? std::log(double(logits.size())) : std::log(sum);
  auto logprob = [&](int i) {
    if (flat) return float(-log_z);
    if (std::isinf(mx) && mx > 0)  // +inf logits share all the mass
      return logits[size_t(i)] == mx
                 ? float(-std::log(double(std::count(logits.begin(), logits.end(), mx))))
                 : -kInf;
    return float(double(value(logits[size_t(i)])) - double(mx) - log_z);
  };
  TokenLogprobs out;
  out.logprob = logprob(id);
  if (top == 0) return out;
  // The `top` best by better(), as sampling's top-k picks them.
  std::vector<Cand> best;
  best.reserve(size_t(top));
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = value(logits[i]);
    // Nearly every entry fails this one test once the heap is full.
    if (best.size() == size_t(top) && v < best.front().first) continue;
    offer_best(best, size_t(top), Cand(v, int(i)));
  }
  std::sort(best.begin(), best.end(), better);
  out.top.reserve(best.size());
  for (const Cand& c : best) out.top.push_back({c.second, logprob(c.second)});
  return out;
}

}  // namespace troupe
