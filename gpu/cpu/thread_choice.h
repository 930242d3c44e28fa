#pragma once
// Whether a CPU engine's step runs on its thread pool or on the calling
// thread alone, chosen by measuring both.
//
// A pool pays for every parallel loop: waking its workers, and waiting for a
// task a worker has claimed when that worker's core was taken by another
// thread. A large model's loops earn that back many times (a 110M model
// decodes 2x faster on two threads), a small model's do not: inside a
// server, whose HTTP, actor and client threads share the cores, models of
// 2.4M and 260K parameters served 1.3-2x more tokens on one thread. Where
// the line falls depends on the model, the machine and the load, so it is
// not guessed: for each step size (tokens, in powers of two) the choice
// keeps each way's recent times per token (a median of the last few), tries
// each a few times, then takes the faster (the pool only when it is 1.2x
// faster: its own time does not show what its spinning workers take from
// the process's other threads), and tries the other again every
// `retry_every` steps of that size times the square of their ratio, since
// the load changes. Steps of 4 ms or more on the pool stay on it. Both ways
// give the same floats (work is split by output rows), so the choice
// changes only the speed.
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe {

class ThreadChoice {
 public:
  enum class Way { Pool = 0, Serial = 1 };

  // Throws std::invalid_argument for retry_every < 2.
  explicit ThreadChoice(int retry_every = 100);

  Way choose(int tokens);
  // How long a step of `tokens` took the way it ran.
  void observe(int tokens, Way way, double seconds);

  // A size's recent median seconds per token that way (0: none yet).
  double median_per_token(int tokens, Way way) const;

  static constexpr int kSamples = 7;  // recent times kept per way: a median of 7

 private:
  struct Times {
    std::array<double, kSamples> per_token{};
    uint64_t count = 0;  // samples so far (the ring holds the last kSamples)
    double median() const;
  };
  struct Size {
    std::array<Times, 2> way;
    uint64_t since_retry = 0;
  };
  static size_t size_of(int tokens);
  Size& at(int tokens);

  int retry_every_;
  std::vector<Size> sizes_;
};

}  // namespace troupe
