#pragma once
// What a simulated run produced, summarized as requests finish so that a run
// of a million requests keeps a few kilobytes of statistics, not a million
// records: latency percentiles from log-bucketed histograms (within 0.5%),
// counts, throughput, goodput under an SLO, and per-replica figures.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::sim {

// Percentiles of positive values to within +-0.5% (buckets 1% wide on a log
// scale from 1 microsecond up); exact count, mean and max.
class LogHistogram {
 public:
  void add(double v);
  size_t count() const { return count_; }
  double mean() const { return count_ ? sum_ / double(count_) : 0; }
  double max() const { return max_; }
  // p in (0, 100]: the value below which p% of the samples lie (the
  // geometric middle of its bucket; 0 without samples).
  double percentile(double p) const;
  nlohmann::json to_json() const;  // {p50, p90, p99, mean, max, count}

 private:
  std::vector<uint64_t> buckets_;
  uint64_t zeros_ = 0;  // values below the first bucket
  size_t count_ = 0;
  double sum_ = 0, max_ = 0;
};

enum class Outcome { Completed, Cancelled, QueueFull, Timeout, Unavailable, BadRequest, Internal };
const char* outcome_name(Outcome o);

// One request's life, as the client saw it (times in simulated seconds).
struct RequestRecord {
  uint64_t id = 0;
  double arrival = 0;
  double placed = -1;       // first placed on a replica by the router; < 0: never
  double started = -1;      // its first step began; < 0: never
  double first_token = -1;  // < 0: no token
  double last_token = -1;
  double end = 0;
  int prompt_tokens = 0;
  int output_tokens = 0;  // delivered
  Outcome outcome = Outcome::Completed;
  // Outcome::BadRequest: what the front end refused it for (the server's
  // 400), before the runtime saw it.
  enum class TooLong : uint8_t { No, Context, MaxTokens } too_long = TooLong::No;
  // Its client was to go away before the answer (--cancel-fraction); it
  // ends Cancelled only if the answer was not complete by then.
  bool client_leaves = false;
  int priority = 0;

  double ttft() const { return first_token - arrival; }
  // Time per output token after the first; < 0 with fewer than two.
  double tpot() const {
    return output_tokens > 1 ? (last_token - first_token) / double(output_tokens - 1) : -1;
  }
  double latency() const { return end - arrival; }
  // Waiting before its first step: the router's queue and the replica's.
  double queue_delay() const { return started - arrival; }
};

struct Slo {
  double ttft_s = 1.0;
  double tpot_s = 0.1;
  // Completed, first token within ttft_s, and (with two tokens or more)
  // time per output token within tpot_s.
  bool met(const RequestRecord& r) const;
};

// Per replica, over the whole run.
struct ReplicaFigures {
  double busy_s = 0;  // device-seconds of compute over the replica's stages
  int stages = 1;
  double kv_sum = 0;  // sum of sampled KV occupancy (0..1)
  double kv_max = 0;
  size_t samples = 0;
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  int failures = 0;
};

class RunSummary {
 public:
  explicit RunSummary(Slo slo = {}) : slo_(slo) {}
  void add(const RequestRecord& r);
  void set_replicas(std::vector<ReplicaFigures> replicas) { replicas_ = std::move(replicas); }
  // The limits requests were refused against, for the table's explanation
  // (0: not known).
  void set_limits(int context_length, int max_tokens_limit) {
    context_length_ = context_length;
    max_tokens_limit_ = max_tokens_limit;
  }

  // The run's span: first arrival to last end (for throughput).
  double duration_s() const { return last_end_ > first_arrival_ ? last_end_ - first_arrival_ : 0; }
  size_t requests() const { return requests_; }
  size_t completed() const { return completed_; }
  size_t count(Outcome o) const { return outcomes_[size_t(o)]; }
  // Requests whose clients were to go away before their answer.
  size_t leaving() const { return leaving_; }
  uint64_t output_tokens() const { return output_tokens_; }
  double requests_per_s() const;
  double output_tokens_per_s() const;
  // Share of all requests that met the SLO.
  double goodput_share() const { return requests_ ? double(slo_met_) / double(requests_) : 0; }
  const LogHistogram& ttft() const { return ttft_; }
  const LogHistogram& tpot() const { return tpot_; }
  const LogHistogram& latency() const { return latency_; }
  const LogHistogram& queue_delay() const { return queue_; }
  const Slo& slo() const { return slo_; }
  const std::vector<ReplicaFigures>& replicas() const { return replicas_; }
  // Mean utilisation over the replicas (busy device-seconds over the span).
  double mean_utilisation() const;

  nlohmann::json to_json() const;
  std::string table() const;

 private:
  Slo slo_;
  size_t requests_ = 0, completed_ = 0, slo_met_ = 0;
  size_t outcomes_[7] = {0, 0, 0, 0, 0, 0, 0};
  uint64_t output_tokens_ = 0;
  size_t over_context_ = 0, over_max_tokens_ = 0, leaving_ = 0;
  int context_length_ = 0, max_tokens_limit_ = 0;
  double first_arrival_ = 1e300, last_end_ = 0;
  LogHistogram ttft_, tpot_, latency_, queue_;
  // Per request priority, when the workload has more than one: how each
  // level fared (what a priority policy is judged by).
  struct PriorityFigures {
    size_t requests = 0, completed = 0, slo_met = 0;
    LogHistogram ttft, queue;
  };
  std::map<int, PriorityFigures> by_priority_;
  std::vector<ReplicaFigures> replicas_;
};

}  // namespace troupe::sim
