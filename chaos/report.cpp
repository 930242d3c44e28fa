#include "chaos/report.h"

#include <spdlog/fmt/fmt.h>

#include <cmath>

namespace troupe::chaos {

namespace {

constexpr size_t kMaxNotPlayedShown = 12;

std::string shorten(const std::string& s, size_t max = 60) {
  if (s.size() <= max) return s;
  return s.substr(0, max - 3) + "...";
}

std::string message_text(const std::string& m) {
  return m.empty() ? std::string("(no message)") : fmt::format("\"{}\"", shorten(m));
}

std::string ids_text(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s.empty() ? std::string("(none)") : s;
}

std::string q_text(const Quantiles& q) {
  if (q.count == 0) return "-";
  return fmt::format("{:.3f}/{:.3f}", q.p50, q.p99);
}

std::string seconds(double s) {
  return s < 0 ? std::string("-") : fmt::format("{:.2f} s", s);
}

std::string since(double t, double from) {
  return t < 0 || from < 0 ? std::string("-") : seconds(t - from);
}

nlohmann::json time_json(double t) {
  return t < 0 ? nlohmann::json(nullptr) : nlohmann::json(t);
}

nlohmann::json q_json(const Quantiles& q) {
  nlohmann::json j;
  j["count"] = q.count;
  j["p50"] = q.count ? nlohmann::json(q.p50) : nlohmann::json(nullptr);
  j["p99"] = q.count ? nlohmann::json(q.p99) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json opt_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json phase_json(const PhaseLatency& p) {
  return {{"requests", p.requests},
          {"ttft", q_json(p.ttft)},
          {"tpot", q_json(p.tpot)},
          {"e2e", q_json(p.e2e)}};
}

nlohmann::json sample_json(const ResourceSample& s) {
  return {{"pid", s.pid},
          {"rss_mib", s.rss_mib},
          {"open_fds", s.open_fds},
          {"threads", s.threads},
          {"kv_blocks_used",
           s.kv_blocks_used < 0 ? nlohmann::json(nullptr) : nlohmann::json(s.kv_blocks_used)}};
}

std::string status_summary(const std::vector<StatusGroup>& groups) {
  std::string s;
  for (const StatusGroup& g : groups) {
    if (!s.empty()) s += "; ";
    s += fmt::format("{}: {}", g.status, g.count);
    if (g.messages.size() == 1 && g.other_messages == 0) {
      s += fmt::format(" {}", message_text(g.messages[0].message));
      continue;
    }
    for (size_t i = 0; i < g.messages.size(); ++i)
      s += fmt::format("{} {} x{}", i == 0 ? "" : ",", message_text(g.messages[i].message),
                       g.messages[i].count);
    if (g.other_messages > 0) s += fmt::format(", {} with other messages", g.other_messages);
  }
  return s;
}

}  // namespace

std::string render_text(const ChaosReport& r) {
  std::string out;
  const Counts& c = r.counts;
  const size_t played = r.played_faults();
  out += fmt::format("troupe chaos: {} requests in {:.1f} s, ", c.requests, r.load_s);
  if (played == r.faults.size()) {
    out += fmt::format("{} fault{}\n", r.faults.size(), r.faults.size() == 1 ? "" : "s");
  } else {
    out += fmt::format("{} of {} planned faults played ({} not played)\n", played, r.faults.size(),
                       r.faults.size() - played);
  }
  out += fmt::format("  correct {}   cancelled as asked {}   failed with a status {}", c.correct,
                     c.cancelled, c.failed_status);
  if (!r.failed_by_status.empty()) out += " (" + status_summary(r.failed_by_status) + ")";
  out += "\n";
  out += fmt::format("  lost {}   hung {}   broken {}   duplicated {}", c.lost, c.hung, c.broken,
                     c.duplicated);
  if (c.duplicated_tokens > 0) out += fmt::format(" ({} tokens repeated)", c.duplicated_tokens);
  out += fmt::format("   wrong {}\n", c.wrong);
  for (const FatalExample& x : r.examples) {
    out += fmt::format("  {} #{}: {}\n", outcome_name(x.outcome), x.index, x.what);
    if (x.outcome == Outcome::Duplicated || x.outcome == Outcome::Wrong)
      out += fmt::format("      from {}: expected {}   received {}\n", x.window_start,
                         ids_text(x.expected_ids), ids_text(x.received_ids));
  }

  out += fmt::format("{:<23}{:<16}{:<16}{}\n", "latency (p50 / p99)", "before", "during", "after");
  const PhaseLatency* ph[3] = {&r.latency.before, &r.latency.during, &r.latency.after};
  out += fmt::format("  {:<21}{:<16}{:<16}{}\n", "requests", ph[0]->requests, ph[1]->requests,
                     ph[2]->requests);
  for (const auto& [name, field] : {std::pair{"ttft", &PhaseLatency::ttft},
                                    {"tpot", &PhaseLatency::tpot},
                                    {"e2e", &PhaseLatency::e2e}})
    out += fmt::format("  {:<21}{:<16}{:<16}{}\n", name, q_text(ph[0]->*field),
                       q_text(ph[1]->*field), q_text(ph[2]->*field));

  const Throughput& t = r.throughput;
  const auto rate = [](const PhaseRate& p) {
    if (!p.tokens_per_s) return std::string("-");
    std::string s = fmt::format("{:.0f} tok/s", *p.tokens_per_s);
    if (p.fraction) s += fmt::format(" ({:.2f}x)", *p.fraction);
    return s + fmt::format(" over {:.1f} s", p.window_s);
  };
  out += "throughput: ";
  out += t.baseline_tokens_per_s > 0 ? fmt::format("fault-free {:.0f} tok/s ({})",
                                                   t.baseline_tokens_per_s, t.baseline_basis)
                                     : std::string("no baseline");
  out += "; before faults " + rate(t.before);
  out += "; during " + rate(t.during);
  out += "; after " + rate(t.after) + "\n";
  out += fmt::format(
      "  phases, clipped to the load (0-{:.1f} s): before = until the first fault took effect; "
      "during = within a fault's window\n"
      "  (from its injection until its effect ended and capacity was back, or to the end of the "
      "load when it never came back); after = outside every window from then on\n"
      "  (between faults and after the last); a fault refused, unconfirmed or not played opens "
      "no window\n",
      r.load_s);

  if (!r.faults.empty()) {
    out += fmt::format("{:<31}{:<12}{:<12}{:<20}{}\n", "faults", "confirmed", "detection", "resume",
                       "capacity back");
    size_t skipped_shown = 0, skipped_hidden = 0;
    for (const FaultReport& f : r.faults) {
      const FaultRecord& rec = f.record;
      const std::string name = shorten(fmt::format("{} {} {}", f.number, rec.kind, rec.target), 28);
      if (!f.played()) {
        // A long plan cut short lists its first few.
        if (skipped_shown >= kMaxNotPlayedShown) {
          ++skipped_hidden;
          continue;
        }
        ++skipped_shown;
        out += fmt::format("  {:<29}{}\n", name, "not played");
        out +=
            fmt::format("      {}{}\n",
                        rec.planned_s >= 0 ? fmt::format("planned at {:.1f} s; ", rec.planned_s)
                                           : std::string(),
                        rec.not_played.empty() ? std::string("no reason given") : rec.not_played);
        continue;
      }
      std::string resume = f.resume_max_s < 0 ? std::string("-")
                                              : fmt::format("{} ({} req)", seconds(f.resume_max_s),
                                                            f.resumed_late.size());
      out += fmt::format("  {:<29}{:<12}{:<12}{:<20}{}\n", name, f.confirmed() ? "yes" : "NO",
                         since(rec.detected_s, rec.injected_s), resume,
                         since(rec.recovered_s, rec.injected_s));
      if (!f.confirmed())
        out += fmt::format("      {}: {}\n",
                           rec.confirmed_s < 0 ? "not confirmed" : "confirmed with an error",
                           rec.error.empty() ? std::string("no reason given") : rec.error);
      else if (!rec.confirmation.empty())
        out += "      " + rec.confirmation + "\n";
    }
    if (skipped_hidden > 0)
      out += fmt::format("  ... and {} more not played (all in --json)\n", skipped_hidden);
    out += fmt::format("{:<23}{:<7}{:<11}{:<20}{:<17}{}\n", "by kind (p50/p99 s)", "count",
                       "confirmed", "detection", "resume", "capacity back");
    for (const FaultKindReport& k : r.fault_kinds) {
      out +=
          fmt::format("  {:<21}{:<7}{:<11}{:<20}{:<17}{}", shorten(k.kind, 20), k.count,
                      k.confirmed, q_text(k.detection), q_text(k.resume), q_text(k.capacity_back));
      if (k.not_played > 0) out += fmt::format("   +{} not played", k.not_played);
      out += "\n";
    }
  }

  if (!r.resources.empty()) {
    out += "resources (start -> end)\n";
    for (const ResourceDelta& d : r.resources) {
      const auto v = [](bool have, auto x) {
        return have ? fmt::format("{}", x) : std::string("?");
      };
      // "a -> b" and, when both are known and differ, the change.
      const auto span = [&](bool have_a, long a, bool have_b, long b, const char* unit = "") {
        std::string s = v(have_a, a) + " -> " + v(have_b, b) + unit;
        if (have_a && have_b && a != b) s += fmt::format(" ({:+})", b - a);
        return s;
      };
      const bool both = d.at_start && d.at_end;
      std::string pid = both && d.start.pid == d.end.pid
                            ? fmt::format("pid {}", d.start.pid)
                            : "pid " + v(d.at_start, d.start.pid) + " -> " + v(d.at_end, d.end.pid);
      out += fmt::format("  {} {}   rss {}   fds {}   threads {}", d.process, pid,
                         span(d.at_start, std::lround(d.start.rss_mib), d.at_end,
                              std::lround(d.end.rss_mib), " MiB"),
                         span(d.at_start, d.start.open_fds, d.at_end, d.end.open_fds),
                         span(d.at_start, d.start.threads, d.at_end, d.end.threads));
      const bool kv_a = d.at_start && d.start.kv_blocks_used >= 0;
      const bool kv_b = d.at_end && d.end.kv_blocks_used >= 0;
      if (kv_a || kv_b)
        out += "   kv blocks " + span(kv_a, d.start.kv_blocks_used, kv_b, d.end.kv_blocks_used);
      out += "\n";
    }
  }

  if (!r.given_up_at_end.empty())
    out += "capacity at the end: " + capacity_text(r.given_up_at_end) +
           " given up on by supervision (its restart limit)\n";
  if (!r.down_at_end.empty() && !r.every_node_back)
    out += "capacity at the end: " + capacity_text(r.down_at_end) +
           " down, waiting for a node the plan stopped for good\n";
  out += "verdict: " + r.verdict_text() + "\n";
  return out;
}

nlohmann::json render_json(const ChaosReport& r) {
  nlohmann::json j;
  const Counts& c = r.counts;
  j["requests"] = c.requests;
  j["duration_s"] = r.duration_s;
  j["load_s"] = r.load_s;
  j["faults_planned"] = r.faults.size();
  j["faults_played"] = r.played_faults();
  j["counts"] = {{"requests", c.requests},
                 {"correct", c.correct},
                 {"cancelled_as_asked", c.cancelled},
                 {"failed_with_status", c.failed_status},
                 {"lost", c.lost},
                 {"hung", c.hung},
                 {"broken", c.broken},
                 {"duplicated", c.duplicated},
                 {"duplicated_tokens", c.duplicated_tokens},
                 {"wrong", c.wrong}};

  j["failed_by_status"] = nlohmann::json::array();
  for (const StatusGroup& g : r.failed_by_status) {
    nlohmann::json msgs = nlohmann::json::array();
    for (const MessageCount& m : g.messages)
      msgs.push_back({{"message", m.message}, {"count", m.count}, {"examples", m.examples}});
    j["failed_by_status"].push_back({{"status", g.status},
                                     {"count", g.count},
                                     {"messages", msgs},
                                     {"other_messages", g.other_messages}});
  }

  j["examples"] = nlohmann::json::array();
  for (const FatalExample& x : r.examples)
    j["examples"].push_back({{"outcome", outcome_name(x.outcome)},
                             {"index", x.index},
                             {"what", x.what},
                             {"expected_count", x.expected_count},
                             {"received_count", x.received_count},
                             {"diverges_at", x.diverges_at},
                             {"window_start", x.window_start},
                             {"expected_ids", x.expected_ids},
                             {"received_ids", x.received_ids},
                             {"error", x.error}});

  j["first_fault_s"] = time_json(r.first_fault_s);
  j["latency"] = {{"before", phase_json(r.latency.before)},
                  {"during", phase_json(r.latency.during)},
                  {"after", phase_json(r.latency.after)}};

  const Throughput& t = r.throughput;
  const auto phase = [](const PhaseRate& p) {
    return nlohmann::json{{"window_s", p.window_s},
                          {"tokens_per_s", opt_json(p.tokens_per_s)},
                          {"fraction_of_baseline", opt_json(p.fraction)}};
  };
  j["throughput"] = {{"baseline_tokens_per_s", t.baseline_tokens_per_s},
                     {"baseline_basis", t.baseline_basis},
                     {"bin_s", 1.0},
                     {"bins", t.bins},
                     {"before_faults", phase(t.before)},
                     {"during_faults", phase(t.during)},
                     {"after_faults", phase(t.after)}};
  j["phases"] = {
      {"clipped_to_s", r.load_s},
      {"before", "until the first fault took effect"},
      {"during",
       "within a window of a fault that took effect: from its injection until its effect ended "
       "and capacity was back, or to the end of the load when it never came back"},
      {"after",
       "outside every window once the first fault took effect (between faults and after "
       "the last)"}};

  j["median_token_gap_s"] = r.median_token_gap_s;
  j["resume_threshold_s"] = r.resume_threshold_s;
  j["faults"] = nlohmann::json::array();
  for (const FaultReport& f : r.faults) {
    const FaultRecord& rec = f.record;
    nlohmann::json late = nlohmann::json::array();
    for (const ResumeDelay& d : f.resumed_late)
      late.push_back({{"index", d.index == SIZE_MAX ? nlohmann::json() : nlohmann::json(d.index)},
                      {"delay_s", d.delay_s}});
    j["faults"].push_back({{"number", f.number},
                           {"kind", rec.kind},
                           {"target", rec.target},
                           {"played", f.played()},
                           {"not_played", rec.not_played},
                           {"planned_s", time_json(rec.planned_s)},
                           {"injected_s", time_json(rec.injected_s)},
                           {"duration_s", rec.duration_s},
                           {"confirmed_s", time_json(rec.confirmed_s)},
                           {"confirmation", rec.confirmation},
                           {"error", rec.error},
                           {"detected_s", time_json(rec.detected_s)},
                           {"recovered_s", time_json(rec.recovered_s)},
                           {"window_start_s", time_json(f.window_start_s)},
                           {"window_end_s", time_json(f.window_end_s)},
                           {"confirmed", f.confirmed()},
                           {"resume",
                            {{"late_streams", f.resumed_late.size()},
                             {"max_s", time_json(f.resume_max_s)},
                             {"streams", late}}}});
  }
  j["fault_kinds"] = nlohmann::json::array();
  for (const FaultKindReport& k : r.fault_kinds)
    j["fault_kinds"].push_back({{"kind", k.kind},
                                {"count", k.count},
                                {"confirmed", k.confirmed},
                                {"not_played", k.not_played},
                                {"detection_s", q_json(k.detection)},
                                {"resume_s", q_json(k.resume)},
                                {"capacity_back_s", q_json(k.capacity_back)}});

  j["resources"] = nlohmann::json::array();
  for (const ResourceDelta& d : r.resources) {
    nlohmann::json e = {{"process", d.process},
                        {"start", d.at_start ? sample_json(d.start) : nlohmann::json(nullptr)},
                        {"end", d.at_end ? sample_json(d.end) : nlohmann::json(nullptr)}};
    if (d.at_start && d.at_end) {
      nlohmann::json delta = {{"rss_mib", d.end.rss_mib - d.start.rss_mib},
                              {"open_fds", d.end.open_fds - d.start.open_fds},
                              {"threads", d.end.threads - d.start.threads}};
      delta["kv_blocks_used"] = d.start.kv_blocks_used >= 0 && d.end.kv_blocks_used >= 0
                                    ? nlohmann::json(d.end.kv_blocks_used - d.start.kv_blocks_used)
                                    : nlohmann::json(nullptr);
      delta["restarted"] = d.start.pid != d.end.pid;
      e["delta"] = delta;
    }
    j["resources"].push_back(std::move(e));
  }

  j["ok"] = r.ok();
  j["verdict"] = verdict_name(r.verdict());
  j["failures"] = r.failures();
  j["not_played"] = r.not_played();
  j["capacity_at_end"] = {{"down", r.down_at_end},
                          {"given_up", r.given_up_at_end},
                          {"every_node_back", r.every_node_back}};
  return j;
}

}  // namespace troupe::chaos
