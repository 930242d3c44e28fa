#pragma once
// The messages that cross between Troupe's processes (actors/protocol.h), as
// fuzz_wire_messages takes them: one byte naming the message (WireMessage,
// modulo their count), then the message's values after its atom, in order,
// as CAF's binary_serializer writes them: what BASP's payload carries and
// the middleman decodes with binary_deserializer. Atoms and actor handles
// are CAF's own (a handle decodes through the middleman's proxy registry)
// and are left out.
//
// Header-only and independent of libFuzzer: the fuzz target, the seed
// writer (wire_seeds.cpp, which writes corpus/wire_messages/seed-*) and the
// unit test that the committed seeds are still what the wire types write
// (tests/unit/test_fuzz_findings.cpp) all include it.
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/error.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/protocol.h"

namespace troupe::fuzz {

// Who receives each (actors/protocol.h), from which process:
enum class WireMessage : uint8_t {
  JoinRequest,    // (join, JoinRequest, node): supervisor, from a node
  JoinReply,      // its answer: node, from the coordinator
  ReplicaPlan,    // (start, plan, router, members) and (part, plan): node, from the supervisor
  Assignment,     // (assign, a): a replica's batcher on a node, from the router
  StepEvents,     // (events, ev): router, from a batcher on a node
  Step,           // (step, items, microbatches): a part on another node, from the leader's worker
  FaultOrder,     // (fault, order, injector): a batcher on a node, from the supervisor
  FaultReport,    // (fault, report): fault injector, from a batcher or worker on a node
  RendezvousSet,  // (rdvset, key, value): supervisor, from a part on a node
  RendezvousGet,  // (rdvget, key) and its answer (value): supervisor and the part
  NodeNumbers,    // (beat, node, incarnation), (stop, replica, epoch), (up, replica, epoch, b)
  Cancel,         // (cancel, id): a batcher on a node, from the router
  Count
};

inline const char* wire_message_name(WireMessage m) {
  static const char* const names[] = {
      "join-request", "join-reply",   "replica-plan",   "assignment",     "step-events",  "step",
      "fault-order",  "fault-report", "rendezvous-set", "rendezvous-get", "node-numbers", "cancel"};
  static_assert(sizeof(names) / sizeof(names[0]) == size_t(WireMessage::Count));
  return names[size_t(m)];
}

// The values as binary_serializer writes them (no actor system: none is a
// handle). Takes copies: CAF 0.17's inspect() wants non-const references.
template <class... Ts>
std::vector<char> wire_encode(Ts... xs) {
  std::vector<char> out;
  caf::binary_serializer sink{nullptr, out};
  if (auto err = sink(xs...)) throw std::logic_error("wire_encode: " + caf::to_string(err));
  return out;
}

// Decodes `xs` in order from the bytes, as the middleman does; `rest` is
// what is left over. An error: CAF refuses the message (its connection is
// closed), and it never reaches an actor.
template <class... Ts>
caf::error wire_decode(const char* data, size_t size, size_t& rest, Ts&... xs) {
  caf::binary_deserializer source{nullptr, data, size};
  auto err = source(xs...);
  rest = source.remaining();
  return err;
}

struct WireSample {
  std::string name;         // the seed file: seed-NAME
  std::vector<char> bytes;  // the WireMessage byte, then the encoded values
};

// Real messages, as a coordinator and its nodes exchange them.
inline std::vector<WireSample> wire_samples() {
  std::vector<WireSample> out;
  auto add = [&](const std::string& name, WireMessage m, std::vector<char> body) {
    body.insert(body.begin(), char(m));
    out.push_back({std::string(wire_message_name(m)) + "-" + name, std::move(body)});
  };
  using M = WireMessage;
  const JoinRequest join{"node-a",      "s3cret", kWireProtocol, kTroupeVersion,
                         "fp-0123abcd", 2,        "127.0.0.1"};
  add("node", M::JoinRequest, wire_encode(join));
  add("accepted", M::JoinReply, wire_encode(JoinReply{true, "", 1, 4}));
  add("refused", M::JoinReply,
      wire_encode(JoinReply{false, "wrong or missing token (nodes.token)", -1, 0}));

  ReplicaPlan whole;
  whole.replica = 1;
  whole.epoch = 3;
  add("whole", M::ReplicaPlan, wire_encode(whole));
  ReplicaPlan spanning = whole;  // P=2 over two nodes, this the second part
  spanning.pipeline = 2;
  spanning.stage_bounds = {0, 2, 3};
  spanning.hosts = {0, 1};
  spanning.part_names = {"node-a", "node-b"};
  spanning.part = 1;
  add("spanning", M::ReplicaPlan, wire_encode(spanning));
  ReplicaPlan tensor = spanning;  // T=2 over two nodes
  tensor.pipeline = 1;
  tensor.tensor = 2;
  tensor.stage_bounds.clear();
  tensor.part = 0;
  tensor.kv_dtype = "f16";
  add("tensor", M::ReplicaPlan, wire_encode(tensor));

  const SamplingParams sampled{0.8f, 0.9f, 40, 7, 2};  // with 2 alternatives per token
  const SamplingParams greedy{0, 1, 0, 0};
  add("new", M::Assignment, wire_encode(Assignment{7, {1, 30, 40, 7, 9}, 0, 16, sampled, false}));
  add("resumed", M::Assignment,
      wire_encode(Assignment{8, {1, 30, 40, 12, 13, 14}, 3, 8, greedy, true}));
  SamplingParams penalized = sampled;
  penalized.presence_penalty = 0.5f;
  penalized.frequency_penalty = -0.25f;
  penalized.repetition_penalty = 1.1f;
  penalized.logit_bias = {{9, -2.5f}, {31, 100.0f}};
  penalized.min_p = 0.05f;
  penalized.min_tokens = 2;
  penalized.stop_token_ids = {7, 40};
  penalized.allowed_token_ids = {1, 7, 9, 31, 40};
  penalized.bad_words = {{9, 31}, {1}};
  penalized.grammar = "root ::= [0-9]+ (\",\" [0-9]+)*\n";
  penalized.reasoning = ReasoningStart::Open;
  add("penalized", M::Assignment,
      wire_encode(Assignment{10, {1, 9, 31, 31}, 1, 8, penalized, false}));

  StepEvents ev;
  ev.replica = 0;
  ev.epoch = 3;
  ev.step_s = 0.004;
  ev.batch_sequences = 2;
  ev.batch_tokens = 6;
  ev.prefill_tokens = 5;
  ev.tokens = {{7, 0, 31}, {8, 3, 2}};
  ev.tokens[0].has_logprobs = true;
  ev.tokens[0].logprobs = {-0.5f, {{31, -0.5f}, {12, -1.75f}}};
  // Request 7's prompt (1, 30, 40, 7, 9): tokens 1.. given those before.
  ev.prompts = {{7,
                 {{-3.5f, {{30, -3.5f}}},
                  {-0.75f, {{40, -0.75f}}},
                  {-6.0f, {{2, -1.0f}}},
                  {-2.25f, {{9, -2.25f}}}}}};
  ev.done = {{8, FinishReason::Stop, 3}};
  ev.running = 1;
  ev.queued_tokens = 0;
  ev.blocks_used = 2;
  ev.blocks_free = 46;
  add("step", M::StepEvents, wire_encode(ev));
  StepEvents ended;  // no step: a request cancelled while it waited
  ended.replica = 1;
  ended.epoch = 3;
  ended.done = {{9, FinishReason::Cancelled, 0}};
  ended.blocks_free = 48;
  add("ended", M::StepEvents, wire_encode(ended));

  const StepItem prefill{7, {1, 30, 40, 7, 9}, 0, {0}, true, sampled, 0};
  const StepItem decode{8, {13}, 9, {1, 2}, true, greedy, 3};
  const StepItem chunk{9, {5, 6, 7, 8}, 8, {3, 4}, false, greedy, 0};
  add("prefill", M::Step, wire_encode(std::vector<StepItem>{prefill}, 1));
  add("mixed", M::Step, wire_encode(std::vector<StepItem>{prefill, decode, chunk}, 2));
  // The item that starts a sequence's penalties carries the sequence.
  const StepItem penalties{10, {9, 31, 31}, 1, {5}, true, penalized, 1, {1, 9, 31, 31}};
  add("penalized", M::Step, wire_encode(std::vector<StepItem>{penalties}, 1));

  add("slow", M::FaultOrder,
      wire_encode(FaultOrder{1, FaultKind::Slow, FaultRole::Worker, 0, -1, 2.5, false}));
  add("kill-shard", M::FaultOrder,
      wire_encode(FaultOrder{2, FaultKind::Kill, FaultRole::Shard, 1, 1, 1, false}));
  add("kv-end", M::FaultOrder,
      wire_encode(FaultOrder{3, FaultKind::KvAllocFail, FaultRole::Worker, 0, -1, 1, true}));
  add("confirmed", M::FaultReport,
      wire_encode(FaultReport{1, FaultOutcome::Confirmed,
                              "a step of replica 0 took 10 ms instead of 4 ms"}));
  add("refused", M::FaultReport,
      wire_encode(
          FaultReport{2, FaultOutcome::Refused, "replica 1 has 2 shard actor(s); no device 5"}));

  // Gloo's TCP address blob, as its rendezvous stores it.
  const std::string address("\x02\x00\x9c\x41\x7f\x00\x00\x01\x00\x00\x00\x00", 12);
  add("address", M::RendezvousSet, wire_encode(std::string("replica0/epoch3/tp0/rank1"), address));
  add("address", M::RendezvousGet, wire_encode(std::string("replica0/epoch3/tp0/rank0"), address));
  add("beat", M::NodeNumbers, wire_encode(int(1), uint64_t(4)));
  add("request", M::Cancel, wire_encode(uint64_t(7)));
  return out;
}

}  // namespace troupe::fuzz
