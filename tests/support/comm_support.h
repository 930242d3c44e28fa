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

}  // namespace troupe::test::comm
