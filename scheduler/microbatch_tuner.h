#pragma once
// Micro-batch tuning for a P-stage pipeline: how many micro-batches M to cut
// a batching step into. More micro-batches shrink the pipeline bubble (stages
// idle while the pipeline fills and drains), but every micro-batch pays a
// fixed cost on every stage (kernel launches, weight reads, messages), so M
// has an optimum that depends on the measured stage times.
//
// Model: stage s runs a micro-batch of x tokens in a_s + b_s * x seconds,
// fitted per stage online from observations (weighted least squares with
// exponential forgetting, so a stage that slows down is noticed). A step of B
// tokens in M micro-batches (sizes differing by at most one) takes the
// makespan of the micro-batches flowing through the stages in order, which is
// (M + P - 1) * t for balanced stages with t per micro-batch, and accounts
// for imbalance otherwise. The bubble fraction is the share of stage-time
// idle during the step: (P - 1) / (M + P - 1) when balanced.
//
// Plain and deterministic: no clocks (now_s is passed in), no threads.
#include <cstddef>
#include <vector>

namespace troupe {

struct MicrobatchTunerOptions {
  int max_microbatches = 16;
  // The choice before any fit: 0 means min(P, max_microbatches).
  int initial_microbatches = 0;
  // Weight an older sample keeps each time its stage gets a new one; 0.9
  // remembers about the last 10 micro-batches.
  double decay = 0.9;
  // Switch only to a choice predicted at least this much faster (relative),
  // and not sooner than min_dwell_s after the last switch: noise in the
  // measurements must not make the choice flap.
  double hysteresis = 0.05;
  double min_dwell_s = 0;
  // Samples a stage needs before its fit is used.
  int min_samples = 2;
  // a and b cannot be told apart from samples that all have about the same
  // size (a fixed batch at a fixed M). Below this spread (std / mean of the
  // weighted sizes) a stage's fit is "anchored": the last separable fit,
  // scaled to the current mean time. The tuner probes, running one step at
  // another M to get samples of another size, when a stage never had a
  // separable fit, when an anchored stage's mean time has drifted by more
  // than probe_on_drift from what its anchor predicts (the stage changed),
  // and otherwise every probe_interval_steps steps.
  double min_relative_spread = 0.2;
  double probe_on_drift = 0.1;
  int probe_interval_steps = 50;
};

// One stage's fitted cost of a micro-batch of x tokens: overhead_s + per_token_s * x.
struct StageFit {
  double overhead_s = 0;
  double per_token_s = 0;
  int samples = 0;          // observations so far (not decayed)
  bool identified = false;  // recent samples of different sizes separate the two terms
  bool anchored = false;    // not identified: an earlier identified fit, rescaled
  double drift = 0;         // anchored: |current mean time / anchor's prediction - 1|
};

struct StepPrediction {
  int microbatches = 1;
  double step_time_s = 0;
  double bubble_fraction = 0;
};

class MicrobatchTuner {
 public:
  // Throws std::invalid_argument naming a bad stage count or option.
  explicit MicrobatchTuner(int stages, MicrobatchTunerOptions options = {});

  // Stage `stage` ran a micro-batch of `tokens` tokens in `seconds` (its own
  // compute, not time spent waiting for its input).
  void observe(int stage, size_t tokens, double seconds);

  // M for a step of `batch_tokens` tokens, in [1, min(max_microbatches,
  // batch_tokens)] (1 for an empty batch). Before every stage has samples it
  // keeps the initial choice; when a probe is due (see the options) it
  // returns twice or half the settled choice for that one step, without
  // settling on it; otherwise the predicted fastest M, ties to the smaller,
  // subject to the hysteresis (except the first informed choice, which
  // replaces the unmeasured initial guess outright).
  int choose(size_t batch_tokens, double now_s);

  // The model's step time and bubble for an explicit M (uses the current fits
  // whatever their state; stages without samples cost nothing).
  StepPrediction predict(size_t batch_tokens, int microbatches) const;

  // The bubble predicted for the last choose() (its batch and its answer);
  // before every stage has a fit, the balanced-stage (P - 1) / (M + P - 1).
  double predicted_bubble_fraction() const { return last_bubble_; }

  StageFit fit(int stage) const;
  bool ready() const;  // every stage has min_samples samples
  int settled() const { return settled_; }
  int stages() const { return int(stages_.size()); }
  int switches() const { return switches_; }

  // The micro-batch sizes of `batch_tokens` in m parts: the larger first.
  static std::vector<size_t> split(size_t batch_tokens, int m);

 private:
  // Exponentially weighted sums for least squares of seconds against tokens,
  // and the stage's last identified fit.
  struct Sums {
    double w = 0, x = 0, y = 0, xx = 0, xy = 0;
    int samples = 0;
    bool has_anchor = false;
    double anchor_overhead_s = 0, anchor_per_token_s = 0;
  };
  StageFit raw_fit(const Sums& s) const;

  MicrobatchTunerOptions opt_;
  std::vector<Sums> stages_;
  int settled_;
  double last_switch_s_ = 0;
  bool informed_ = false;  // a choice has been made from fitted stage times
  bool switched_once_ = false;
  int steps_since_probe_ = 0;
  int switches_ = 0;
  double last_bubble_ = 0;
};

}  // namespace troupe
