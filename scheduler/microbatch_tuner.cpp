#include "scheduler/microbatch_tuner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("microbatch tuner: " + what);
}

// A drifted stage needs its probe's samples to land before another probe
// can tell more; noise alone must not trigger a probe every step.
constexpr int kMinStepsBetweenProbes = 4;

double balanced_bubble(int stages, int m) {
  return double(stages - 1) / double(m + stages - 1);
}

// Makespan of the micro-batches flowing through the stages in order (a
// permutation flow shop): a stage starts a micro-batch when it has finished
// the previous one and the stage before has finished this one.
StepPrediction simulate(const std::vector<StageFit>& fits, size_t batch_tokens, int m) {
  StepPrediction out;
  out.microbatches = m;
  const size_t p = fits.size();
  std::vector<double> done(p, 0.0);
  double busy = 0;
  for (size_t x : MicrobatchTuner::split(batch_tokens, m)) {
    double ready = 0;
    for (size_t s = 0; s < p; ++s) {
      const double t = std::max(0.0, fits[s].overhead_s + fits[s].per_token_s * double(x));
      done[s] = std::max(done[s], ready) + t;
      ready = done[s];
      busy += t;
    }
  }
  out.step_time_s = done.back();
  out.bubble_fraction = out.step_time_s > 0 ? 1 - busy / (double(p) * out.step_time_s) : 0;
  return out;
}

}  // namespace

MicrobatchTuner::MicrobatchTuner(int stages, MicrobatchTunerOptions options) : opt_(options) {
  if (stages < 1) bad("stage count must be >= 1, got " + std::to_string(stages));
  if (opt_.max_microbatches < 1) {
    bad("max_microbatches must be >= 1, got " + std::to_string(opt_.max_microbatches));
  }
  if (opt_.initial_microbatches < 0 || opt_.initial_microbatches > opt_.max_microbatches) {
    bad("initial_microbatches must be in [0, max_microbatches], got " +
        std::to_string(opt_.initial_microbatches));
  }
  // Written so that NaN fails each check.
  if (!(opt_.decay > 0 && opt_.decay <= 1)) bad("decay must be in (0, 1]");
  if (!(opt_.hysteresis >= 0 && opt_.hysteresis < 1)) bad("hysteresis must be in [0, 1)");
  if (!(opt_.min_dwell_s >= 0)) bad("min_dwell_s must be >= 0");
  if (opt_.min_samples < 1) bad("min_samples must be >= 1");
  if (!(opt_.min_relative_spread >= 0)) bad("min_relative_spread must be >= 0");
  if (!(opt_.probe_on_drift >= 0)) bad("probe_on_drift must be >= 0");
  if (opt_.probe_interval_steps < 1) bad("probe_interval_steps must be >= 1");
  stages_.resize(size_t(stages));
  settled_ = opt_.initial_microbatches > 0 ? opt_.initial_microbatches
                                           : std::min(stages, opt_.max_microbatches);
  last_bubble_ = balanced_bubble(stages, settled_);
}

std::vector<size_t> MicrobatchTuner::split(size_t batch_tokens, int m) {
  if (m < 1) bad("micro-batch count must be >= 1, got " + std::to_string(m));
  const size_t q = batch_tokens / size_t(m), extra = batch_tokens % size_t(m);
  std::vector<size_t> sizes(size_t(m), q);
  for (size_t i = 0; i < extra; ++i) ++sizes[i];
  return sizes;
}

void MicrobatchTuner::observe(int stage, size_t tokens, double seconds) {
  if (stage < 0 || stage >= stages()) {
    bad("stage " + std::to_string(stage) + " is not in [0, " + std::to_string(stages()) + ")");
  }
  if (!(seconds >= 0 && std::isfinite(seconds))) {
    bad("stage time must be finite and >= 0, got " + std::to_string(seconds));
  }
  Sums& s = stages_[size_t(stage)];
  const double x = double(tokens);
  s.w = s.w * opt_.decay + 1;
  s.x = s.x * opt_.decay + x;
  s.y = s.y * opt_.decay + seconds;
  s.xx = s.xx * opt_.decay + x * x;
  s.xy = s.xy * opt_.decay + x * seconds;
  ++s.samples;
  const StageFit f = raw_fit(s);
  if (f.identified) {
    s.has_anchor = true;
    s.anchor_overhead_s = f.overhead_s;
    s.anchor_per_token_s = f.per_token_s;
  }
}

StageFit MicrobatchTuner::raw_fit(const Sums& s) const {
  StageFit f;
  f.samples = s.samples;
  if (s.w == 0) return f;  // no samples, or forgotten after a change
  const double mx = s.x / s.w, my = s.y / s.w;
  const double var = std::max(0.0, s.xx / s.w - mx * mx);
  f.identified =
      s.samples >= opt_.min_samples && var > 0 && std::sqrt(var) >= opt_.min_relative_spread * mx;
  if (!f.identified) {
    // One size only: charge it all to the tokens (fit() prefers an anchor).
    f.per_token_s = mx > 0 ? my / mx : 0;
    f.overhead_s = mx > 0 ? 0 : my;
    return f;
  }
  f.per_token_s = (s.xy / s.w - mx * my) / var;
  f.overhead_s = my - f.per_token_s * mx;
  // Neither term can be negative; noise can make the free fit say so. Refit
  // with that term at zero.
  if (f.per_token_s < 0) {
    f.per_token_s = 0;
    f.overhead_s = my;
  } else if (f.overhead_s < 0) {
    f.overhead_s = 0;
    f.per_token_s = s.xy / s.xx;
  }
  return f;
}

StageFit MicrobatchTuner::fit(int stage) const {
  if (stage < 0 || stage >= stages()) {
    bad("stage " + std::to_string(stage) + " is not in [0, " + std::to_string(stages()) + ")");
  }
  const Sums& s = stages_[size_t(stage)];
  StageFit f = raw_fit(s);
  if (f.identified || !s.has_anchor) return f;
  // Keep the anchor's split between overhead and per-token cost, scaled to
  // what the stage takes now: right when the stage got uniformly slower or
  // faster, and the drift says when it changed in some other way.
  double k = 1;
  if (s.w > 0) {
    const double mx = s.x / s.w, my = s.y / s.w;
    const double expected = s.anchor_overhead_s + s.anchor_per_token_s * mx;
    if (expected > 0) k = my / expected;
  }
  f.overhead_s = k * s.anchor_overhead_s;
  f.per_token_s = k * s.anchor_per_token_s;
  f.anchored = true;
  f.drift = std::abs(k - 1);
  return f;
}

bool MicrobatchTuner::ready() const {
  return std::all_of(stages_.begin(), stages_.end(),
                     [this](const Sums& s) { return s.samples >= opt_.min_samples; });
}

StepPrediction MicrobatchTuner::predict(size_t batch_tokens, int microbatches) const {
  std::vector<StageFit> fits;
  for (int s = 0; s < stages(); ++s) fits.push_back(fit(s));
  return simulate(fits, batch_tokens, microbatches);
}

int MicrobatchTuner::choose(size_t batch_tokens, double now_s) {
  const int p = stages();
  if (batch_tokens == 0) {
    last_bubble_ = balanced_bubble(p, 1);
    return 1;
  }
  const int limit = int(std::min(size_t(opt_.max_microbatches), batch_tokens));
  const int current = std::clamp(settled_, 1, limit);
  if (!ready()) {
    last_bubble_ = balanced_bubble(p, current);
    return current;
  }
  std::vector<StageFit> fits;
  bool probe_now = false;
  ++steps_since_probe_;
  for (int s = 0; s < p; ++s) {
    const StageFit f = fit(s);
    if (!f.identified) {
      if (!f.anchored || steps_since_probe_ > opt_.probe_interval_steps) {
        probe_now = true;
      } else if (f.drift > opt_.probe_on_drift && steps_since_probe_ > kMinStepsBetweenProbes) {
        // The stage changed. Its samples mix times from before and after the
        // change; fitted together with the probe's they would skew the split
        // between overhead and per-token cost, so start afresh (the anchor
        // stands in until new samples of two sizes arrive).
        Sums& sums = stages_[size_t(s)];
        sums.w = sums.x = sums.y = sums.xx = sums.xy = 0;
        probe_now = true;
      }
    }
    fits.push_back(f);
  }
  if (probe_now && limit > 1) {
    steps_since_probe_ = 0;
    const int probe = current * 2 <= limit ? current * 2 : std::max(1, current / 2);
    last_bubble_ = simulate(fits, batch_tokens, probe).bubble_fraction;
    return probe;
  }
  const StepPrediction here = simulate(fits, batch_tokens, current);
  StepPrediction best = here;
  for (int m = 1; m <= limit; ++m) {
    const StepPrediction candidate = m == current ? here : simulate(fits, batch_tokens, m);
    if (candidate.step_time_s < best.step_time_s ||
        (candidate.step_time_s == best.step_time_s && m < best.microbatches)) {
      best = candidate;
    }
  }
  // The initial choice was a guess, not a measurement: the first informed
  // choice owes it no hysteresis.
  const bool first = !informed_;
  informed_ = true;
  const bool dwelt = !switched_once_ || now_s - last_switch_s_ >= opt_.min_dwell_s;
  if (best.microbatches != current &&
      (first || (dwelt && best.step_time_s < (1 - opt_.hysteresis) * here.step_time_s))) {
    settled_ = best.microbatches;
    last_switch_s_ = now_s;
    switched_once_ = true;
    ++switches_;
    last_bubble_ = best.bubble_fraction;
    return settled_;
  }
  last_bubble_ = here.bubble_fraction;
  return current;
}

}  // namespace troupe
