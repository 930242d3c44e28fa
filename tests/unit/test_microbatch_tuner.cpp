// The micro-batch tuner on simulated pipelines: stage s runs a micro-batch of
// x tokens in a_s + b_s * x seconds. It must find the brute-force optimum of
// that model within a few steps, hold still under noise, and move when a
// stage slows down.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "scheduler/microbatch_tuner.h"
#include "util/rng.h"

namespace troupe {
namespace {

struct Profile {
  std::vector<double> a;  // per-micro-batch overhead of each stage, seconds
  std::vector<double> b;  // seconds per token of each stage
  int stages() const { return int(a.size()); }
  double time(int s, size_t x) const { return a[size_t(s)] + b[size_t(s)] * double(x); }
};

Profile uniform(int stages, double a, double b) {
  return {std::vector<double>(size_t(stages), a), std::vector<double>(size_t(stages), b)};
}

// Ground truth, written independently of the tuner: micro-batch m enters
// stage s when stage s is free and stage s-1 has finished it.
double true_step_time(const Profile& p, size_t batch, int m) {
  std::vector<double> free_at(size_t(p.stages()), 0);
  for (int k = 0; k < m; ++k) {
    const size_t x = batch / size_t(m) + (size_t(k) < batch % size_t(m) ? 1 : 0);
    double arrive = 0;
    for (int s = 0; s < p.stages(); ++s) {
      const double start = std::max(arrive, free_at[size_t(s)]);
      free_at[size_t(s)] = start + p.time(s, x);
      arrive = free_at[size_t(s)];
    }
  }
  return free_at.back();
}

int brute_force_best(const Profile& p, size_t batch, int max_m) {
  int best = 1;
  for (int m = 2; m <= std::min<int>(max_m, int(batch)); ++m) {
    if (true_step_time(p, batch, m) < true_step_time(p, batch, best)) best = m;
  }
  return best;
}

// One pipeline step: the tuner picks M, the "stages" run it, and report each
// micro-batch's time, optionally with multiplicative noise.
int run_step(MicrobatchTuner& t, const Profile& p, size_t batch, double now_s,
             Xoshiro256* rng = nullptr, double noise = 0) {
  const int m = t.choose(batch, now_s);
  for (size_t x : MicrobatchTuner::split(batch, m)) {
    for (int s = 0; s < p.stages(); ++s) {
      const double jitter = rng ? 1 + noise * (2 * rng->next_double() - 1) : 1;
      t.observe(s, x, p.time(s, x) * jitter);
    }
  }
  return m;
}

struct Case {
  const char* name;
  Profile profile;
  size_t batch;
  int expected;  // the optimum, also checked against brute force
};

TEST(MicrobatchTuner, ConvergesToTheBruteForceOptimumInAFewSteps) {
  const Case cases[] = {
      {"P2 a=1ms b=0.1ms/token B=16", uniform(2, 1e-3, 1e-4), 16, 1},
      {"P2 a=0.2ms b=0.1ms/token B=32", uniform(2, 2e-4, 1e-4), 32, 4},
      {"P4 a=0.1ms b=0.1ms/token B=48", uniform(4, 1e-4, 1e-4), 48, 12},
      {"P3 no overhead B=64", uniform(3, 0, 1e-4), 64, 16},
      {"P1 B=64", uniform(1, 1e-4, 1e-4), 64, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(brute_force_best(c.profile, c.batch, 16), c.expected);
    MicrobatchTuner t(c.profile.stages());
    int steps = 0;
    double now = 0;
    while (t.settled() != c.expected && steps < 50) {
      run_step(t, c.profile, c.batch, now += 0.01);
      ++steps;
    }
    EXPECT_LE(steps, 4);
    // It stays; the occasional probe (to refresh the fit) is one step at
    // another M and does not move the settled choice.
    const int switches = t.switches();
    int probes = 0;
    for (int i = 0; i < 200; ++i) {
      probes += run_step(t, c.profile, c.batch, now += 0.01) != c.expected ? 1 : 0;
      ASSERT_EQ(t.settled(), c.expected) << "step " << i;
    }
    EXPECT_EQ(t.switches(), switches);
    EXPECT_LE(probes, 20);
  }
}

TEST(MicrobatchTuner, PredictsTheBalancedBubble) {
  MicrobatchTuner t(4);
  // Before any fit: the initial choice (P) and the balanced-stage bubble.
  EXPECT_EQ(t.choose(64, 0), 4);
  EXPECT_DOUBLE_EQ(t.predicted_bubble_fraction(), 3.0 / 7.0);
  const Profile p = uniform(4, 0, 1e-4);
  for (int i = 0; i < 10; ++i) run_step(t, p, 64, 0.1 * i);
  EXPECT_EQ(t.choose(64, 1), 16);
  EXPECT_NEAR(t.predicted_bubble_fraction(), 3.0 / 19.0, 1e-9);
  const StepPrediction at4 = t.predict(64, 4);
  EXPECT_NEAR(at4.bubble_fraction, 3.0 / 7.0, 1e-9);
  EXPECT_NEAR(at4.step_time_s, true_step_time(p, 64, 4), 1e-12);
  // An imbalanced pipeline idles more than the balanced formula says.
  MicrobatchTuner skew(2);
  const Profile q{{0, 0}, {1e-4, 3e-4}};
  for (int i = 0; i < 10; ++i) run_step(skew, q, 64, 0.1 * i);
  EXPECT_GT(skew.predict(64, 8).bubble_fraction, 1.0 / 9.0 + 0.1);
  // Small batches cap M at one micro-batch per token; empty ones run once.
  EXPECT_LE(t.choose(3, 2), 3);
  EXPECT_EQ(t.choose(0, 2), 1);
}

TEST(MicrobatchTuner, HysteresisKeepsNoiseFromFlappingTheChoice) {
  // A flat optimum (M = 12..16 within about 1%) measured with +-5% noise.
  const Profile p = uniform(4, 1e-4, 1e-4);
  auto count_switches = [&](double hysteresis, double dwell_s) {
    MicrobatchTunerOptions o;
    o.hysteresis = hysteresis;
    o.min_dwell_s = dwell_s;
    MicrobatchTuner t(4, o);
    Xoshiro256 rng(99);
    for (int i = 0; i < 400; ++i) run_step(t, p, 64, double(i), &rng, 0.05);
    // Whatever it settled on is close to the true optimum.
    const double best = true_step_time(p, 64, brute_force_best(p, 64, 16));
    EXPECT_LE(true_step_time(p, 64, t.settled()), best * 1.06);
    return t.switches();
  };
  const int damped = count_switches(0.05, 0);
  const int undamped = count_switches(0, 0);
  const int dwelling = count_switches(0, 100);
  EXPECT_LE(damped, 2);
  EXPECT_GT(undamped, 5 * damped);
  EXPECT_LE(dwelling, 5);  // at most one switch per 100 s of the 400 s run (plus the first)
}

TEST(MicrobatchTuner, ASlowStageChangesTheChoice) {
  Profile p = uniform(2, 2e-4, 1e-4);
  MicrobatchTuner t(2);
  double now = 0;
  for (int i = 0; i < 20; ++i) run_step(t, p, 32, now += 0.01);
  ASSERT_EQ(t.settled(), 4);
  // Stage 1's device slows down: a large fixed cost per micro-batch (say,
  // another process now contends for it). Fewer micro-batches win now.
  p.a[1] = 5e-3;
  const int expected = brute_force_best(p, 32, 16);
  ASSERT_EQ(expected, 1);
  int steps = 0;
  while (t.settled() != expected && steps < 100) {
    run_step(t, p, 32, now += 0.01);
    ++steps;
  }
  EXPECT_LE(steps, 30);
  for (int i = 0; i < 100; ++i) run_step(t, p, 32, now += 0.01);
  EXPECT_EQ(t.settled(), expected);
  const StageFit f = t.fit(1);
  EXPECT_NEAR(f.overhead_s, 5e-3, 1e-6);
  EXPECT_NEAR(f.per_token_s, 1e-4, 1e-7);
}

TEST(MicrobatchTuner, VaryingBatchesNeedNoProbes) {
  // Continuous batching changes B every step, which separates overhead from
  // per-token cost on its own.
  const Profile p = uniform(2, 5e-4, 1e-4);
  MicrobatchTuner t(2);
  for (int i = 0; i < 30; ++i) run_step(t, p, 16 + size_t(i % 5) * 8, 0.01 * i);
  const StageFit f = t.fit(0);
  EXPECT_TRUE(f.identified);
  EXPECT_NEAR(f.overhead_s, 5e-4, 1e-9);
  EXPECT_NEAR(f.per_token_s, 1e-4, 1e-10);
  for (int m = 1; m <= 16; ++m) {
    EXPECT_NEAR(t.predict(48, m).step_time_s, true_step_time(p, 48, m), 1e-12) << "M=" << m;
  }
  // Within the hysteresis of the optimum.
  const double best = true_step_time(p, 48, brute_force_best(p, 48, 16));
  EXPECT_LE(true_step_time(p, 48, t.choose(48, 1)),
            best / (1 - MicrobatchTunerOptions{}.hysteresis));
}

TEST(MicrobatchTuner, SplitAndValidation) {
  EXPECT_EQ(MicrobatchTuner::split(10, 3), (std::vector<size_t>{4, 3, 3}));
  EXPECT_EQ(MicrobatchTuner::split(2, 4), (std::vector<size_t>{1, 1, 0, 0}));
  EXPECT_THROW(MicrobatchTuner(0), std::invalid_argument);
  MicrobatchTunerOptions o;
  o.max_microbatches = 0;
  EXPECT_THROW(MicrobatchTuner(2, o), std::invalid_argument);
  o = {};
  o.decay = 0;
  EXPECT_THROW(MicrobatchTuner(2, o), std::invalid_argument);
  o = {};
  o.hysteresis = std::nan("");
  EXPECT_THROW(MicrobatchTuner(2, o), std::invalid_argument);
  MicrobatchTuner t(2);
  EXPECT_THROW(t.observe(2, 4, 1e-3), std::invalid_argument);
  EXPECT_THROW(t.observe(0, 4, -1), std::invalid_argument);
  EXPECT_THROW(t.observe(0, 4, INFINITY), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
