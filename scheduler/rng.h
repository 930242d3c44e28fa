#pragma once
// Seeded pseudo-random numbers that give the same sequence on every platform
// and standard library, so that a policy run in the simulator and in the real
// runtime makes the same choices. std::*_distribution is implementation-defined,
// which is why nothing here uses it.
#include <cstdint>

namespace troupe {

// SplitMix64 (Steele, Lea, Flood 2014). Used to expand one seed into the
// state of a larger generator: it mixes well even from seeds like 0 and 1.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// xoshiro256** 1.0 (Blackman, Vigna 2018): fast, small state, good quality.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    SplitMix64 mix(seed);
    for (uint64_t& word : s_) word = mix.next();
  }

  uint64_t next() {
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

  // Uniform in [0, n) without modulo bias; n must be > 0. Rejection keeps it
  // exact and portable (no 128-bit multiply needed).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform01() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
};

}  // namespace troupe
