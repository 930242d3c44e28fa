#include "gpu/comm/communicator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

namespace troupe {

bool argmax_better(const ArgMax& a, const ArgMax& b) {
  const bool a_ok = a.index >= 0 && !std::isnan(a.value);
  const bool b_ok = b.index >= 0 && !std::isnan(b.value);
  if (a_ok != b_ok) return a_ok;
  if (!a_ok) return false;
  if (a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

ArgMax Communicator::all_argmax(float value, int index) {
  // The index travels as the bits of a float: a copy keeps any bit pattern,
  // and a float could not hold every int exactly.
  static_assert(sizeof(int) == sizeof(float));
  float mine[2];
  mine[0] = value;
  std::memcpy(&mine[1], &index, sizeof index);
  std::vector<float> all(2 * size_t(size()));
  all_gather(mine, 2, all.data());
  ArgMax best;
  best.value = std::nanf("");
  for (int r = 0; r < size(); ++r) {
    ArgMax c;
    c.value = all[2 * size_t(r)];
    std::memcpy(&c.index, &all[2 * size_t(r) + 1], sizeof c.index);
    if (argmax_better(c, best)) best = c;
  }
  return best;
}

CommStats Communicator::stats() const {
  CommStats s;
  s.calls = calls_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.seconds = double(nanos_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

void Communicator::reset_stats() {
  calls_.store(0, std::memory_order_relaxed);
  bytes_.store(0, std::memory_order_relaxed);
  nanos_.store(0, std::memory_order_relaxed);
}

void Communicator::record(uint64_t bytes, std::chrono::nanoseconds elapsed) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  nanos_.fetch_add(uint64_t(std::max<int64_t>(0, elapsed.count())), std::memory_order_relaxed);
}

std::vector<std::unique_ptr<Communicator>> join_at_once(
    const std::vector<int>& ranks, const std::function<std::unique_ptr<Communicator>(int)>& make) {
  std::vector<std::unique_ptr<Communicator>> out(ranks.size());
  if (ranks.size() == 1) {
    out[0] = make(ranks[0]);
    return out;
  }
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        out[i] = make(ranks[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

void Communicator::sum_in_piece_order(float* data, const float* pieces, int count, size_t n) {
  const int me = rank(), p = size();
  if (p == 1) return;
  if (me > 0) {
    recv(data, n, me - 1);
    for (int c = 0; c < count; ++c) {
      const float* piece = pieces + size_t(c) * n;
      for (size_t i = 0; i < n; ++i) data[i] += piece[i];
    }
  }
  if (me + 1 < p) send(data, n, me + 1);
  broadcast(data, n, p - 1);
}

}  // namespace troupe
