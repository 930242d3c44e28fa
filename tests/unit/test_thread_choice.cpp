// The CPU engine's choice between its thread pool and one thread, driven
// here by made-up step times.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "gpu/cpu/thread_choice.h"

namespace troupe {
namespace {

using Way = ThreadChoice::Way;

// Runs `steps` steps of `tokens`, each taking per_token[way] * tokens;
// returns how many ran on one thread.
int run(ThreadChoice& c, int tokens, int steps, double pool_per_token, double serial_per_token) {
  int serial = 0;
  for (int i = 0; i < steps; ++i) {
    const Way w = c.choose(tokens);
    serial += w == Way::Serial;
    c.observe(tokens, w, (w == Way::Pool ? pool_per_token : serial_per_token) * tokens);
  }
  return serial;
}

TEST(ThreadChoice, TriesBothThenKeepsToTheFasterAndRetriesTheOtherRarely) {
  ThreadChoice c(100);
  EXPECT_EQ(c.choose(1), Way::Pool);  // the pool first
  c.observe(1, Way::Pool, 200e-6);
  // One thread twice as fast: after a few tries of each, one thread, and
  // the pool again every 100 x 2^2 steps.
  const int serial = run(c, 1, 2000, 200e-6, 100e-6);
  EXPECT_GE(serial, 2000 - 3 - 5);
  EXPECT_LT(serial, 2000);
  EXPECT_NEAR(c.median_per_token(1, Way::Serial), 100e-6, 1e-12);
}

TEST(ThreadChoice, ThePoolMustBeClearlyFaster) {
  ThreadChoice c(100);
  // 10% faster on the pool: not enough to pay for what it takes elsewhere.
  EXPECT_GT(run(c, 8, 500, 90e-6, 100e-6), 450);
  ThreadChoice d(100);
  // Twice as fast: the pool, with one-thread tries now and then.
  const int serial = run(d, 8, 2000, 50e-6, 100e-6);
  EXPECT_GE(serial, 3);
  EXPECT_LE(serial, 3 + 8);  // every 100 x (1 / 0.6)^2 steps
}

TEST(ThreadChoice, LongStepsStayOnThePool) {
  ThreadChoice c(100);
  // 8 ms steps on the pool: one thread is never tried, however it might do.
  EXPECT_EQ(run(c, 1, 1000, 8e-3, 1e-6), 0);
  // The same model's short steps are measured on their own.
  EXPECT_GT(run(c, 64, 10, 1e-6, 0.5e-6), 0);
}

TEST(ThreadChoice, FollowsAChangeInLoad) {
  ThreadChoice c(10);
  EXPECT_GT(run(c, 4, 200, 100e-6, 50e-6), 150);
  // One thread becomes slow (the cores are now free for the pool): the
  // pool's retries see it, and within a few retries the choice turns.
  run(c, 4, 2000, 20e-6, 50e-6);
  EXPECT_LT(run(c, 4, 200, 20e-6, 50e-6), 10);
}

TEST(ThreadChoice, SizesAreMeasuredApart) {
  ThreadChoice c(100);
  run(c, 1, 200, 200e-6, 100e-6);   // decode: one thread
  run(c, 512, 200, 10e-6, 100e-6);  // prefill chunks: the pool
  EXPECT_EQ(c.choose(1), Way::Serial);
  EXPECT_EQ(c.choose(3), Way::Pool);  // 3-4 tokens: not measured yet
  EXPECT_EQ(c.choose(500), Way::Pool);
  EXPECT_EQ(c.median_per_token(2, Way::Pool), 0.0);  // 2 is a size of its own
}

TEST(ThreadChoice, BadInputIsRefusedOrIgnored) {
  EXPECT_THROW(ThreadChoice bad(1), std::invalid_argument);
  ThreadChoice c;
  c.observe(0, Way::Pool, 1.0);   // no tokens: ignored
  c.observe(1, Way::Pool, -1.0);  // a clock gone backwards: ignored
  c.observe(1, Way::Serial, std::nan(""));
  EXPECT_EQ(c.median_per_token(1, Way::Pool), 0.0);
  EXPECT_EQ(c.median_per_token(1, Way::Serial), 0.0);
  EXPECT_EQ(c.choose(1), Way::Pool);
}

}  // namespace
}  // namespace troupe
