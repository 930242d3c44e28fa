#pragma once
// The checker of a chaos run: it compares every request's output with the
// fault-free pass of the same request and sorts each into exactly one
// outcome, measures latency before, during and after the faults, throughput
// over time, how long streams took to resume after each fault and what the
// processes' resources did. Plain functions over chaos/records.h; no I/O.
// chaos/report.h renders the result as text and JSON.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "chaos/records.h"

namespace troupe::chaos {

// Each request gets exactly one. Lost, Hung, Broken, Duplicated and Wrong are
// fatal; FailedStatus is reported but allowed.
enum class Outcome {
  Correct,       // 200, complete, the expected tokens (and finish reason)
  Cancelled,     // the client went away on purpose after a prefix of the expected tokens
  FailedStatus,  // a whole response with a status other than 200
  Lost,          // no response
  Hung,          // a stream stalled
  Broken,        // the server cut a response it had started
  Duplicated,    // the expected tokens with some runs delivered again
  Wrong,         // anything else that differs from the expected output
};
const char* outcome_name(Outcome o);  // "correct", "cancelled", "failed_status", "lost", ...
bool is_fatal(Outcome o);

// Whether `received` is `expected` (or, with prefix_ok, a prefix of it) with
// runs inserted that repeat the run immediately before them in `received`:
// expected a b c d matches received a b c b c d and a b b c d. `extra` is
// the number of repeated tokens (received.size() minus the matched length).
// The search is bounded; `gave_up` says it stopped before deciding (then
// matched is false).
struct RepeatMatch {
  bool matched = false;
  size_t extra = 0;
  bool gave_up = false;
};
RepeatMatch match_with_repeats(const std::vector<int>& expected, const std::vector<int>& received,
                               bool prefix_ok, size_t step_budget = 200'000'000);

// Nearest-rank percentile (p in (0, 100]) of unsorted samples; throws on none.
double percentile_nearest_rank(std::vector<double> samples, double p);

struct Quantiles {
  size_t count = 0;  // 0: p50 and p99 mean nothing
  double p50 = 0, p99 = 0;
};
Quantiles quantiles(const std::vector<double>& samples);

// ---- requests ----

struct Counts {
  size_t requests = 0;
  size_t correct = 0;
  size_t cancelled = 0;  // cancellations honoured (a prefix of the expected tokens)
  size_t failed_status = 0;
  size_t lost = 0, hung = 0, broken = 0, duplicated = 0, wrong = 0;
  size_t duplicated_tokens = 0;  // the repeated tokens over all duplicated requests
  size_t fatal() const { return lost + hung + broken + duplicated + wrong; }
};

struct MessageCount {
  std::string message;
  size_t count = 0;
  std::vector<size_t> examples;  // request indices, at most kMaxMessageExamples
};
struct StatusGroup {
  int status = 0;
  size_t count = 0;
  std::vector<MessageCount> messages;  // most frequent first, at most kMaxMessages
  size_t other_messages = 0;           // requests whose message did not fit in the list
};

// One fatal request, to show what went wrong.
struct FatalExample {
  Outcome outcome = Outcome::Wrong;
  size_t index = 0;  // RequestRecord::index
  std::string what;  // in words: "expected 16 tokens, received 18 (2 repeated)"
  size_t expected_count = 0, received_count = 0;
  // A window of ids around the first difference, from window_start in both.
  size_t diverges_at = 0;
  size_t window_start = 0;
  std::vector<int> expected_ids, received_ids;
  std::string error;  // the request's error, if any
};

inline constexpr size_t kMaxExamplesPerOutcome = 10;
inline constexpr size_t kMaxMessages = 8;
inline constexpr size_t kMaxMessageExamples = 3;
inline constexpr size_t kExampleIds = 8;

// ---- latency (correct requests only) ----

struct PhaseLatency {
  size_t requests = 0;  // correct requests in the phase
  Quantiles ttft;       // first_token_s - sent_s
  Quantiles tpot;       // (last - first token time) / (tokens - 1), streams with >= 2 tokens
  Quantiles e2e;        // end_s - sent_s
};
struct Latency {
  PhaseLatency before;  // ended before the first fault was injected
  PhaseLatency during;  // [sent_s, end_s] overlaps a fault's window
  PhaseLatency after;   // the rest
};

// ---- throughput ----

struct Throughput {
  double baseline_tokens_per_s = 0;
  std::vector<double> bins;   // tokens per second in 1-second bins from t = 0 (all requests)
  double fault_window_s = 0;  // length of the union of the fault windows
  double after_window_s = 0;  // from the end of the last fault window to the end of the run
  std::optional<double> during_tokens_per_s, after_tokens_per_s;  // absent: no such window
  std::optional<double> during_fraction, after_fraction;  // of the baseline; absent: 0 baseline
};

// ---- faults ----

struct ResumeDelay {
  size_t index = 0;  // RequestRecord::index
  double delay_s = 0;
};
struct FaultReport {
  size_t number = 0;  // position in RunRecords::faults, from 0
  FaultRecord record;
  double window_end_s = -1;  // max(injected + duration, confirmed, recovered)
  // Streams in flight at injected_s whose next token came later than
  // injected_s + ChaosReport::resume_threshold_s: the delay to that token.
  std::vector<ResumeDelay> resumed_late;
  double resume_max_s = -1;  // -1: none late
  bool confirmed() const { return record.confirmed_s >= 0 && record.error.empty(); }
};
struct FaultKindReport {
  std::string kind;
  size_t count = 0, confirmed = 0;
  Quantiles detection;      // detected_s - injected_s
  Quantiles resume;         // every late stream's delay, all faults of the kind
  Quantiles capacity_back;  // recovered_s - injected_s
};

// ---- resources ----

struct ResourceDelta {
  std::string process;
  bool at_start = false, at_end = false;  // sampled then
  ResourceSample start, end;
};

struct ChaosReport {
  double duration_s = 0;
  Counts counts;
  std::vector<Outcome> outcomes;              // one per RunRecords::requests, in its order
  std::vector<StatusGroup> failed_by_status;  // by status
  std::vector<FatalExample> examples;         // at most kMaxExamplesPerOutcome per fatal outcome
  Latency latency;
  double first_fault_s = -1;  // -1: no fault was injected
  Throughput throughput;
  double median_token_gap_s = 0;  // over all streams' inter-token gaps
  double resume_threshold_s = 0;  // max(0.25, 5 x median_token_gap_s)
  std::vector<FaultReport> faults;
  std::vector<FaultKindReport> fault_kinds;  // by kind, in order of first appearance
  std::vector<ResourceDelta> resources;

  // No request lost, hung, broken, duplicated or wrong, and every fault
  // confirmed without an error.
  bool ok() const;
  // Why not, one line each ("2 requests lost", "fault 3 (link_cut node-1) was
  // not confirmed: ..."); empty when ok().
  std::vector<std::string> failures() const;
};

// Classifies one request against its expected output (null: none known,
// which makes a delivered response wrong). `why` gets the reason in words
// for anything but Correct.
Outcome classify(const RequestRecord& q, const Expected* expected, std::string* why = nullptr);

ChaosReport check(const RunRecords& r);

}  // namespace troupe::chaos
