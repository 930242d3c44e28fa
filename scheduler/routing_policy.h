#pragma once
// Routing policies: which replica a new request goes to. Plain deterministic
// classes: no threads, no clocks (time comes in as `now_s`, seconds on any
// monotonic clock), no I/O, so the simulator and the router actor drive the
// same objects and get the same choices.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/rng.h"

namespace troupe {

// What the router knows about one replica when it routes a request.
struct ReplicaLoad {
  size_t index = 0;          // stable replica id; what choose() returns
  bool live = true;          // may take a request now: up, and with room (batch + waiting list)
                             // for another; false also while dead, restarting or given up on
  size_t outstanding = 0;    // dispatched and not yet complete (waiting + running)
  size_t queued_tokens = 0;  // prompt tokens waiting for prefill there
  size_t running = 0;        // sequences in its running batch
  size_t max_batch_sequences = 1;         // its batch capacity
  std::optional<double> transfer_cost_s;  // cost to move this request there (remote node)
};

struct RequestInfo {
  uint64_t id = 0;
  size_t prompt_tokens = 0;
  size_t max_tokens = 0;
  // Its prompt's tokens, for policies that route by content (prefix
  // affinity); null where they are not known. Valid during the call only.
  const std::vector<int>* prompt = nullptr;
};

// The order least_outstanding picks by: fewer outstanding requests, then
// fewer prompt tokens waiting for prefill, then the lower index.
bool less_loaded(const ReplicaLoad& a, const ReplicaLoad& b);

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;

  virtual std::string_view name() const = 0;
  // Whether choose() reads RequestInfo::prompt (a router log then records
  // prompts' tokens, so that a replay gives it the same).
  virtual bool reads_prompt() const { return false; }

  // Returns the `index` of the chosen replica, or nullopt when none is live.
  // `replicas` may be in any order and need not have contiguous indices.
  virtual std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas,
                                       const RequestInfo& req, double now_s) = 0;

  // Feedback from the runtime. Replicas are named by ReplicaLoad::index.
  virtual void on_dispatch(size_t /*replica*/, const RequestInfo& /*req*/, double /*now_s*/) {}
  // One batched step of `batch_size` sequences took `step_time_s`.
  virtual void on_step(size_t /*replica*/, double /*step_time_s*/, size_t /*batch_size*/,
                       double /*now_s*/) {}
  // `tokens` prompt tokens were prefilled in `seconds` (optional: policies
  // that need a prefill rate fall back to an estimate without it).
  virtual void on_prefill(size_t /*replica*/, size_t /*tokens*/, double /*seconds*/,
                          double /*now_s*/) {}
  virtual void on_complete(size_t /*replica*/, const RequestInfo& /*req*/, double /*now_s*/) {}
};

// Cycles through replica indices in increasing order, skipping dead ones.
class RoundRobinPolicy : public RoutingPolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo& req,
                               double now_s) override;

 private:
  std::optional<size_t> last_;  // index chosen last time
};

// Fewest outstanding requests; ties go to fewer queued tokens, then the
// lowest index.
class LeastOutstandingPolicy : public RoutingPolicy {
 public:
  std::string_view name() const override { return "least_outstanding"; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo& req,
                               double now_s) override;
};

// "Power of two choices" (Mitzenmacher): samples two distinct live replicas
// and takes the less loaded. Nearly as good as least-outstanding with stale
// load information, without herding every router onto the same replica.
class PowerOfTwoPolicy : public RoutingPolicy {
 public:
  explicit PowerOfTwoPolicy(uint64_t seed) : rng_(seed) {}
  std::string_view name() const override { return "power_of_two"; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo& req,
                               double now_s) override;

 private:
  Xoshiro256 rng_;
};

struct LatencyAwareOptions {
  // Weight of the newest step time in the moving average (0 < alpha <= 1).
  double ema_alpha = 0.3;
  // Step time of one sequence assumed before any replica has been measured.
  double prior_step_s = 0.05;
  // Prompt tokens per second assumed for a replica whose steps take
  // prior_step_s, before on_prefill has measured it; scaled by how much
  // slower or faster its measured steps are than the prior.
  double prior_prefill_tokens_per_s = 2000.0;
  // Extra step time per additional sequence in the batch, as a fraction of a
  // one-sequence step: step(b) = unit * (1 + batch_cost_per_seq * (b - 1)).
  // Decode is memory-bound, so an extra sequence costs a small fraction.
  double batch_cost_per_seq = 0.05;
  // A measurement older than this starts fading toward the prior, so a
  // replica that was slow once and then got no traffic is tried again.
  double stale_after_s = 5.0;
  // Time constant of that fading.
  double forget_tau_s = 10.0;
  // An idle replica whose last step is older than this gets one request as a
  // probe, so a replica that was slow is measured again once it recovers
  // (an idle replica reports no steps). 0 disables probing. At most one probe
  // per replica per interval, and one per `probe_every_requests` requests
  // overall, which bounds the cost when the replica really is slow.
  double probe_interval_s = 1.0;
  size_t probe_every_requests = 20;

  // The first field out of its range, and the range.
  struct Problem {
    const char* field;
    const char* rule;
  };
  std::optional<Problem> problem() const;
  // Throws std::invalid_argument naming the bad field.
  void validate() const;
  bool operator==(const LatencyAwareOptions&) const = default;
};

// Sends a request where it is expected to finish first:
//   transfer cost
// + (queued prompt tokens + this prompt) / prefill rate
// + steps to wait for a batch slot * step time
// + max_tokens * step time at the batch occupancy it will join,
// with step times from a moving average of each replica's measured steps.
// Idle replicas are probed now and then so that their estimate can recover.
class LatencyAwarePolicy : public RoutingPolicy {
 public:
  explicit LatencyAwarePolicy(LatencyAwareOptions options = {});
  std::string_view name() const override { return "latency_aware"; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo& req,
                               double now_s) override;
  void on_dispatch(size_t replica, const RequestInfo& req, double now_s) override;
  void on_step(size_t replica, double step_time_s, size_t batch_size, double now_s) override;
  void on_prefill(size_t replica, size_t tokens, double seconds, double now_s) override;
  void on_complete(size_t replica, const RequestInfo& req, double now_s) override;

  // Expected seconds until `req` would finish on `replica` (exposed for
  // tests, metrics and the simulator's traces).
  double estimate_finish_s(const ReplicaLoad& replica, const RequestInfo& req, double now_s) const;
  // One-sequence step time currently assumed for replica `index`.
  double unit_step_s(size_t index, double now_s) const;

 private:
  struct ReplicaStats {
    std::optional<double> unit_step_ema;  // step time normalised to a batch of one
    double last_step_at = 0.0;
    std::optional<double> prefill_rate_ema;  // tokens per second
    double last_prefill_at = 0.0;
    std::optional<double> last_probe_at;
    size_t tracked = 0;             // requests dispatched here and not completed
    double tracked_max_tokens = 0;  // their summed max_tokens
  };

  // The prior step time at one instant, computed on first use.
  class Prior {
   public:
    Prior(const LatencyAwarePolicy& policy, double now_s) : policy_(policy), now_s_(now_s) {}
    double get() const;

   private:
    const LatencyAwarePolicy& policy_;
    double now_s_;
    mutable std::optional<double> value_;
  };

  ReplicaStats& stats(size_t index);
  const ReplicaStats* find_stats(size_t index) const;
  double batch_factor(double batch) const;
  double prior_unit_step_s(double now_s) const;
  double unit_step(size_t index, double now_s, const Prior& prior) const;
  double prefill_tokens_per_s(size_t index, double now_s, const Prior& prior) const;
  double estimate(const ReplicaLoad& r, const RequestInfo& req, double now_s,
                  const Prior& prior) const;
  double freshness(double last_at, double now_s) const;
  std::optional<size_t> probe_target(const std::vector<ReplicaLoad>& replicas, double now_s);

  LatencyAwareOptions opt_;
  std::vector<ReplicaStats> stats_;  // by replica index, grown on demand
  size_t since_probe_ = 0;           // requests routed since the last probe
};

// Policies by name: the built-in ones, then any registered. serve and
// simulate both build their policy here, and the config accepts exactly these
// names, so a policy registered once is available to every command.
using RoutingPolicyFactory = std::function<std::unique_ptr<RoutingPolicy>(
    uint64_t seed, const LatencyAwareOptions& latency)>;

// Adds a policy. Call it before the config is read: first thing in main()
// (apps/main.cpp), not from a static initialiser in the policy's own file,
// which the static-library link leaves out when nothing else refers to it.
// Throws std::invalid_argument for an empty or already known name.
void register_routing_policy(const std::string& name, RoutingPolicyFactory factory);

// Names accepted by make_routing_policy, in a stable order (built-ins first).
const std::vector<std::string>& routing_policy_names();

// Builds a policy by its config name. Throws std::invalid_argument that lists
// the known names when `name` is not one of them. `seed` drives the random
// policies; the others ignore it.
std::unique_ptr<RoutingPolicy> make_routing_policy(std::string_view name, uint64_t seed,
                                                   const LatencyAwareOptions& latency = {});

}  // namespace troupe
