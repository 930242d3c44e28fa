#include "scheduler/routing_policy.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "scheduler/prefix_affinity_policy.h"

namespace troupe {
namespace {

// Live replicas ordered by index, so that a choice never depends on the order
// in which the caller happened to list them.
std::vector<const ReplicaLoad*> live_by_index(const std::vector<ReplicaLoad>& replicas) {
  std::vector<const ReplicaLoad*> live;
  live.reserve(replicas.size());
  for (const ReplicaLoad& r : replicas) {
    if (r.live) live.push_back(&r);
  }
  std::sort(live.begin(), live.end(),
            [](const ReplicaLoad* a, const ReplicaLoad* b) { return a->index < b->index; });
  return live;
}

bool finite_positive(double x) {
  return std::isfinite(x) && x > 0;
}

}  // namespace

// Outstanding requests first; prompt tokens still to prefill break ties
// because they are work the replica must do before it can start ours.
bool less_loaded(const ReplicaLoad& a, const ReplicaLoad& b) {
  return std::tie(a.outstanding, a.queued_tokens, a.index) <
         std::tie(b.outstanding, b.queued_tokens, b.index);
}

// ---- round_robin ----

std::optional<size_t> RoundRobinPolicy::choose(const std::vector<ReplicaLoad>& replicas,
                                               const RequestInfo& /*req*/, double /*now_s*/) {
  // The next live index after the last one chosen, wrapping: keeps the
  // rotation fair when replicas die, come back or are listed in another order.
  // A caller that lists replica i at position i (the request table) gets it
  // without a scan: indices are unique, so a live one found walking up from
  // last + 1 through positional entries is the smallest live index above it.
  if (last_) {
    for (size_t pos = *last_ + 1; pos < replicas.size() && replicas[pos].index == pos; ++pos) {
      if (replicas[pos].live) {
        last_ = pos;
        return pos;
      }
    }
  }
  const ReplicaLoad* lowest = nullptr;
  const ReplicaLoad* next = nullptr;
  for (const ReplicaLoad& r : replicas) {
    if (!r.live) continue;
    if (lowest == nullptr || r.index < lowest->index) lowest = &r;
    if (last_ && r.index > *last_ && (next == nullptr || r.index < next->index)) next = &r;
  }
  if (lowest == nullptr) return std::nullopt;
  last_ = (next != nullptr ? next : lowest)->index;
  return last_;
}

// ---- least_outstanding ----

std::optional<size_t> LeastOutstandingPolicy::choose(const std::vector<ReplicaLoad>& replicas,
                                                     const RequestInfo& /*req*/, double /*now_s*/) {
  const ReplicaLoad* best = nullptr;
  for (const ReplicaLoad& r : replicas) {
    if (r.live && (best == nullptr || less_loaded(r, *best))) best = &r;
  }
  if (best == nullptr) return std::nullopt;
  return best->index;
}

// ---- power_of_two ----

namespace {

// The k-th live replica in index order. Listings already in index order (the
// request table's) are walked in place; others are sorted first.
const ReplicaLoad& kth_live(const std::vector<ReplicaLoad>& replicas, size_t k, bool sorted,
                            bool all_live) {
  if (sorted && all_live) return replicas[k];
  if (sorted) {
    for (const ReplicaLoad& r : replicas)
      if (r.live && k-- == 0) return r;
  }
  return *live_by_index(replicas)[k];
}

}  // namespace

std::optional<size_t> PowerOfTwoPolicy::choose(const std::vector<ReplicaLoad>& replicas,
                                               const RequestInfo& /*req*/, double /*now_s*/) {
  size_t live = 0;
  bool sorted = true;
  const ReplicaLoad* only = nullptr;
  for (size_t i = 0; i < replicas.size(); ++i) {
    if (i > 0 && replicas[i].index <= replicas[i - 1].index) sorted = false;
    if (replicas[i].live) {
      ++live;
      only = &replicas[i];
    }
  }
  if (live == 0) return std::nullopt;
  if (live == 1) return only->index;
  const uint64_t a = rng_.below(live);
  uint64_t b = rng_.below(live - 1);
  if (b >= a) ++b;  // distinct from a, still uniform over the others
  const bool all_live = live == replicas.size();
  const ReplicaLoad& ra = kth_live(replicas, a, sorted, all_live);
  const ReplicaLoad& rb = kth_live(replicas, b, sorted, all_live);
  return less_loaded(rb, ra) ? rb.index : ra.index;
}

// ---- latency_aware ----

std::optional<LatencyAwareOptions::Problem> LatencyAwareOptions::problem() const {
  if (!(std::isfinite(ema_alpha) && ema_alpha > 0 && ema_alpha <= 1))
    return Problem{"ema_alpha", "in (0, 1]"};
  if (!finite_positive(prior_step_s)) return Problem{"prior_step_s", "> 0"};
  if (!finite_positive(prior_prefill_tokens_per_s))
    return Problem{"prior_prefill_tokens_per_s", "> 0"};
  if (!(std::isfinite(batch_cost_per_seq) && batch_cost_per_seq >= 0))
    return Problem{"batch_cost_per_seq", ">= 0"};
  if (!(std::isfinite(stale_after_s) && stale_after_s >= 0))
    return Problem{"stale_after_s", ">= 0"};
  if (!finite_positive(forget_tau_s)) return Problem{"forget_tau_s", "> 0"};
  if (!(std::isfinite(probe_interval_s) && probe_interval_s >= 0))
    return Problem{"probe_interval_s", ">= 0"};
  if (probe_every_requests == 0) return Problem{"probe_every_requests", ">= 1"};
  return std::nullopt;
}

void LatencyAwareOptions::validate() const {
  if (const auto p = problem())
    throw std::invalid_argument(std::string("routing.latency_aware.") + p->field + " must be " +
                                p->rule);
}

LatencyAwarePolicy::LatencyAwarePolicy(LatencyAwareOptions options) : opt_(options) {
  opt_.validate();
}

LatencyAwarePolicy::ReplicaStats& LatencyAwarePolicy::stats(size_t index) {
  if (index >= stats_.size()) stats_.resize(index + 1);
  return stats_[index];
}

const LatencyAwarePolicy::ReplicaStats* LatencyAwarePolicy::find_stats(size_t index) const {
  return index < stats_.size() ? &stats_[index] : nullptr;
}

double LatencyAwarePolicy::batch_factor(double batch) const {
  return 1.0 + opt_.batch_cost_per_seq * std::max(0.0, batch - 1.0);
}

double LatencyAwarePolicy::freshness(double last_at, double now_s) const {
  const double age = now_s - last_at;
  if (age <= opt_.stale_after_s) return 1.0;
  return std::exp(-(age - opt_.stale_after_s) / opt_.forget_tau_s);
}

// An unmeasured replica is assumed to be like the others that are measured
// now (same hardware is the common case); with none measured, the option.
double LatencyAwarePolicy::prior_unit_step_s(double now_s) const {
  double sum = 0;
  size_t n = 0;
  for (const ReplicaStats& s : stats_) {
    if (s.unit_step_ema && now_s - s.last_step_at <= opt_.stale_after_s) {
      sum += *s.unit_step_ema;
      ++n;
    }
  }
  return n > 0 ? sum / double(n) : opt_.prior_step_s;
}

double LatencyAwarePolicy::Prior::get() const {
  if (!value_) value_ = policy_.prior_unit_step_s(now_s_);
  return *value_;
}

// A fresh measurement stands alone; only a missing or fading one needs the
// prior, which costs a pass over every replica, so it is computed on demand
// (once per choose() however many replicas need it).
double LatencyAwarePolicy::unit_step(size_t index, double now_s, const Prior& prior) const {
  const ReplicaStats* s = find_stats(index);
  if (s == nullptr || !s->unit_step_ema) return prior.get();
  const double fresh = freshness(s->last_step_at, now_s);
  if (fresh == 1.0) return *s->unit_step_ema;
  const double p = prior.get();
  return p + (*s->unit_step_ema - p) * fresh;
}

double LatencyAwarePolicy::unit_step_s(size_t index, double now_s) const {
  return unit_step(index, now_s, Prior{*this, now_s});
}

double LatencyAwarePolicy::prefill_tokens_per_s(size_t index, double now_s,
                                                const Prior& prior) const {
  const ReplicaStats* s = find_stats(index);
  const bool measured = s != nullptr && s->prefill_rate_ema.has_value();
  const double fresh = measured ? freshness(s->last_prefill_at, now_s) : 0.0;
  if (fresh == 1.0) return *s->prefill_rate_ema;
  // Without a prefill measurement, assume prefill is as much slower or faster
  // than the prior as this replica's decode steps are.
  const double scaled_prior =
      opt_.prior_prefill_tokens_per_s * opt_.prior_step_s / unit_step(index, now_s, prior);
  if (!measured) return scaled_prior;
  return scaled_prior + (*s->prefill_rate_ema - scaled_prior) * fresh;
}

double LatencyAwarePolicy::estimate_finish_s(const ReplicaLoad& r, const RequestInfo& req,
                                             double now_s) const {
  return estimate(r, req, now_s, Prior{*this, now_s});
}

double LatencyAwarePolicy::estimate(const ReplicaLoad& r, const RequestInfo& req, double now_s,
                                    const Prior& prior) const {
  const size_t max_batch = std::max<size_t>(1, r.max_batch_sequences);
  const size_t waiting = r.outstanding > r.running ? r.outstanding - r.running : 0;
  const size_t free_slots = max_batch > r.running ? max_batch - r.running : 0;
  const size_t position = waiting + 1;  // our place among those waiting for a slot
  const double join_batch = double(std::min(max_batch, r.running + position));
  const double step_s = unit_step(r.index, now_s, prior) * batch_factor(join_batch);

  const double prefill_s =
      double(r.queued_tokens + req.prompt_tokens) / prefill_tokens_per_s(r.index, now_s, prior);

  // With the batch full, slots free up at about max_batch / mean_length per
  // step; mean length from what this policy dispatched there, else ours.
  double wait_steps = 0;
  if (position > free_slots) {
    const ReplicaStats* s = find_stats(r.index);
    const double mean_len = (s != nullptr && s->tracked > 0)
                                ? s->tracked_max_tokens / double(s->tracked)
                                : double(std::max<size_t>(1, req.max_tokens));
    wait_steps = double(position - free_slots) * mean_len / double(max_batch);
  }

  const double transfer_s = std::max(0.0, r.transfer_cost_s.value_or(0.0));
  return transfer_s + prefill_s + wait_steps * step_s + double(req.max_tokens) * step_s;
}

// Only replicas measured before are probed: an unmeasured one is already
// assumed to be as fast as the others, so it gets traffic without a probe.
std::optional<size_t> LatencyAwarePolicy::probe_target(const std::vector<ReplicaLoad>& replicas,
                                                       double now_s) {
  if (opt_.probe_interval_s <= 0 || ++since_probe_ < opt_.probe_every_requests) {
    return std::nullopt;
  }
  const ReplicaLoad* target = nullptr;
  for (const ReplicaLoad& r : replicas) {
    const ReplicaStats* s = find_stats(r.index);
    if (!r.live || r.outstanding > 0 || s == nullptr || !s->unit_step_ema) continue;
    if (now_s - s->last_step_at < opt_.probe_interval_s) continue;
    if (s->last_probe_at && now_s - *s->last_probe_at < opt_.probe_interval_s) continue;
    if (target == nullptr || r.index < target->index) target = &r;
  }
  if (target == nullptr) return std::nullopt;
  since_probe_ = 0;
  stats(target->index).last_probe_at = now_s;
  return target->index;
}

std::optional<size_t> LatencyAwarePolicy::choose(const std::vector<ReplicaLoad>& replicas,
                                                 const RequestInfo& req, double now_s) {
  if (std::optional<size_t> probe = probe_target(replicas, now_s)) return probe;
  const Prior prior{*this, now_s};
  const ReplicaLoad* best = nullptr;
  double best_s = 0;
  for (const ReplicaLoad& r : replicas) {
    if (!r.live) continue;
    const double t = estimate(r, req, now_s, prior);
    if (best == nullptr || t < best_s || (t == best_s && r.index < best->index)) {
      best = &r;
      best_s = t;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->index;
}

void LatencyAwarePolicy::on_dispatch(size_t replica, const RequestInfo& req, double /*now_s*/) {
  ReplicaStats& s = stats(replica);
  ++s.tracked;
  s.tracked_max_tokens += double(req.max_tokens);
}

void LatencyAwarePolicy::on_complete(size_t replica, const RequestInfo& req, double /*now_s*/) {
  ReplicaStats& s = stats(replica);
  if (s.tracked == 0) return;  // completion we never saw dispatched (e.g. after a restart)
  --s.tracked;
  s.tracked_max_tokens =
      s.tracked == 0 ? 0.0 : std::max(0.0, s.tracked_max_tokens - double(req.max_tokens));
}

void LatencyAwarePolicy::on_step(size_t replica, double step_time_s, size_t batch_size,
                                 double now_s) {
  if (!finite_positive(step_time_s) || batch_size == 0) return;
  const double unit = step_time_s / batch_factor(double(batch_size));
  // Blend into the value currently believed (which may have faded toward the
  // prior), so one sample after a long silence counts for more.
  const double base = unit_step_s(replica, now_s);
  ReplicaStats& s = stats(replica);
  s.unit_step_ema = s.unit_step_ema ? opt_.ema_alpha * unit + (1 - opt_.ema_alpha) * base : unit;
  s.last_step_at = now_s;
}

void LatencyAwarePolicy::on_prefill(size_t replica, size_t tokens, double seconds, double now_s) {
  if (tokens == 0 || !finite_positive(seconds)) return;
  const double rate = double(tokens) / seconds;
  const double base = prefill_tokens_per_s(replica, now_s, Prior{*this, now_s});
  ReplicaStats& s = stats(replica);
  s.prefill_rate_ema =
      s.prefill_rate_ema ? opt_.ema_alpha * rate + (1 - opt_.ema_alpha) * base : rate;
  s.last_prefill_at = now_s;
}

// ---- registry ----

namespace {

// The built-in policies come first; they are registered when the registry is
// first used, so no static-initialisation order matters.
struct Registry {
  Registry() {
    add("round_robin",
        [](uint64_t, const LatencyAwareOptions&) { return std::make_unique<RoundRobinPolicy>(); });
    add("least_outstanding", [](uint64_t, const LatencyAwareOptions&) {
      return std::make_unique<LeastOutstandingPolicy>();
    });
    add("power_of_two", [](uint64_t seed, const LatencyAwareOptions&) {
      return std::make_unique<PowerOfTwoPolicy>(seed);
    });
    add("latency_aware", [](uint64_t, const LatencyAwareOptions& latency) {
      return std::make_unique<LatencyAwarePolicy>(latency);
    });
    add("prefix_affinity", [](uint64_t, const LatencyAwareOptions&) {
      return std::make_unique<PrefixAffinityPolicy>();
    });
  }
  void add(std::string name, RoutingPolicyFactory f) {
    names.push_back(std::move(name));
    factories.push_back(std::move(f));
  }

  std::mutex mu;
  std::vector<std::string> names;  // registration order
  std::vector<RoutingPolicyFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_routing_policy(const std::string& name, RoutingPolicyFactory factory) {
  if (name.empty()) throw std::invalid_argument("a routing policy needs a name");
  if (!factory) throw std::invalid_argument("routing policy '" + name + "' needs a factory");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (std::find(r.names.begin(), r.names.end(), name) != r.names.end())
    throw std::invalid_argument("routing policy '" + name + "' is already registered");
  r.add(name, std::move(factory));
}

const std::vector<std::string>& routing_policy_names() {
  return registry().names;
}

std::unique_ptr<RoutingPolicy> make_routing_policy(std::string_view name, uint64_t seed,
                                                   const LatencyAwareOptions& latency) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (size_t i = 0; i < r.names.size(); ++i)
    if (r.names[i] == name) return r.factories[i](seed, latency);
  std::string known;
  for (const std::string& n : r.names) known += known.empty() ? n : ", " + n;
  throw std::invalid_argument("unknown routing policy '" + std::string(name) +
                              "'; known policies: " + known);
}

}  // namespace troupe
