#pragma once
// What the communicator tests share: errors gathered per rank, data whose
// sum shows the order of summation, and bit-for-bit comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "gpu/comm/communicator.h"
#include "util/rng.h"

namespace troupe::test::comm {

inline void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

// The message of a CommError, or "" (and a failure) for anything else.
inline std::string comm_error_message(const std::exception_ptr& e) {
  if (!e) {
    ADD_FAILURE() << "expected CommError, nothing thrown";
    return "";
  }
  try {
    std::rethrow_exception(e);
  } catch (const CommError& err) {
    return err.what();
  } catch (const std::exception& other) {
    ADD_FAILURE() << "expected CommError, got: " << other.what();
  }
  return "";
}

// Values of very different magnitudes, so that the order of summation shows
// in the low bits.
inline std::vector<float> rank_data(int rank, size_t n, uint64_t seed) {
  Xoshiro256 rng(seed * 131 + uint64_t(rank));
  std::vector<float> v(n);
  for (auto& x : v) {
    const double mag = std::pow(10.0, double(rng.below(9)) - 4);
    x = float((rng.next_double() - 0.5) * mag);
  }
  return v;
}

inline std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& in) {
  std::vector<float> out = in[0];
  for (size_t r = 1; r < in.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += in[r][i];
  }
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// One round of the mixed-collectives stress tests, the same on every rank:
// all-reduce of n values, all-gather, reduce-scatter and a broadcast from
// rank it % P, each checked; the number of wrong results.
struct MixedBuffers {
  MixedBuffers(int p, size_t max_n) : a(max_n), g(size_t(3 * p)), rs(3), rs_in(size_t(3 * p)) {}
  std::vector<float> a, g, rs, rs_in;
};

inline int mixed_collectives_round(Communicator& c, int it, size_t n, MixedBuffers& b) {
  const int r = c.rank(), p = c.size();
  int wrong = 0;
  for (size_t i = 0; i < n; ++i) b.a[i] = float(r + 1);
  c.all_reduce_sum(b.a.data(), n);
  if (b.a[n - 1] != float(p * (p + 1) / 2)) ++wrong;
  const float mine[3] = {float(r), float(it), float(-r)};
  c.all_gather(mine, 3, b.g.data());
  if (b.g[size_t(3 * (p - 1))] != float(p - 1) || b.g[1] != float(it)) ++wrong;
  for (size_t i = 0; i < b.rs_in.size(); ++i) b.rs_in[i] = float(i);
  c.reduce_scatter_sum(b.rs_in.data(), 3, b.rs.data());
  if (b.rs[0] != float(3 * r * p)) ++wrong;
  float v = float(r == it % p ? it : -1);
  c.broadcast(&v, 1, it % p);
  if (v != float(it)) ++wrong;
  return wrong;
}

// Every 7th round with more than one rank: each rank sends to the next and
// receives from the previous, even ranks sending first. 1 when wrong.
inline int ring_exchange_round(Communicator& c, int it) {
  const int r = c.rank(), p = c.size();
  if (p < 2 || it % 7 != 0) return 0;
  float out = float(r), in = -1;
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  if (r % 2 == 0) {
    c.send(&out, 1, next);
    c.recv(&in, 1, prev);
  } else {
    c.recv(&in, 1, prev);
    c.send(&out, 1, next);
  }
  return in != float(prev) ? 1 : 0;
}

}  // namespace troupe::test::comm
