// Every message decoded from another process (tests/fuzz/wire_samples.h):
// the first byte picks the message (modulo their count), the rest goes to
// CAF's binary_deserializer as that message's values, as the middleman
// decodes a BASP payload. Oracles:
//  - decoding never crashes, leaks or allocates beyond the input (an
//    allocation CAF makes from a length the input claims is a finding);
//  - a decoded value re-encodes canonically: the encoding decodes in full to
//    a value that encodes to the same bytes, no longer than the input read
//    (the wire types have no operator==, and the bytes compare every field
//    bit for bit, NaNs included);
//  - the receiver's check (actors/wire_checks.h) never throws, and what it
//    accepts the receiver's own code takes: the cluster places an accepted
//    node; a node can index an accepted plan's hosts and parts; the replica
//    scheduler turns an accepted assignment into steps that a part accepts
//    and the engine (a tiny synthetic model) runs, and into step events the
//    router accepts; the engine runs an accepted step; the request table and
//    every routing policy take accepted step events; an accepted fault order
//    names its kind and role and its slow factor stays a duration; the fault
//    book takes an accepted report and GET /admin/faults can still serve it.
#include <spdlog/spdlog.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/wire_checks.h"
#include "faults/fault_book.h"
#include "faults/fault_json.h"
#include "fuzz_support.h"
#include "gpu/engine.h"
#include "gpu/synth_model.h"
#include "scheduler/cluster.h"
#include "scheduler/replica_scheduler.h"
#include "scheduler/request_table.h"
#include "scheduler/routing_policy.h"
#include "wire_samples.h"

namespace troupe::fuzz {
namespace {

// ---- decoding and the round trip ----

template <class... Ts>
bool decoded(const char* data, size_t size, Ts&... xs) {
  size_t rest = 0;
  if (wire_decode(data, size, rest, xs...)) return false;  // CAF refuses it
  const std::vector<char> once = wire_encode(xs...);
  if (once.size() > size - rest)
    violated("re-encoded as " + std::to_string(once.size()) + " bytes, from " +
             std::to_string(size - rest) + " read");
  std::tuple<Ts...> again;
  size_t rest2 = 0;
  const caf::error err = std::apply(
      [&](auto&... ys) { return wire_decode(once.data(), once.size(), rest2, ys...); }, again);
  if (err) violated("a re-encoded message does not decode: " + caf::to_string(err));
  if (rest2 != 0) violated("a re-encoded message decodes with bytes left over");
  if (std::apply([](auto&... ys) { return wire_encode(ys...); }, again) != once)
    violated("decoding the re-encoded message changed it");
  return true;
}

// TROUPE_FUZZ_WIRE_UNCHECKED=1 accepts everything without asking the
// checks: the fuzzer then finds what each check keeps from the receivers.
bool unchecked() {
  static const bool off = [] {
    const char* v = std::getenv("TROUPE_FUZZ_WIRE_UNCHECKED");
    return v && std::string(v) == "1";
  }();
  return off;
}

template <class F>
std::string checked(F&& check) {
  if (unchecked()) return {};
  // A check that throws would take the receiving actor down.
  try {
    return check();
  } catch (const std::exception& e) {
    violated(std::string("a receiver's check threw: ") + e.what());
  }
}

// ---- the engine a replica part runs: a synthetic model smaller than the
// "tiny" preset (a step costs microseconds), one device ----

constexpr int kBlockTokens = 16;
constexpr int kBlocks = 48;
constexpr int kMaxSequences = 4;
constexpr int kMaxTokens = 64;

Engine& engine() {
  static Engine* e = [] {
    ModelConfig c = synth_preset("tiny");
    c.dim = 16, c.hidden_dim = 32, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1;
    c.head_dim = 8, c.vocab_size = 64, c.max_seq_len = 64;
    auto model = std::make_shared<const Model>(synth_checkpoint(c, 7, DType::F32), DType::F32);
    auto* engine = new Engine(model, EngineOptions{1, kBlockTokens, kBlocks});
    // Tokens as text, so that a grammar an assignment carries is followed:
    // BOS and EOS control, then one character each (JSON's among them).
    std::vector<std::string> bytes = {"<s>", "</s>"};
    std::vector<bool> control = {true, true};
    const std::string chars = "{}[]\",: \n0123456789-.eEtrufalsn\\abcdxyz_é";
    for (size_t i = 0; bytes.size() < size_t(c.vocab_size); ++i) {
      size_t len = 1;
      while (i + len < chars.size() && (static_cast<unsigned char>(chars[i + len]) & 0xC0) == 0x80)
        ++len;
      bytes.push_back(i < chars.size() ? chars.substr(i, len) : "w" + std::to_string(i));
      i += len - 1;
      control.push_back(false);
    }
    auto vocab = std::make_shared<const grammar::TokenVocabulary>(bytes, control);
    engine->set_vocabulary([vocab] { return vocab; });
    return engine;
  }();
  return *e;
}

StepLimits part_limits() {
  const ModelConfig& c = engine().config();
  return {c.vocab_size, c.max_seq_len, kBlocks, kBlockTokens, kMaxSequences, kMaxTokens};
}

// Runs an accepted step; the engine refusing it means the check let through
// what kills a part (and with it the replica).
std::vector<int> run_step(const std::vector<StepItem>& items, int microbatches,
                          const std::string& what) {
  std::vector<int> out;
  try {
    out = engine().finish(engine().launch_split(items, microbatches));
  } catch (const std::exception& e) {
    violated(what + " was accepted, but the engine refused it: " + e.what());
  }
  if (out.size() != items.size()) violated(what + ": the engine answered for another count");
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].sample != (out[i] >= 0) || out[i] >= engine().config().vocab_size)
      violated(what + ": sampled id " + std::to_string(out[i]) + " for item " + std::to_string(i));
  return out;
}

void release_all(const std::vector<StepItem>& items) {
  for (const StepItem& it : items) engine().release(it.seq);
}

// ---- the receivers ----

const ClusterOptions kCluster{kWireProtocol, "fp-0123abcd", "s3cret", 2};

void on_join_request(const JoinRequest& r) {
  Cluster c(kCluster);
  const JoinRequest other{"node-b",      "s3cret", kWireProtocol, kTroupeVersion,
                          "fp-0123abcd", 2,        "127.0.0.2"};
  if (!c.join(other, 0).accepted) violated("the cluster refused the well-formed node");
  const JoinReply reply = c.join(r, 1);
  if (!reply.accepted) {
    if (reply.reason.empty()) violated("a join refused without a reason");
    return;
  }
  if (r.token != kCluster.token || r.protocol != kCluster.protocol || r.model != kCluster.model ||
      r.devices < 1 || r.name.empty())
    violated("the cluster accepted a node it should have refused");
  const NodeRecord* n = c.node(reply.node);
  if (!n || n->devices != r.devices || n->name != r.name) violated("the joined node's record");
  // Placement over it, as the supervisor does for every waiting replica.
  int replica = 0;
  for (const std::string& wanted : {r.name, std::string("any"), "node-b," + r.name})
    for (int devices : {1, 2, 3, r.devices}) {
      auto parts = c.choose(wanted, devices);
      if (!parts) continue;
      int total = 0;
      for (const auto& [id, d] : *parts) {
        const NodeRecord* rec = c.node(id);
        if (!rec || d < 1 || d > rec->devices - rec->used_devices)
          violated("choose() gave a part that does not fit");
        total += d;
      }
      if (total != devices) violated("choose() gave another device count");
      c.place(replica++, *parts);
    }
  for (const NodeRecord* rec : c.nodes())
    if (rec->used_devices < 0 || rec->used_devices > rec->devices)
      violated("a node's used devices out of range");
  if (!c.heard_from(reply.node, reply.incarnation, 2)) violated("the node's beat was not heard");
  c.expire(100);
  if (c.live_nodes() != 0) violated("silent nodes did not expire");
}

void on_replica_plan(const ReplicaPlan& p) {
  if (!checked([&] { return replica_plan_problem(p); }).empty()) return;
  // What node_agent.cpp does with an accepted plan before any engine exists:
  // devices for its part, the engine's device list, the Gloo groups' names.
  const int devices = p.devices();
  const int mine = p.devices_of(p.part);
  if (mine < 1 || mine > devices)
    violated("an accepted plan gives its part " + std::to_string(mine));
  try {
    int sum = 0;
    for (int q = 0; q < std::max<int>(1, int(p.part_names.size())); ++q) sum += p.devices_of(q);
    if (!p.hosts.empty() && sum != devices) violated("an accepted plan's parts miss devices");
    for (int s = 0; s < p.pipeline; ++s)
      for (int t = 0; t < p.tensor; ++t)
        if (!p.hosts.empty()) (void)p.part_names.at(size_t(p.hosts.at(size_t(s * p.tensor + t))));
    if (!p.hosts.empty()) (void)p.part_names.at(size_t(p.leader()));
    for (size_t s = 0; s + 1 < p.stage_bounds.size(); ++s)
      if (p.stage_bounds[s + 1] <= p.stage_bounds[s]) violated("an accepted plan's empty stage");
  } catch (const std::out_of_range& e) {
    violated(std::string("an accepted plan indexes out of range: ") + e.what());
  }
}

// Drives the replica scheduler as a batcher does, with the decoded
// assignment and two well-formed ones beside it.
void on_assignment(const Assignment& a) {
  const ModelConfig& model = engine().config();
  if (!checked([&] { return assignment_problem(a, model.vocab_size, model.max_seq_len); }).empty())
    return;
  ReplicaSchedulerOptions o;
  o.replica = 0;
  o.epoch = 3;
  o.kv_blocks = kBlocks;
  o.block_tokens = kBlockTokens;
  o.limits = {kMaxSequences, kMaxTokens, 32};
  o.stop = StopRule{{2}, model.max_seq_len};
  o.bos = 1;
  ReplicaScheduler sched(o);
  const StepLimits limits = part_limits();
  std::set<uint64_t> seqs;
  auto step = [&](const PlannedStep& s, const std::string& what) {
    for (const StepItem& it : s.items) seqs.insert(it.seq);
    const std::string problem = step_problem(s.items, 1, limits);
    if (!problem.empty())
      violated(what + " from accepted assignments is refused by a part: " + problem);
    return run_step(s.items, 1, what);
  };
  const PlannedStep probe = sched.probe_step();
  step(probe, "the probe step");
  sched.finish_probe(probe.id);
  sched.add(a);
  sched.add({a.id ^ 1, {1, 30, 40}, 0, 4, {0.8f, 0.9f, 40, 7}, false});
  sched.add({a.id ^ 2, {1, 50, 60, 20, 21, 22}, 2, 3, {0, 1, 0, 0}, true});
  auto events = [&](const StepEvents& ev) {
    const std::string problem = step_events_problem(ev);
    if (!problem.empty()) violated("the router drops a batcher's real step events: " + problem);
  };
  for (int n = 0; n < 400; ++n) {
    auto planned = sched.next_step();
    if (auto ended = sched.take_ended()) events(*ended);
    for (uint64_t id : sched.take_released()) engine().release(id);
    if (!planned) break;
    const std::vector<int> ids = step(*planned, "a planned step");
    events(sched.finish_step(planned->id, ids, 0.001));
  }
  for (uint64_t id : seqs) engine().release(id);
}

void on_step(const std::vector<StepItem>& items, int microbatches) {
  if (!checked([&] { return step_problem(items, microbatches, part_limits()); }).empty()) return;
  run_step(items, microbatches, "a step from the leader");
  release_all(items);
}

class NullChannel : public ReplicaChannel {
 public:
  void assign(int, Assignment) override {}
  void cancel(int, uint64_t) override {}
};

class CountingSink : public CompletionSink {
 public:
  void on_token(int, const TokenLogprobs*) override {
    if (ended) violated("a token after the request ended");
    ++tokens;
  }
  void on_done(FinishReason, int, int, int) override { end(); }
  void on_error(const ServiceError&) override { end(); }
  void end() {
    if (ended) violated("a request ended twice");
    ended = true;
  }
  int tokens = 0;
  bool ended = false;
};

void on_step_events(const StepEvents& ev) {
  if (!checked([&] { return step_events_problem(ev); }).empty()) return;
  for (const std::string& policy : routing_policy_names()) {
    RequestTableOptions o;
    o.replicas = 2;
    o.max_seq_len = 64;
    o.max_batch_sequences = kMaxSequences;
    NullChannel channel;
    RequestTable table(o, make_routing_policy(policy, 1), channel);
    table.replica_up(0, 0);
    table.replica_up(1, 0);
    std::vector<std::shared_ptr<CountingSink>> sinks;
    for (uint64_t id : {7, 8, 9}) {
      CompletionRequest r;
      r.id = id;
      r.prompt = {1, 30, 40};
      r.max_tokens = 16;
      sinks.push_back(std::make_shared<CountingSink>());
      table.submit(r, sinks.back(), 0.1);
    }
    // As the router does: only replicas it knows, then the table.
    if (ev.replica < o.replicas) table.on_events(ev, 0.2);
    // The load view the policy routes by holds what the replica said.
    for (const auto& r : table.replicas())
      if (r.running > size_t(INT32_MAX) || r.queued_tokens > size_t(INT32_MAX))
        violated("the load view wrapped: running " + std::to_string(r.running) + ", queued " +
                 std::to_string(r.queued_tokens));
    table.tick(0.3);
    // Routing after the load and rates it learned.
    CompletionRequest r;
    r.id = 10;
    r.prompt = {1, 2};
    r.max_tokens = 4;
    sinks.push_back(std::make_shared<CountingSink>());
    table.submit(r, sinks.back(), 0.4);
    table.tick(0.5);
    table.shutdown("done");
  }
}

void on_fault_order(const FaultOrder& o) {
  if (!checked([&] { return fault_order_problem(o); }).empty()) return;
  if (fault_kind_name(o.kind) == "?" || fault_role_name(o.role) == "?")
    violated("an accepted fault order with an unknown kind or role");
  if (o.kind == FaultKind::Slow && !o.end) {
    // The worker sleeps (factor - 1) x the step's time; a step of a minute
    // must still give a duration in nanoseconds.
    const double extra = (o.factor - 1) * 60;
    if (!(extra > 0 && extra < 1e9))
      violated("an accepted slow factor " + std::to_string(o.factor));
    (void)std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(extra));
  }
  // As GET /admin/faults shows it.
  (void)fault_request_json({o, 0, 1}).dump();
}

void on_fault_report(const FaultReport& r) {
  if (!checked([&] { return fault_report_problem(r); }).empty()) return;
  FaultBook book;
  for (FaultKind k : {FaultKind::Slow, FaultKind::Kill, FaultKind::KvAllocFail}) {
    FaultOrder o;
    o.kind = k;
    o.factor = 2;
    const FaultOrder added = book.add(o, 0, 1, 0);
    book.started(added.id, 0.1);
  }
  book.report(r, 0.2);
  try {
    for (const FaultEntry& e : book.list()) (void)fault_entry_json(e).dump();
  } catch (const std::exception& e) {
    violated(std::string("GET /admin/faults fails after an accepted report: ") + e.what());
  }
}

void on_node_numbers(int n, uint64_t incarnation) {
  Cluster c(kCluster);
  const JoinReply a =
      c.join({"node-a", "s3cret", kWireProtocol, kTroupeVersion, "fp-0123abcd", 1, "127.0.0.1"}, 0);
  // A beat from a node that is not that member is answered by (join).
  const bool heard = c.heard_from(n, incarnation, 1);
  if (heard != (n == a.node && incarnation == a.incarnation)) violated("a beat heard wrongly");
}

}  // namespace
}  // namespace troupe::fuzz

// The receivers log what they refuse (the fault book its refusals): not
// the fuzzer's output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  if (size == 0) return 0;
  const auto which = WireMessage(data[0] % uint8_t(WireMessage::Count));
  const char* body = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  switch (which) {
    case WireMessage::JoinRequest: {
      JoinRequest r;
      if (decoded(body, n, r)) on_join_request(r);
      break;
    }
    case WireMessage::JoinReply: {
      JoinReply r;  // the node logs it and keeps its numbers: nothing to check
      decoded(body, n, r);
      break;
    }
    case WireMessage::ReplicaPlan: {
      ReplicaPlan p;
      if (decoded(body, n, p)) on_replica_plan(p);
      break;
    }
    case WireMessage::Assignment: {
      Assignment a;
      if (decoded(body, n, a)) on_assignment(a);
      break;
    }
    case WireMessage::StepEvents: {
      StepEvents ev;
      if (decoded(body, n, ev)) on_step_events(ev);
      break;
    }
    case WireMessage::Step: {
      std::vector<StepItem> items;
      int microbatches = 0;
      if (decoded(body, n, items, microbatches)) on_step(items, microbatches);
      break;
    }
    case WireMessage::FaultOrder: {
      FaultOrder o;
      if (decoded(body, n, o)) on_fault_order(o);
      break;
    }
    case WireMessage::FaultReport: {
      FaultReport r;
      if (decoded(body, n, r)) on_fault_report(r);
      break;
    }
    case WireMessage::RendezvousSet:
    case WireMessage::RendezvousGet: {
      // The supervisor stores the value under the key; the part hands the
      // bytes to Gloo, which reads the address it wrote.
      std::string key, value;
      if (decoded(body, n, key, value)) {
        std::map<std::string, std::string> store;
        store[key] = value;
      }
      break;
    }
    case WireMessage::NodeNumbers: {
      int node = 0;
      uint64_t incarnation = 0;
      if (decoded(body, n, node, incarnation)) on_node_numbers(node, incarnation);
      break;
    }
    case WireMessage::Cancel: {
      uint64_t id = 0;
      decoded(body, n, id);  // an unknown id is ignored (ReplicaScheduler::cancel)
      break;
    }
    case WireMessage::Count:
      break;
  }
  return 0;
}
