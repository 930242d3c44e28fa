#include "gpu/cpu/thread_choice.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {
// A way is tried this many times before the other is preferred over it.
constexpr int kFirstTries = 3;
// The pool is taken only when it is this much faster: its time does not
// show what its spinning workers take from the process's other threads.
constexpr double kPoolMargin = 1.2;
// A step this long (on the pool) is not tried on one thread.
constexpr double kLongStepS = 0.004;
}  // namespace

ThreadChoice::ThreadChoice(int retry_every) : retry_every_(retry_every) {
  if (retry_every < 2)
    throw std::invalid_argument("a thread choice retries every 2 steps or more, got " +
                                std::to_string(retry_every));
}

size_t ThreadChoice::size_of(int tokens) {
  // 1, 2, 3-4, 5-8, ...
  return tokens <= 1 ? 0 : size_t(std::bit_width(unsigned(tokens - 1)));
}

ThreadChoice::Size& ThreadChoice::at(int tokens) {
  const size_t i = size_of(tokens);
  if (i >= sizes_.size()) sizes_.resize(i + 1);
  return sizes_[i];
}

double ThreadChoice::Times::median() const {
  const int n = int(std::min<uint64_t>(count, kSamples));
  if (n == 0) return 0;
  std::array<double, kSamples> v = per_token;
  std::nth_element(v.begin(), v.begin() + n / 2, v.begin() + n);
  return v[size_t(n / 2)];
}

ThreadChoice::Way ThreadChoice::choose(int tokens) {
  Size& s = at(tokens);
  const Times& pool = s.way[size_t(Way::Pool)];
  const Times& serial = s.way[size_t(Way::Serial)];
  // The pool first; and only the pool for long steps: its fixed costs are
  // lost in them, while one step on one thread would cost the most.
  if (pool.count == 0 || pool.median() * tokens >= kLongStepS) return Way::Pool;
  if (pool.count < kFirstTries || serial.count < kFirstTries)
    return pool.count <= serial.count ? Way::Pool : Way::Serial;
  const double p = pool.median() * kPoolMargin, q = serial.median();
  const Way best = p < q ? Way::Pool : Way::Serial;
  // The slower way is tried again, less often the slower it is, so that a
  // try costs about the same share of the time whatever the gap.
  const double ratio = std::min(100.0, std::max(p, q) / std::max(1e-12, std::min(p, q)));
  if (++s.since_retry >= uint64_t(double(retry_every_) * ratio * ratio)) {
    s.since_retry = 0;
    return best == Way::Pool ? Way::Serial : Way::Pool;
  }
  return best;
}

void ThreadChoice::observe(int tokens, Way way, double seconds) {
  if (tokens < 1 || !(seconds >= 0)) return;
  Times& t = at(tokens).way[size_t(way)];
  t.per_token[size_t(t.count % kSamples)] = seconds / tokens;
  ++t.count;
}

double ThreadChoice::median_per_token(int tokens, Way way) const {
  const size_t i = size_of(tokens);
  return i < sizes_.size() ? sizes_[i].way[size_t(way)].median() : 0;
}

}  // namespace troupe
