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

// A soak's latency drift: end-to-end and TTFT quantiles of the requests that
// ended in each window of `window_s` seconds from t = 0 (requests that got
// no answer are not in it; the counts judge those).
struct LatencyWindow {
  double start_s = 0;
  Quantiles e2e, ttft;
};
std::vector<LatencyWindow> latency_series(const std::vector<RequestRecord>& requests,
                                          double window_s);

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

// The phases of a run, the same for latency and throughput. Each fault that
// took effect (played and confirmed) has a window: from its injection until
// its effect ended and capacity was back (max of injected + duration,
// confirmed, recovered; the load's end for a detected death whose capacity
// never came back), clipped to the load's span [0, load end]. Faults
// that were refused, never confirmed or never played open no window.
//   before: before the first window starts
//   during: within a window
//   after:  from the first window on, outside every window (between faults,
//           and after the last one)
struct PhaseLatency {
  size_t requests = 0;  // correct requests in the phase
  Quantiles ttft;       // first_token_s - sent_s
  Quantiles tpot;       // (last - first token time) / (tokens - 1), streams with >= 2 tokens
  Quantiles e2e;        // end_s - sent_s
};
struct Latency {
  PhaseLatency before;  // ended before the first window started
  PhaseLatency during;  // [sent_s, end_s] overlaps a window
  PhaseLatency after;   // the rest: overlaps no window, ended after the first one started
};

// ---- throughput ----

struct PhaseRate {
  double window_s = 0;                 // time in the phase, within the load
  std::optional<double> tokens_per_s;  // absent: no time in the phase
  std::optional<double> fraction;      // of the baseline; absent: no rate or a 0 baseline
};
struct Throughput {
  double baseline_tokens_per_s = 0;
  std::string baseline_basis;       // RunRecords::baseline_basis
  std::vector<double> bins;         // tokens per second in 1-second bins from t = 0 (all requests)
  PhaseRate before, during, after;  // tokens that arrived in each phase (see Latency)
};

// ---- faults ----

struct ResumeDelay {
  size_t index = 0;  // RequestRecord::index
  double delay_s = 0;
};
struct FaultReport {
  size_t number = 0;  // position in RunRecords::faults, from 0
  FaultRecord record;
  // Its window, clipped to the load (see Latency); -1: none (it took no
  // effect, or was not played).
  double window_start_s = -1, window_end_s = -1;
  // Streams in flight at injected_s whose next token came later than
  // injected_s + ChaosReport::resume_threshold_s: the delay to that token.
  std::vector<ResumeDelay> resumed_late;
  double resume_max_s = -1;  // -1: none late
  bool played() const { return record.injected_s >= 0; }
  bool confirmed() const { return played() && record.confirmed_s >= 0 && record.error.empty(); }
};
struct FaultKindReport {
  std::string kind;
  size_t count = 0, confirmed = 0;  // played, and of those confirmed
  size_t not_played = 0;
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

enum class Verdict {
  Pass,        // nothing fatal, every planned fault played and confirmed
  Fail,        // a fatal outcome, or a played fault not confirmed
  Incomplete,  // nothing failed, but some planned faults were never played
};
const char* verdict_name(Verdict v);  // "PASS", "FAIL", "INCOMPLETE"

// "replica 1", "replicas 0, 2".
std::string capacity_text(const std::vector<int>& replicas);

struct ChaosReport {
  double duration_s = 0;
  double load_s = 0;  // the load's span [0, load_s] (RunRecords::load_end_s, else the last event)
  Counts counts;
  std::vector<Outcome> outcomes;              // one per RunRecords::requests, in its order
  std::vector<StatusGroup> failed_by_status;  // by status
  std::vector<FatalExample> examples;         // at most kMaxExamplesPerOutcome per fatal outcome
  Latency latency;
  double first_fault_s = -1;  // the first window's start; -1: no fault took effect
  Throughput throughput;
  double median_token_gap_s = 0;  // over all streams' inter-token gaps
  double resume_threshold_s = 0;  // max(0.25, 5 x median_token_gap_s)
  std::vector<FaultReport> faults;
  std::vector<FaultKindReport> fault_kinds;  // by kind, in order of first appearance
  std::vector<ResourceDelta> resources;
  std::vector<int> down_at_end, given_up_at_end;  // RunRecords'
  bool every_node_back = true;

  size_t played_faults() const;
  // Fail when failures() has any; else Incomplete when not_played() has
  // any; else Pass.
  Verdict verdict() const;
  bool ok() const { return verdict() == Verdict::Pass; }
  // Why the run failed, one line each ("2 requests lost", "fault 3 (link_cut
  // node-1) was not confirmed: ..."); faults never played are not among them.
  std::vector<std::string> failures() const;
  // The planned faults never played, one line each ("fault 5 (link_delay
  // node-1, at 12 s) was not played: the load ended at 8.6 s").
  std::vector<std::string> not_played() const;
  // The verdict's line: "PASS", "FAIL: ...", "INCOMPLETE: ...".
  std::string verdict_text() const;
};

// Classifies one request against its expected output (null: none known,
// which makes a delivered response wrong). `why` gets the reason in words
// for anything but Correct.
Outcome classify(const RequestRecord& q, const Expected* expected, std::string* why = nullptr);

ChaosReport check(const RunRecords& r);

}  // namespace troupe::chaos
