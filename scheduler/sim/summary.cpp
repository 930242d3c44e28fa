#include "scheduler/sim/summary.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace troupe::sim {

namespace {

constexpr double kFloor = 1e-6;  // the first bucket's lower edge, seconds
const double kLogStep = std::log(1.01);

nlohmann::json share(size_t part, size_t whole) {
  return whole ? double(part) / double(whole) : 0.0;
}

}  // namespace

void LogHistogram::add(double v) {
  ++count_;
  sum_ += v;
  max_ = std::max(max_, v);
  if (!(v >= kFloor)) {
    ++zeros_;
    return;
  }
  const size_t i = size_t(std::log(v / kFloor) / kLogStep);
  if (i >= buckets_.size()) buckets_.resize(i + 1, 0);
  ++buckets_[i];
}

double LogHistogram::percentile(double p) const {
  if (count_ == 0) return 0;
  const uint64_t rank = uint64_t(std::max(1.0, std::ceil(p / 100.0 * double(count_))));
  uint64_t seen = zeros_;
  if (seen >= rank) return 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    seen += buckets_[i];
    if (seen >= rank) return std::min(max_, kFloor * std::exp((double(i) + 0.5) * kLogStep));
  }
  return max_;
}

nlohmann::json LogHistogram::to_json() const {
  if (count_ == 0) return {{"count", 0}};
  return {{"p50", percentile(50)}, {"p90", percentile(90)}, {"p99", percentile(99)},
          {"mean", mean()},        {"max", max()},          {"count", count_}};
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Completed:
      return "completed";
    case Outcome::Cancelled:
      return "cancelled";
    case Outcome::QueueFull:
      return "queue_full";
    case Outcome::Timeout:
      return "timeout";
    case Outcome::Unavailable:
      return "unavailable";
    case Outcome::BadRequest:
      return "bad_request";
    case Outcome::Internal:
      return "internal";
  }
  return "?";
}

bool Slo::met(const RequestRecord& r) const {
  if (r.outcome != Outcome::Completed || r.first_token < 0) return false;
  return r.ttft() <= ttft_s && (r.output_tokens < 2 || r.tpot() <= tpot_s);
}

void RunSummary::add(const RequestRecord& r) {
  ++requests_;
  ++outcomes_[size_t(r.outcome)];
  first_arrival_ = std::min(first_arrival_, r.arrival);
  last_end_ = std::max(last_end_, r.end);
  output_tokens_ += uint64_t(r.output_tokens);
  if (r.too_long == RequestRecord::TooLong::Context) ++over_context_;
  if (r.too_long == RequestRecord::TooLong::MaxTokens) ++over_max_tokens_;
  if (r.client_leaves && (r.outcome == Outcome::Completed || r.outcome == Outcome::Cancelled))
    ++leaving_;
  if (r.started >= 0) queue_.add(r.queue_delay());
  PriorityFigures& level = by_priority_[r.priority];
  ++level.requests;
  if (r.started >= 0) level.queue.add(r.queue_delay());
  if (r.outcome != Outcome::Completed) return;
  ++completed_;
  ++level.completed;
  if (slo_.met(r)) {
    ++slo_met_;
    ++level.slo_met;
  }
  if (r.first_token >= 0) {
    ttft_.add(r.ttft());
    level.ttft.add(r.ttft());
  }
  if (r.output_tokens > 1) tpot_.add(r.tpot());
  latency_.add(r.latency());
}

double RunSummary::requests_per_s() const {
  const double d = duration_s();
  return d > 0 ? double(completed_) / d : 0;
}

double RunSummary::output_tokens_per_s() const {
  const double d = duration_s();
  return d > 0 ? double(output_tokens_) / d : 0;
}

double RunSummary::mean_utilisation() const {
  if (replicas_.empty() || duration_s() <= 0) return 0;
  double u = 0;
  for (const auto& r : replicas_) u += r.busy_s / double(r.stages) / duration_s();
  return u / double(replicas_.size());
}

nlohmann::json RunSummary::to_json() const {
  nlohmann::json j;
  j["requests"] = requests_;
  nlohmann::json outcomes;
  for (int o = 0; o < 7; ++o) outcomes[outcome_name(Outcome(o))] = outcomes_[o];
  j["outcomes"] = outcomes;
  j["clients_leaving"] = leaving_;
  j["duration_s"] = duration_s();
  j["requests_per_s"] = requests_per_s();
  j["output_tokens"] = output_tokens_;
  j["output_tokens_per_s"] = output_tokens_per_s();
  j["ttft_s"] = ttft_.to_json();
  j["tpot_s"] = tpot_.to_json();
  j["latency_s"] = latency_.to_json();
  j["queue_delay_s"] = queue_.to_json();
  if (by_priority_.size() > 1) {
    nlohmann::json levels = nlohmann::json::object();
    for (const auto& [priority, f] : by_priority_)
      levels[std::to_string(priority)] = {
          {"requests", f.requests},
          {"completed", f.completed},
          {"goodput_share", f.requests ? double(f.slo_met) / double(f.requests) : 0.0},
          {"ttft_s", f.ttft.to_json()},
          {"queue_delay_s", f.queue.to_json()}};
    j["by_priority"] = std::move(levels);
  }
  j["slo"] = {{"ttft_s", slo_.ttft_s},
              {"tpot_s", slo_.tpot_s},
              {"goodput_share", goodput_share()},
              {"goodput_requests_per_s", duration_s() > 0 ? double(slo_met_) / duration_s() : 0}};
  uint64_t preemptions = 0, steps = 0;
  nlohmann::json reps = nlohmann::json::array();
  for (const auto& r : replicas_) {
    preemptions += r.preemptions;
    steps += r.steps;
    reps.push_back({{"utilisation", duration_s() > 0 ? r.busy_s / r.stages / duration_s() : 0.0},
                    {"kv_occupancy_mean", r.samples ? r.kv_sum / double(r.samples) : 0.0},
                    {"kv_occupancy_max", r.kv_max},
                    {"steps", r.steps},
                    {"preemptions", r.preemptions},
                    {"failures", r.failures}});
  }
  j["preemptions"] = preemptions;
  j["steps"] = steps;
  j["mean_utilisation"] = mean_utilisation();
  j["completed_share"] = share(completed_, requests_);
  // A thousand replicas would drown the summary; their figures go to the CSV.
  if (replicas_.size() <= 64) j["replicas"] = reps;
  return j;
}

std::string RunSummary::table() const {
  std::ostringstream s;
  char line[512];
  std::snprintf(line, sizeof line,
                "requests %zu: %zu completed, %zu cancelled, %zu refused (queue full), %zu timed "
                "out, %zu unavailable (503: timed out in the admission queue, or no replica up), "
                "%zu refused as too long (HTTP 400)\n",
                requests_, completed_, count(Outcome::Cancelled), count(Outcome::QueueFull),
                count(Outcome::Timeout), count(Outcome::Unavailable), count(Outcome::BadRequest));
  s << line;
  if (leaving_ > 0)
    s << "  " << leaving_ << " clients were to go away before their answer; "
      << count(Outcome::Cancelled) << " did (cancelled), the others had it first\n";
  // Which limit, as the server's error says it.
  const auto limit = [](const char* what, int n) {
    return n > 0 ? std::string(" ") + what + " of " + std::to_string(n) + " tokens" : std::string();
  };
  if (over_context_ > 0)
    s << "  " << over_context_ << " with prompt + output over the model's context"
      << limit("length", context_length_)
      << " (the server answers 400 context_length_exceeded; shorten the lengths to serve them)\n";
  if (over_max_tokens_ > 0)
    s << "  " << over_max_tokens_ << " asking for more output than server.max_tokens_limit"
      << limit("limit", max_tokens_limit_) << " (the server answers 400 on max_tokens)\n";
  std::snprintf(line, sizeof line,
                "span %.2f s: %.2f requests/s, %.1f output tokens/s; mean utilisation %.0f%%\n",
                duration_s(), requests_per_s(), output_tokens_per_s(), 100 * mean_utilisation());
  s << line;
  s << "              p50 ms     p90 ms     p99 ms    mean ms\n";
  const auto row = [&](const char* name, const LogHistogram& h) {
    std::snprintf(line, sizeof line, "  %-9s %10.1f %10.1f %10.1f %10.1f\n", name,
                  1e3 * h.percentile(50), 1e3 * h.percentile(90), 1e3 * h.percentile(99),
                  1e3 * h.mean());
    s << line;
  };
  row("TTFT", ttft_);
  row("TPOT", tpot_);
  row("latency", latency_);
  row("queueing", queue_);
  uint64_t preemptions = 0;
  for (const auto& r : replicas_) preemptions += r.preemptions;
  std::snprintf(line, sizeof line,
                "goodput (TTFT <= %.3g s and TPOT <= %.3g s): %.1f%% of requests; preemptions "
                "%llu\n",
                slo_.ttft_s, slo_.tpot_s, 100 * goodput_share(), (unsigned long long)preemptions);
  s << line;
  if (by_priority_.size() > 1)
    for (auto it = by_priority_.rbegin(); it != by_priority_.rend(); ++it) {
      const PriorityFigures& f = it->second;
      std::snprintf(line, sizeof line,
                    "  priority %d: %zu requests, %zu completed, TTFT p50 %.1f ms p99 %.1f ms, "
                    "goodput %.1f%%\n",
                    it->first, f.requests, f.completed, 1e3 * f.ttft.percentile(50),
                    1e3 * f.ttft.percentile(99),
                    f.requests ? 100.0 * double(f.slo_met) / double(f.requests) : 0.0);
      s << line;
    }
  return s.str();
}

}  // namespace troupe::sim
