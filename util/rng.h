#pragma once
// Seeded pseudo-random numbers that give the same sequence on every platform
// and standard library, so that sampling replays from a seed anywhere and a
// policy makes the same choices in the simulator and in the runtime.
// std::*_distribution is implementation-defined, which is why nothing here
// uses it. Shared by gpu/ (sampler) and scheduler/ (policies).
#include <array>
#include <cstdint>

namespace troupe {

// SplitMix64 (Steele, Lea, Flood 2014): one step from `state`. Used to
// expand one seed into a larger generator's state; mixes well even from 0.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_); }

 private:
  uint64_t state_;
};

// xoshiro256** 1.0 (Blackman, Vigna 2018): fast, small state, good quality.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    uint64_t sm = seed;  // never all zeros after splitmix64
    for (auto& word : s_) word = splitmix64(sm);
  }
  // A saved state(); all zeros is the one state that never leaves itself.
  explicit Xoshiro256(const std::array<uint64_t, 4>& state) : s_(state) {}

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

  // Uniform in [0, 1) with 53 random bits.
  double next_double() { return double(next() >> 11) * 0x1.0p-53; }
  double uniform01() { return next_double(); }

  // Uniform in [0, n) without modulo bias; n must be > 0. Rejection keeps it
  // exact and portable (no 128-bit multiply needed).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

  const std::array<uint64_t, 4>& state() const { return s_; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  std::array<uint64_t, 4> s_;
};

}  // namespace troupe
