#pragma once
// What a receiver checks of a message that came from another process before
// it acts on it. CAF's deserializer guarantees only that the bytes decoded
// as the type: any int, any float (NaN included), any enum value of the
// underlying type, any length of a vector. Each function returns what is
// wrong with a value, naming the field, or an empty string when the
// receiver can take it. tests/fuzz/fuzz_wire_messages.cpp drives them with
// decoded messages, and checks that what they accept the receiver's own
// code (the cluster, the scheduler, the engine, the fault book) takes too.
#include <string>
#include <vector>

#include "actors/wire.h"

namespace troupe {

// A plan's devices, an order's device index and the like stay below this
// (the admin endpoint's device range is [0, 4095] too).
inline constexpr int kMaxWireDevices = 4096;
// The text of a fault report: kept in the fault book, and served as JSON.
inline constexpr size_t kMaxFaultText = 4096;

// What a step of a replica may hold on the engine that runs it: the model's
// vocabulary and context, the KV cache's blocks, the plan's batch limits.
// A limit of 0 is not checked.
struct StepLimits {
  int vocab_size = 0;
  int context_length = 0;
  int kv_blocks = 0;
  int block_tokens = 0;
  int max_sequences = 0;  // items in one step
  int max_tokens = 0;     // tokens of all items in one step
};

// As the sampler and its penalties take them (their constructors throw
// otherwise); the bias's ids inside the vocabulary when vocab_size > 0. With
// `parse_grammar`, a grammar must also parse (once per request, at the
// batcher; a step's items, checked every step, are held to its size only:
// the engine ends a sequence whose grammar it cannot follow).
std::string sampling_problem(const SamplingParams& s, int vocab_size = 0,
                             bool parse_grammar = true);

// (start, plan, ...) and (part, plan) at a node.
std::string replica_plan_problem(const ReplicaPlan& p);

// (assign, a) at a replica's batcher, on a node. vocab_size and
// context_length are the model's (0: not checked).
std::string assignment_problem(const Assignment& a, int vocab_size, int context_length);

// (step, items, microbatches) at a part of a replica on another node: what
// the leader's worker runs too, as its batcher planned it.
std::string step_problem(const std::vector<StepItem>& items, int microbatches,
                         const StepLimits& limits);

// (events, ev) at the router, from a batcher on a node.
std::string step_events_problem(const StepEvents& ev);

// (fault, order, reporter) at a replica's batcher, from the coordinator's
// supervisor.
std::string fault_order_problem(const FaultOrder& o);

// (fault, report) at the coordinator's fault injector, from the actor that
// applied an order.
std::string fault_report_problem(const FaultReport& r);

}  // namespace troupe
