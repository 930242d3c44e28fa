#include "chaos/checker.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <utility>

namespace troupe::chaos {

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Correct:
      return "correct";
    case Outcome::Cancelled:
      return "cancelled";
    case Outcome::FailedStatus:
      return "failed_status";
    case Outcome::Lost:
      return "lost";
    case Outcome::Hung:
      return "hung";
    case Outcome::Broken:
      return "broken";
    case Outcome::Duplicated:
      return "duplicated";
    case Outcome::Wrong:
      return "wrong";
  }
  return "?";
}

bool is_fatal(Outcome o) {
  return o == Outcome::Lost || o == Outcome::Hung || o == Outcome::Broken ||
         o == Outcome::Duplicated || o == Outcome::Wrong;
}

// ---- repeats ----

namespace {

// lcp[L] = the longest common prefix of received[i - L, n) and received[i,
// n), for L in [1, lmax]: a Z-function over received[i, n), a separator
// and received[i - lmax, n).
std::vector<size_t> lcps_before(const std::vector<int>& received, size_t i, size_t lmax) {
  const size_t n = received.size(), head = n - i;
  std::vector<int64_t> u;
  u.reserve(head + 1 + lmax + head);
  for (size_t t = i; t < n; ++t) u.push_back(received[t]);
  u.push_back(std::numeric_limits<int64_t>::min());  // no id equals it
  for (size_t t = i - lmax; t < n; ++t) u.push_back(received[t]);
  std::vector<size_t> z(u.size(), 0);
  for (size_t k = 1, l = 0, r = 0; k < u.size(); ++k) {
    if (k < r) z[k] = std::min(r - k, z[k - l]);
    while (k + z[k] < u.size() && u[z[k]] == u[k + z[k]]) ++z[k];
    if (k + z[k] > r) l = k, r = k + z[k];
  }
  std::vector<size_t> lcp(lmax + 1, 0);
  for (size_t len = 1; len <= lmax; ++len) lcp[len] = z[head + 1 + (lmax - len)];
  return lcp;
}

// dst |= src << by, keeping bits [0, bits).
void shift_or(std::vector<uint64_t>& dst, const std::vector<uint64_t>& src, size_t by,
              size_t bits) {
  const size_t words = dst.size(), ws = by / 64, bs = by % 64;
  for (size_t w = words; w-- > ws;) {
    uint64_t v = src[w - ws] << bs;
    if (bs != 0 && w - ws >= 1) v |= src[w - ws - 1] >> (64 - bs);
    dst[w] |= v;
  }
  if (bits % 64 != 0) dst[words - 1] &= (uint64_t(1) << (bits % 64)) - 1;
}

}  // namespace

// States (i, k): received[0, i) reduces to expected[0, i - k) by deleting k
// tokens, each deleted run a copy of the run right before it in `received`.
// Every move raises i, so the states are swept by i, each i's reachable k
// as a bitset: matching a token keeps k, deleting a run of length L (where
// received[i - L, i) == received[i, i + L)) moves k to k + L.
RepeatMatch match_with_repeats(const std::vector<int>& expected, const std::vector<int>& received,
                               bool prefix_ok, size_t step_budget) {
  RepeatMatch out;
  const size_t n = received.size(), m = expected.size();
  if (!prefix_ok && n < m) return out;
  // The most tokens that may be deleted: all but the first (nothing precedes
  // it) for a prefix, exactly n - m otherwise.
  const size_t max_k = prefix_ok ? (n == 0 ? 0 : n - 1) : n - m;
  const size_t bits = max_k + 1, words = (bits + 63) / 64;
  if (double(n + 1) * double(words) > 4e6) {
    out.gave_up = true;
    return out;
  }
  std::vector<std::vector<uint64_t>> reach(n + 1, std::vector<uint64_t>(words, 0));
  reach[0][0] = 1;
  size_t steps = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<uint64_t>& here = reach[i];
    size_t min_k = bits;
    for (size_t w = 0; w < words && min_k == bits; ++w)
      if (here[w] != 0) min_k = w * 64 + size_t(__builtin_ctzll(here[w]));
    if (min_k == bits) continue;
    // Match received[i] with expected[i - k].
    for (size_t w = 0; w < words; ++w) {
      for (uint64_t b = here[w]; b != 0; b &= b - 1) {
        const size_t k = w * 64 + size_t(__builtin_ctzll(b)), j = i - k;
        if (j < m && received[i] == expected[j]) reach[i + 1][w] |= uint64_t(1) << (k % 64);
      }
    }
    steps += words;
    // Delete a run that repeats the one before it.
    const size_t lmax = std::min({i, n - i, max_k - min_k});
    if (lmax > 0) {
      const std::vector<size_t> lcp = lcps_before(received, i, lmax);
      steps += 2 * (n - i) + lmax;
      for (size_t len = 1; len <= lmax; ++len) {
        if (lcp[len] < len) continue;
        shift_or(reach[i + len], here, len, bits);
        steps += words;
      }
    }
    if (steps > step_budget) {
      out.gave_up = true;
      return out;
    }
  }
  const std::vector<uint64_t>& end = reach[n];
  for (size_t k = prefix_ok ? 0 : max_k; k <= max_k; ++k) {
    if (end[k / 64] >> (k % 64) & 1) {
      out.matched = true;
      out.extra = k;
      return out;
    }
  }
  return out;
}

// ---- quantiles ----

double percentile_nearest_rank(std::vector<double> samples, double p) {
  if (samples.empty()) throw std::invalid_argument("percentile of no samples");
  if (!(p > 0 && p <= 100)) throw std::invalid_argument("percentile must be in (0, 100]");
  std::sort(samples.begin(), samples.end());
  // p * n first: for integer p the product is exact, so 99% of 100 is rank 99.
  const double rank = std::ceil(p * double(samples.size()) / 100.0);
  const size_t k = std::clamp<size_t>(size_t(rank), 1, samples.size());
  return samples[k - 1];
}

Quantiles quantiles(const std::vector<double>& samples) {
  Quantiles q;
  q.count = samples.size();
  if (q.count == 0) return q;
  q.p50 = percentile_nearest_rank(samples, 50);
  q.p99 = percentile_nearest_rank(samples, 99);
  return q;
}

std::vector<LatencyWindow> latency_series(const std::vector<RequestRecord>& requests,
                                          double window_s) {
  if (!(window_s > 0)) throw std::invalid_argument("latency_series: window_s must be > 0");
  std::vector<std::vector<double>> e2e, ttft;
  for (const RequestRecord& q : requests) {
    if (q.end_s < 0 || q.sent_s < 0) continue;
    const size_t w = size_t(std::floor(q.end_s / window_s));
    if (w >= e2e.size()) e2e.resize(w + 1), ttft.resize(w + 1);
    e2e[w].push_back(q.end_s - q.sent_s);
    if (q.first_token_s >= 0) ttft[w].push_back(q.first_token_s - q.sent_s);
  }
  std::vector<LatencyWindow> out(e2e.size());
  for (size_t w = 0; w < e2e.size(); ++w) {
    out[w].start_s = double(w) * window_s;
    out[w].e2e = quantiles(e2e[w]);
    out[w].ttft = quantiles(ttft[w]);
  }
  return out;
}

// ---- classification ----

namespace {

struct Judgement {
  Outcome outcome = Outcome::Correct;
  std::string why;
  size_t extra = 0;        // duplicated tokens
  size_t diverges_at = 0;  // first position where received and expected differ
};

size_t first_difference(const std::vector<int>& a, const std::vector<int>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

std::string plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

bool is_prefix(const std::vector<int>& prefix, const std::vector<int>& of) {
  return prefix.size() <= of.size() && std::equal(prefix.begin(), prefix.end(), of.begin());
}

Judgement judge(const RequestRecord& q, const Expected* e) {
  Judgement v;
  const auto with_error = [&](std::string s) {
    if (!q.error.empty()) s += ": " + q.error;
    return s;
  };
  switch (q.transport) {
    case Transport::NoResponse:
      v.outcome = Outcome::Lost;
      v.why = with_error("no response");
      return v;
    case Transport::Stalled:
      v.outcome = Outcome::Hung;
      v.why = with_error("stalled after " + plural(q.tokens.size(), "token", "tokens") +
                         (e ? " of " + std::to_string(e->tokens.size()) : std::string()));
      return v;
    case Transport::Broken:
      v.outcome = Outcome::Broken;
      v.why = with_error("cut by the server after " + plural(q.tokens.size(), "token", "tokens") +
                         (e ? " of " + std::to_string(e->tokens.size()) : std::string()));
      return v;
    case Transport::CancelledByUs:
    case Transport::Complete:
      break;
  }
  const bool cancelled = q.transport == Transport::CancelledByUs;
  if (!cancelled) {
    if (q.status == 0) {
      v.outcome = Outcome::Lost;
      v.why = with_error("a complete exchange without a status");
      return v;
    }
    if (q.status != 200) {
      v.outcome = Outcome::FailedStatus;
      v.why = with_error("status " + std::to_string(q.status));
      return v;
    }
  }
  if (!e) {
    v.outcome = Outcome::Wrong;
    v.why = "no expected output for request " + std::to_string(q.index);
    return v;
  }
  const auto& want = e->tokens;
  const auto& got = q.tokens;
  v.diverges_at = first_difference(want, got);
  if (cancelled) {
    if (is_prefix(got, want)) {
      v.outcome = Outcome::Cancelled;
      v.why = "cancelled after " + std::to_string(got.size()) + " of " +
              plural(want.size(), "token", "tokens");
      return v;
    }
    const RepeatMatch rm = match_with_repeats(want, got, /*prefix_ok=*/true);
    if (rm.matched) {
      v.outcome = Outcome::Duplicated;
      v.extra = rm.extra;
      v.why = "cancelled after " + std::to_string(got.size()) +
              " tokens, a prefix of the expected " + std::to_string(want.size()) + " with " +
              std::to_string(rm.extra) + " repeated";
      return v;
    }
    v.outcome = Outcome::Wrong;
    v.why = "cancelled after " + std::to_string(got.size()) +
            " tokens, not a prefix of the expected " + std::to_string(want.size()) +
            "; first difference at " + std::to_string(v.diverges_at) +
            (rm.gave_up ? " (the repetition search gave up)" : "");
    return v;
  }
  if (got == want) {
    if (!q.finish_reason.empty() && !e->finish_reason.empty() &&
        q.finish_reason != e->finish_reason) {
      v.outcome = Outcome::Wrong;
      v.diverges_at = got.size();
      v.why = "the expected tokens, but finish_reason '" + q.finish_reason + "', expected '" +
              e->finish_reason + "'";
      return v;
    }
    v.outcome = Outcome::Correct;
    return v;
  }
  const RepeatMatch rm = match_with_repeats(want, got, /*prefix_ok=*/false);
  if (rm.matched) {
    v.outcome = Outcome::Duplicated;
    v.extra = rm.extra;
    v.why = "expected " + plural(want.size(), "token", "tokens") + ", received " +
            std::to_string(got.size()) + " (" + std::to_string(rm.extra) + " repeated)";
    return v;
  }
  v.outcome = Outcome::Wrong;
  v.why = "expected " + plural(want.size(), "token", "tokens") + ", received " +
          std::to_string(got.size()) + "; first difference at " + std::to_string(v.diverges_at) +
          (rm.gave_up ? " (the repetition search gave up)" : "");
  return v;
}

std::vector<int> window(const std::vector<int>& ids, size_t from) {
  if (from >= ids.size()) return {};
  const size_t to = std::min(ids.size(), from + kExampleIds);
  return {ids.begin() + std::ptrdiff_t(from), ids.begin() + std::ptrdiff_t(to)};
}

bool took_effect(const FaultRecord& f) {
  return f.injected_s >= 0 && f.confirmed_s >= 0 && f.error.empty();
}

// [start, end] of a fault's effect (unclipped).
// From the injection until its effect ended and capacity was back. A fault
// the deployment detected (a node or replica declared dead) whose capacity
// never came back lasts to the end of the load: what followed its
// confirmation was still under it, not after it.
std::pair<double, double> fault_window(const FaultRecord& f) {
  if (f.detected_s >= 0 && f.recovered_s < 0)
    return {f.injected_s, std::numeric_limits<double>::infinity()};
  const double end =
      std::max({f.injected_s + std::max(0.0, f.duration_s), f.confirmed_s, f.recovered_s});
  return {f.injected_s, end};
}

double request_end(const RequestRecord& q) {
  if (q.end_s >= 0) return q.end_s;
  if (!q.token_times.empty()) return q.token_times.back();
  return q.sent_s;
}

}  // namespace

Outcome classify(const RequestRecord& q, const Expected* expected, std::string* why) {
  Judgement v = judge(q, expected);
  if (why) *why = std::move(v.why);
  return v.outcome;
}

// ---- the whole run ----

ChaosReport check(const RunRecords& r) {
  ChaosReport rep;
  rep.duration_s = r.duration_s;
  rep.down_at_end = r.down_at_end;
  rep.given_up_at_end = r.given_up_at_end;
  rep.every_node_back = r.every_node_back;
  rep.counts.requests = r.requests.size();
  rep.outcomes.reserve(r.requests.size());

  // Requests, one outcome each.
  std::map<int, StatusGroup> by_status;
  std::map<int, std::map<std::string, MessageCount>> messages;
  std::map<Outcome, size_t> examples_of;
  for (const RequestRecord& q : r.requests) {
    const Expected* e = q.index < r.expected.size() ? &r.expected[q.index] : nullptr;
    Judgement v = judge(q, e);
    rep.outcomes.push_back(v.outcome);
    Counts& c = rep.counts;
    switch (v.outcome) {
      case Outcome::Correct:
        ++c.correct;
        break;
      case Outcome::Cancelled:
        ++c.cancelled;
        break;
      case Outcome::FailedStatus: {
        ++c.failed_status;
        StatusGroup& g = by_status[q.status];
        g.status = q.status;
        ++g.count;
        MessageCount& mc = messages[q.status][q.error];
        mc.message = q.error;
        ++mc.count;
        if (mc.examples.size() < kMaxMessageExamples) mc.examples.push_back(q.index);
        break;
      }
      case Outcome::Lost:
        ++c.lost;
        break;
      case Outcome::Hung:
        ++c.hung;
        break;
      case Outcome::Broken:
        ++c.broken;
        break;
      case Outcome::Duplicated:
        ++c.duplicated;
        c.duplicated_tokens += v.extra;
        break;
      case Outcome::Wrong:
        ++c.wrong;
        break;
    }
    if (is_fatal(v.outcome) && examples_of[v.outcome]++ < kMaxExamplesPerOutcome) {
      FatalExample x;
      x.outcome = v.outcome;
      x.index = q.index;
      x.what = std::move(v.why);
      x.received_count = q.tokens.size();
      x.error = q.error;
      if (e) {
        x.expected_count = e->tokens.size();
        x.diverges_at = first_difference(e->tokens, q.tokens);
        x.window_start = x.diverges_at > 3 ? x.diverges_at - 3 : 0;
        x.expected_ids = window(e->tokens, x.window_start);
      }
      x.received_ids = window(q.tokens, x.window_start);
      rep.examples.push_back(std::move(x));
    }
  }
  std::stable_sort(
      rep.examples.begin(), rep.examples.end(),
      [](const FatalExample& a, const FatalExample& b) { return a.outcome < b.outcome; });
  for (auto& [status, g] : by_status) {
    std::vector<MessageCount> all;
    for (auto& [msg, mc] : messages[status]) all.push_back(std::move(mc));
    std::stable_sort(all.begin(), all.end(), [](const MessageCount& a, const MessageCount& b) {
      return a.count > b.count;
    });
    for (auto& mc : all) {
      if (g.messages.size() < kMaxMessages) {
        g.messages.push_back(std::move(mc));
      } else {
        g.other_messages += mc.count;
      }
    }
    rep.failed_by_status.push_back(std::move(g));
  }

  // The load's span, and the windows of the faults that took effect in it.
  double last_event = -1;
  for (const RequestRecord& q : r.requests) {
    last_event = std::max(last_event, request_end(q));
    for (double t : q.token_times) last_event = std::max(last_event, t);
  }
  rep.load_s = r.load_end_s >= 0 ? r.load_end_s : std::max(r.duration_s, last_event);
  rep.load_s = std::max(rep.load_s, 0.0);
  std::vector<std::pair<double, double>> windows(r.faults.size(), {-1.0, -1.0});
  std::vector<std::pair<double, double>> effective;
  for (size_t n = 0; n < r.faults.size(); ++n) {
    const FaultRecord& f = r.faults[n];
    if (!took_effect(f) || f.injected_s >= rep.load_s) continue;
    const auto [a, b] = fault_window(f);
    windows[n] = {a, std::min(b, rep.load_s)};
    effective.push_back(windows[n]);
    if (rep.first_fault_s < 0 || a < rep.first_fault_s) rep.first_fault_s = a;
  }
  // Their union, in order.
  std::sort(effective.begin(), effective.end());
  std::vector<std::pair<double, double>> u;
  for (const auto& w : effective) {
    if (!u.empty() && w.first <= u.back().second) {
      u.back().second = std::max(u.back().second, w.second);
    } else {
      u.push_back(w);
    }
  }
  const auto in_window = [&](double t) {
    for (const auto& [a, b] : u)
      if (t >= a && t <= b) return true;
    return false;
  };
  const auto overlaps_window = [&](double from, double to) {
    for (const auto& [a, b] : u)
      if (from <= b && to >= a) return true;
    return false;
  };
  // 0 before, 1 during, 2 after (see Latency).
  const auto phase_of_token = [&](double t) {
    if (rep.first_fault_s < 0 || t < rep.first_fault_s) return 0;
    return in_window(t) ? 1 : 2;
  };

  // Latency, correct requests only.
  std::vector<double> ttft[3], tpot[3], e2e[3];
  size_t in_phase[3] = {0, 0, 0};
  for (size_t i = 0; i < r.requests.size(); ++i) {
    if (rep.outcomes[i] != Outcome::Correct) continue;
    const RequestRecord& q = r.requests[i];
    const double end = request_end(q);
    int phase = 2;
    if (rep.first_fault_s < 0 || end < rep.first_fault_s) {
      phase = 0;
    } else if (overlaps_window(q.sent_s, end)) {
      phase = 1;
    }
    ++in_phase[phase];
    if (q.first_token_s >= 0 && q.sent_s >= 0) ttft[phase].push_back(q.first_token_s - q.sent_s);
    if (q.stream && q.token_times.size() >= 2)
      tpot[phase].push_back((q.token_times.back() - q.token_times.front()) /
                            double(q.token_times.size() - 1));
    if (q.end_s >= 0 && q.sent_s >= 0) e2e[phase].push_back(q.end_s - q.sent_s);
  }
  PhaseLatency* phases[3] = {&rep.latency.before, &rep.latency.during, &rep.latency.after};
  for (int p = 0; p < 3; ++p) {
    phases[p]->requests = in_phase[p];
    phases[p]->ttft = quantiles(ttft[p]);
    phases[p]->tpot = quantiles(tpot[p]);
    phases[p]->e2e = quantiles(e2e[p]);
  }

  // Throughput: 1-second bins, and the rate in each phase.
  Throughput& tp = rep.throughput;
  tp.baseline_tokens_per_s = r.baseline_tokens_per_s;
  tp.baseline_basis = r.baseline_basis;
  double last_token = -1;
  for (const RequestRecord& q : r.requests)
    for (double t : q.token_times) last_token = std::max(last_token, t);
  const double bins_end = std::max(rep.load_s, last_token);
  if (bins_end > 0 || last_token >= 0) {
    const size_t nbins = std::max<size_t>(size_t(std::ceil(rep.load_s)),
                                          last_token >= 0 ? size_t(std::floor(last_token)) + 1 : 0);
    tp.bins.assign(nbins, 0.0);
    for (const RequestRecord& q : r.requests)
      for (double t : q.token_times)
        if (t >= 0) tp.bins[std::min(nbins - 1, size_t(std::floor(t)))] += 1;
  }
  {
    double union_s = 0;
    for (const auto& [a, b] : u) union_s += b - a;
    PhaseRate* rates[3] = {&tp.before, &tp.during, &tp.after};
    if (rep.first_fault_s < 0) {
      tp.before.window_s = rep.load_s;
    } else {
      tp.before.window_s = rep.first_fault_s;
      tp.during.window_s = union_s;
      tp.after.window_s = std::max(0.0, rep.load_s - rep.first_fault_s - union_s);
    }
    size_t tokens[3] = {0, 0, 0};
    for (const RequestRecord& q : r.requests)
      for (double t : q.token_times)
        if (t >= 0) ++tokens[phase_of_token(t)];
    for (int p = 0; p < 3; ++p) {
      PhaseRate& pr = *rates[p];
      // A phase shorter than a millisecond has no meaningful rate.
      if (pr.window_s < 1e-3) continue;
      pr.tokens_per_s = double(tokens[p]) / pr.window_s;
      if (tp.baseline_tokens_per_s > 0) pr.fraction = *pr.tokens_per_s / tp.baseline_tokens_per_s;
    }
  }

  // Resume: the median inter-token gap of every stream sets what counts as late.
  std::vector<double> gaps;
  for (const RequestRecord& q : r.requests) {
    if (!q.stream) continue;
    for (size_t i = 1; i < q.token_times.size(); ++i)
      gaps.push_back(q.token_times[i] - q.token_times[i - 1]);
  }
  rep.median_token_gap_s = gaps.empty() ? 0.0 : percentile_nearest_rank(std::move(gaps), 50);
  rep.resume_threshold_s = std::max(0.25, 5 * rep.median_token_gap_s);

  std::vector<std::string> kind_order;
  std::map<std::string, FaultKindReport> kinds;
  std::map<std::string, std::vector<double>> detection, resume, capacity_back;
  for (size_t n = 0; n < r.faults.size(); ++n) {
    const FaultRecord& f = r.faults[n];
    FaultReport fr;
    fr.number = n;
    fr.record = f;
    fr.window_start_s = windows[n].first;
    fr.window_end_s = windows[n].second;
    if (!kinds.count(f.kind)) kind_order.push_back(f.kind);
    FaultKindReport& k = kinds[f.kind];
    k.kind = f.kind;
    if (!fr.played()) {
      ++k.not_played;
      rep.faults.push_back(std::move(fr));
      continue;
    }
    if (!f.resumed_s.empty()) {
      // The coordinator saw which requests the fault orphaned: each one's
      // next token, however soon it came.
      for (double t : f.resumed_s) {
        const double delay = t - f.injected_s;
        fr.resumed_late.push_back({SIZE_MAX, delay});
        fr.resume_max_s = std::max(fr.resume_max_s, delay);
        resume[f.kind].push_back(delay);
      }
    } else {
      for (const RequestRecord& q : r.requests) {
        if (!q.stream || q.sent_s < 0 || q.sent_s >= f.injected_s) continue;
        if (q.end_s >= 0 && q.end_s < f.injected_s) continue;
        const auto next =
            std::upper_bound(q.token_times.begin(), q.token_times.end(), f.injected_s);
        if (next == q.token_times.end()) continue;
        const double delay = *next - f.injected_s;
        if (delay > rep.resume_threshold_s) {
          fr.resumed_late.push_back({q.index, delay});
          fr.resume_max_s = std::max(fr.resume_max_s, delay);
          resume[f.kind].push_back(delay);
        }
      }
    }
    ++k.count;
    if (fr.confirmed()) ++k.confirmed;
    if (f.detected_s >= 0) detection[f.kind].push_back(f.detected_s - f.injected_s);
    if (f.recovered_s >= 0) capacity_back[f.kind].push_back(f.recovered_s - f.injected_s);
    rep.faults.push_back(std::move(fr));
  }
  for (const std::string& name : kind_order) {
    FaultKindReport k = std::move(kinds[name]);
    k.detection = quantiles(detection[name]);
    k.resume = quantiles(resume[name]);
    k.capacity_back = quantiles(capacity_back[name]);
    rep.fault_kinds.push_back(std::move(k));
  }

  // Resources, matched by process name.
  for (const ResourceSample& s : r.resources_start) {
    ResourceDelta d;
    d.process = s.process;
    d.at_start = true;
    d.start = s;
    rep.resources.push_back(std::move(d));
  }
  for (const ResourceSample& s : r.resources_end) {
    auto it = std::find_if(rep.resources.begin(), rep.resources.end(), [&](const ResourceDelta& d) {
      return d.process == s.process && !d.at_end;
    });
    if (it == rep.resources.end()) {
      ResourceDelta d;
      d.process = s.process;
      rep.resources.push_back(std::move(d));
      it = std::prev(rep.resources.end());
    }
    it->at_end = true;
    it->end = s;
  }
  return rep;
}

// ---- verdict ----

std::string capacity_text(const std::vector<int>& replicas) {
  std::string s = replicas.size() == 1 ? "replica" : "replicas";
  for (size_t i = 0; i < replicas.size(); ++i)
    s += (i == 0 ? " " : ", ") + std::to_string(replicas[i]);
  return s;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass:
      return "PASS";
    case Verdict::Fail:
      return "FAIL";
    case Verdict::Incomplete:
      return "INCOMPLETE";
  }
  return "?";
}

size_t ChaosReport::played_faults() const {
  size_t n = 0;
  for (const FaultReport& f : faults) n += f.played() ? 1 : 0;
  return n;
}

Verdict ChaosReport::verdict() const {
  if (!failures().empty()) return Verdict::Fail;
  if (played_faults() < faults.size()) return Verdict::Incomplete;
  return Verdict::Pass;
}

namespace {

std::string fault_name(const FaultReport& f) {
  const FaultRecord& r = f.record;
  return "fault " + std::to_string(f.number) + " (" + r.kind +
         (r.target.empty() ? "" : " " + r.target) + ")";
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", s);
  return text;
}

}  // namespace

std::vector<std::string> ChaosReport::failures() const {
  std::vector<std::string> out;
  const auto add = [&](size_t n, const char* what) {
    if (n > 0) out.push_back(plural(n, "request", "requests") + " " + what);
  };
  add(counts.lost, "lost");
  add(counts.hung, "hung");
  add(counts.broken, "broken");
  if (counts.duplicated > 0)
    out.push_back(plural(counts.duplicated, "request", "requests") + " duplicated (" +
                  plural(counts.duplicated_tokens, "token", "tokens") + " repeated)");
  add(counts.wrong, "wrong");
  // Every node is back and supervision kept trying, yet a replica never
  // served again: capacity a transient fault took for good.
  if (!down_at_end.empty() && every_node_back)
    out.push_back(capacity_text(down_at_end) +
                  " still down at the end, though every node was back and supervision had not "
                  "given up on it: capacity lost to a passing fault");
  for (const FaultReport& f : faults) {
    if (!f.played() || f.confirmed()) continue;
    const FaultRecord& r = f.record;
    std::string s = fault_name(f) + " ";
    if (r.confirmed_s < 0) {
      s += "was not confirmed";
    } else {
      s += "reported an error";
    }
    s += ": " + (r.error.empty() ? std::string("no reason given") : r.error);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> ChaosReport::not_played() const {
  std::vector<std::string> out;
  for (const FaultReport& f : faults) {
    if (f.played()) continue;
    const FaultRecord& r = f.record;
    std::string s = fault_name(f);
    if (r.planned_s >= 0) s.insert(s.size() - 1, ", at " + seconds_text(r.planned_s) + " s");
    s += " was not played: " +
         (r.not_played.empty() ? std::string("no reason given") : r.not_played);
    out.push_back(std::move(s));
  }
  return out;
}

std::string ChaosReport::verdict_text() const {
  const Verdict v = verdict();
  std::string out = verdict_name(v);
  const std::vector<std::string> fail = failures();
  const std::vector<std::string> skipped = not_played();
  if (v == Verdict::Pass) return out;
  out += ": ";
  std::string why;
  for (const std::string& f : fail) why += (why.empty() ? "" : "; ") + f;
  if (!skipped.empty()) {
    // One line for all: the load ended before them (usually).
    std::string s = std::to_string(skipped.size()) + " of " + std::to_string(faults.size()) +
                    " planned faults " + (skipped.size() == 1 ? "was" : "were") + " not played";
    std::string reason;
    bool same = true;
    for (const FaultReport& f : faults)
      if (!f.played()) {
        if (reason.empty()) reason = f.record.not_played;
        same = same && f.record.not_played == reason;
      }
    if (same && !reason.empty()) s += " (" + reason + ")";
    if (v == Verdict::Incomplete)
      s += ": the run did not exercise its plan (a longer load, --duration, or more requests "
           "would reach them)";
    why += (why.empty() ? "" : "; ") + s;
  }
  return out + why;
}

}  // namespace troupe::chaos
