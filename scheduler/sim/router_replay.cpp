#include "scheduler/sim/router_replay.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "scheduler/request_table.h"

namespace troupe::sim {

namespace {

using nlohmann::json;

struct Decision {
  bool stop = false;  // a cancellation sent to the replica, else a placement
  int replica = 0;
  uint64_t id = 0;
  bool operator==(const Decision&) const = default;
  std::string text() const {
    return std::string(stop ? "stop" : "assign") + " request " + std::to_string(id) +
           " on replica " + std::to_string(replica);
  }
};

class RecordingChannel : public ReplicaChannel {
 public:
  void assign(int replica, Assignment a) override { made.push_back({false, replica, a.id}); }
  void cancel(int replica, uint64_t id) override { made.push_back({true, replica, id}); }
  std::vector<Decision> made;
};

class NullSink : public CompletionSink {
 public:
  void on_token(int, const TokenLogprobs*) override {}
  void on_done(FinishReason, int, int, int) override {}
  void on_error(const ServiceError&) override {}
};

RequestTableOptions table_options(const json& j) {
  RequestTableOptions o;
  o.replicas = j.at("replicas").get<int>();
  o.max_seq_len = j.at("max_seq_len").get<int>();
  o.max_batch_sequences = j.at("max_batch_sequences").get<int>();
  o.max_waiting_per_replica = j.at("max_waiting_per_replica").get<int>();
  const json& a = j.at("admission");
  o.admission.max_size = a.at("max_size").get<size_t>();
  o.admission.priority_levels = a.at("priority_levels").get<size_t>();
  o.admission.max_wait_s = a.at("max_wait_s").get<double>();
  o.admission.on_timeout = a.at("keep").get<bool>() ? TimeoutAction::Keep : TimeoutAction::Reject;
  o.admission.rate_window_s = a.at("rate_window_s").get<double>();
  o.admission.min_retry_after_s = a.at("min_retry_after_s").get<double>();
  o.admission.max_retry_after_s = a.at("max_retry_after_s").get<double>();
  return o;
}

// A log written before the constants were configurable has none: they
// were the defaults.
LatencyAwareOptions latency_options(const json& j) {
  LatencyAwareOptions o;
  const auto it = j.find("latency_aware");
  if (it == j.end()) return o;
  const json& l = *it;
  o.ema_alpha = l.at("ema_alpha").get<double>();
  o.prior_step_s = l.at("prior_step_s").get<double>();
  o.prior_prefill_tokens_per_s = l.at("prior_prefill_tokens_per_s").get<double>();
  o.batch_cost_per_seq = l.at("batch_cost_per_seq").get<double>();
  o.stale_after_s = l.at("stale_after_s").get<double>();
  o.forget_tau_s = l.at("forget_tau_s").get<double>();
  o.probe_interval_s = l.at("probe_interval_s").get<double>();
  o.probe_every_requests = l.at("probe_every_requests").get<size_t>();
  return o;
}

StepEvents step_events(const json& j) {
  StepEvents ev;
  ev.replica = j.at("replica").get<int>();
  ev.step_s = j.at("step_s").get<double>();
  ev.batch_sequences = j.at("batch_sequences").get<int>();
  ev.batch_tokens = j.at("batch_tokens").get<int>();
  ev.prefill_tokens = j.at("prefill_tokens").get<int>();
  ev.running = j.at("running").get<int>();
  ev.queued_tokens = j.at("queued_tokens").get<int>();
  for (const json& t : j.at("tokens"))
    ev.tokens.push_back({t.at(0).get<uint64_t>(), t.at(1).get<int>(), 0});
  for (const json& d : j.at("done"))
    ev.done.push_back(
        {d.at(0).get<uint64_t>(), FinishReason(d.at(1).get<int>()), d.at(2).get<int>()});
  return ev;
}

// Replays one call into the table.
void call(RequestTable& table, const std::string& op, const json& j) {
  const double now = j.at("now").get<double>();
  if (op == "submit") {
    CompletionRequest r;
    r.id = j.at("id").get<uint64_t>();
    // The tokens, when the policy read them; else only their number matters.
    if (const auto t = j.find("tokens"); t != j.end())
      r.prompt = t->get<std::vector<int>>();
    else
      r.prompt.assign(j.at("prompt").get<size_t>(), 3);
    r.max_tokens = j.at("max_tokens").get<int>();
    r.priority = j.at("priority").get<int>();
    r.timeout_s = j.at("timeout_s").get<double>();
    table.submit(std::move(r), std::make_shared<NullSink>(), now);
  } else if (op == "cancel") {
    table.cancel(j.at("id").get<uint64_t>(), now);
  } else if (op == "events") {
    table.on_events(step_events(j), now);
  } else if (op == "up") {
    table.replica_up(j.at("replica").get<int>(), now);
  } else if (op == "down") {
    table.replica_down(j.at("replica").get<int>(), j.at("permanent").get<bool>(), now);
  } else if (op == "tick") {
    table.tick(now);
  } else {
    throw std::invalid_argument("unknown operation '" + op + "'");
  }
}

}  // namespace

ReplayResult replay_router_log(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::invalid_argument("cannot read the router log " + file.string());
  ReplayResult res;
  RecordingChannel channel;
  std::unique_ptr<RequestTable> table;
  std::vector<Decision> expected;
  size_t call_line = 0;
  // The decisions logged after a call are the ones that call made.
  const auto compare = [&] {
    res.recorded += expected.size();
    res.replayed += channel.made.size();
    const size_t n = std::max(expected.size(), channel.made.size());
    for (size_t i = 0; i < n; ++i) {
      const bool same =
          i < expected.size() && i < channel.made.size() && expected[i] == channel.made[i];
      if (same) continue;
      ++res.mismatches;
      if (res.first_mismatch.empty())
        res.first_mismatch = "after the call on line " + std::to_string(call_line) + ": recorded " +
                             (i < expected.size() ? expected[i].text() : "nothing") +
                             ", replayed " +
                             (i < channel.made.size() ? channel.made[i].text() : "nothing");
    }
    expected.clear();
    channel.made.clear();
  };
  std::string text;
  size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) continue;
    try {
      const json j = json::parse(text);
      const std::string op = j.at("op").get<std::string>();
      if (op == "options") {
        res.policy = j.at("policy").get<std::string>();
        table = std::make_unique<RequestTable>(
            table_options(j),
            make_routing_policy(res.policy, j.at("seed").get<uint64_t>(), latency_options(j)),
            channel);
      } else if (op == "assign" || op == "stop") {
        expected.push_back({op == "stop", j.at("replica").get<int>(), j.at("id").get<uint64_t>()});
      } else {
        if (!table) throw std::invalid_argument("a call before the options line");
        compare();
        call_line = line;
        call(*table, op, j);
        ++res.calls;
      }
    } catch (const std::exception& e) {
      throw std::invalid_argument(file.string() + ":" + std::to_string(line) + ": " + e.what());
    }
  }
  compare();
  return res;
}

}  // namespace troupe::sim
