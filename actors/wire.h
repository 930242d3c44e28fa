#pragma once
// What crosses between processes, and how CAF serializes it: an inspect()
// per type (CAF 0.17's form), and the registration every process does before
// it starts its actor system, under the same names on both ends (CAF drops
// a message whose top-level types the receiver does not know). A malformed
// or truncated message fails CAF's deserializer and its connection is
// closed; it never reaches an actor. One that decodes may still hold any
// value of its types: what each receiver checks is in actors/wire_checks.h.
#include <bit>
#include <caf/all.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "faults/fault_order.h"
#include "scheduler/cluster.h"
#include "scheduler/replica_messages.h"
#include "service/request.h"
#include "service/step_item.h"

namespace troupe {

// Bumped whenever a wire type or an actor protocol changes: a node speaking
// another protocol is refused when it joins. 3: rendezvous values as
// strings, floating-point fields as their IEEE-754 bits. 4: the router <->
// replica channel's sequence numbers (scheduler/replica_link.h). 5: a
// fault order with `end` withdraws a one-shot fault (an older node would
// arm it), FaultOutcome::Withdrawn, and a node answers (alive). 6: a join's
// answer carries the coordinator's heartbeat timeout, which sets the pace
// of the node's beats, and a beat is answered. 9: a batcher asks the
// router whether its placement is up, until answered; a node shutting down
// says it leaves. 10: log-probabilities (SamplingParams::logprobs, with the
// tokens of StepEvents). 11: penalties, logit bias and prompt
// log-probabilities (SamplingParams), the sequence's history on the step
// items that need it. 12: min_p, min_tokens, stop_token_ids,
// allowed_token_ids and bad_words (SamplingParams). 13: grammar
// (SamplingParams, structured output). 14: where the answer's reasoning is,
// which a grammar leaves free (SamplingParams::reasoning). 15: a request's
// priority (Assignment), which orders a replica's waiting sequences. 16:
// prefix caching (ReplicaPlan), its figures (StepEvents) and a request's
// cached prompt tokens (DoneEvent). 17: a fault on a device that a part on
// another node runs (MemberActor's crash).
inline constexpr uint32_t kWireProtocol = 17;
// Troupe's version, in joins and logs.
inline constexpr const char* kTroupeVersion = "0.10";

// CAF 0.17 writes a float or double through detail::pack754, which loops
// forever on an infinity, mangles subnormals (1e-40f arrives as -1.2e37,
// 1e-310 as -3.2e306: a temperature a client may send) and reads a NaN back
// as an infinity. The wire types carry their floating-point fields as the
// IEEE-754 bits instead, exactly, when CAF (de)serializes them; other
// inspectors (CAF's to_string) see the number.
template <class T>
struct FloatBits {
  T& value;
};

template <class Inspector>
inline constexpr bool kWireBits = std::is_base_of_v<caf::serializer, Inspector> ||
                                  std::is_base_of_v<caf::deserializer, Inspector>;

template <class Inspector, class T>
typename Inspector::result_type inspect(Inspector& f, FloatBits<T>& x) {
  static_assert(std::is_floating_point_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  Bits bits = 0;
  return f(caf::meta::save_callback([&]() -> caf::error {
             std::memcpy(&bits, &x.value, sizeof bits);
             return caf::none;
           }),
           bits, caf::meta::load_callback([&]() -> caf::error {
             std::memcpy(&x.value, &bits, sizeof bits);
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  if constexpr (kWireBits<Inspector>) {
    FloatBits<float> temperature{x.temperature}, top_p{x.top_p}, presence{x.presence_penalty},
        frequency{x.frequency_penalty}, repetition{x.repetition_penalty}, min_p{x.min_p};
    // The bias as ids and the bits of their values, side by side.
    std::vector<int> bias_ids;
    std::vector<uint32_t> bias_bits;
    return f(caf::meta::type_name("SamplingParams"), temperature, top_p, x.top_k, x.seed,
             x.logprobs, x.prompt_logprobs, presence, frequency, repetition,
             caf::meta::save_callback([&]() -> caf::error {
               for (const auto& [id, bias] : x.logit_bias) {
                 bias_ids.push_back(id);
                 bias_bits.push_back(std::bit_cast<uint32_t>(bias));
               }
               return caf::none;
             }),
             bias_ids, bias_bits, caf::meta::load_callback([&]() -> caf::error {
               if (bias_ids.size() != bias_bits.size())
                 return caf::make_error(caf::sec::invalid_argument);
               x.logit_bias.clear();
               for (size_t i = 0; i < bias_ids.size(); ++i)
                 x.logit_bias.emplace_back(bias_ids[i], std::bit_cast<float>(bias_bits[i]));
               return caf::none;
             }),
             min_p, x.min_tokens, x.stop_token_ids, x.allowed_token_ids, x.bad_words, x.grammar,
             x.reasoning);
  } else {
    return f(caf::meta::type_name("SamplingParams"), x.temperature, x.top_p, x.top_k, x.seed,
             x.logprobs, x.prompt_logprobs, x.presence_penalty, x.frequency_penalty,
             x.repetition_penalty, x.logit_bias, x.min_p, x.min_tokens, x.stop_token_ids,
             x.allowed_token_ids, x.bad_words, x.grammar, x.reasoning);
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TopLogprob& x) {
  if constexpr (kWireBits<Inspector>) {
    FloatBits<float> logprob{x.logprob};
    return f(caf::meta::type_name("TopLogprob"), x.token, logprob);
  } else {
    return f(caf::meta::type_name("TopLogprob"), x.token, x.logprob);
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenLogprobs& x) {
  if constexpr (kWireBits<Inspector>) {
    FloatBits<float> logprob{x.logprob};
    return f(caf::meta::type_name("TokenLogprobs"), logprob, x.top);
  } else {
    return f(caf::meta::type_name("TokenLogprobs"), x.logprob, x.top);
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepItem& x) {
  return f(caf::meta::type_name("StepItem"), x.seq, x.tokens, x.position, x.blocks, x.sample,
           x.sampling, x.generated, x.history);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Assignment& x) {
  return f(caf::meta::type_name("Assignment"), x.id, x.tokens, x.generated, x.max_tokens,
           x.sampling, x.ignore_eos, x.priority, x.seq);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenEvent& x) {
  return f(caf::meta::type_name("TokenEvent"), x.id, x.index, x.token, x.has_logprobs, x.logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PromptLogprobsEvent& x) {
  return f(caf::meta::type_name("PromptLogprobsEvent"), x.id, x.entries);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DoneEvent& x) {
  return f(caf::meta::type_name("DoneEvent"), x.id, x.reason, x.completion_tokens, x.cached_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepEvents& x) {
  if constexpr (kWireBits<Inspector>) {
    FloatBits<double> step_s{x.step_s};
    return f(caf::meta::type_name("StepEvents"), x.replica, x.epoch, step_s, x.batch_sequences,
             x.batch_tokens, x.prefill_tokens, x.prompts, x.tokens, x.done, x.running,
             x.queued_tokens, x.blocks_used, x.blocks_free, x.blocks_cached, x.prefix_queried,
             x.prefix_hits, x.seq, x.acked);
  } else {
    return f(caf::meta::type_name("StepEvents"), x.replica, x.epoch, x.step_s, x.batch_sequences,
             x.batch_tokens, x.prefill_tokens, x.prompts, x.tokens, x.done, x.running,
             x.queued_tokens, x.blocks_used, x.blocks_free, x.blocks_cached, x.prefix_queried,
             x.prefix_hits, x.seq, x.acked);
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FaultOrder& x) {
  if constexpr (kWireBits<Inspector>) {
    FloatBits<double> factor{x.factor};
    return f(caf::meta::type_name("FaultOrder"), x.id, x.kind, x.role, x.replica, x.device, factor,
             x.end);
  } else {
    return f(caf::meta::type_name("FaultOrder"), x.id, x.kind, x.role, x.replica, x.device,
             x.factor, x.end);
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FaultReport& x) {
  return f(caf::meta::type_name("FaultReport"), x.id, x.outcome, x.text);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JoinRequest& x) {
  return f(caf::meta::type_name("JoinRequest"), x.name, x.token, x.protocol, x.version, x.model,
           x.devices, x.address);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JoinReply& x) {
  return f(caf::meta::type_name("JoinReply"), x.accepted, x.reason, x.node, x.incarnation,
           x.heartbeat_timeout_ms);
}

// What a node needs to start a replica placed on it. The node takes the
// threads and memory of the devices it offers, and the stop rule from its
// model (the same model: checked when it joined).
struct ReplicaPlan {
  int replica = 0;
  uint64_t epoch = 0;  // this placement's generation: fences a replica that outlived it
  int pipeline = 1;
  int tensor = 1;
  std::vector<int>
      stage_bounds;  // stage s has layers [bounds[s], bounds[s+1]); empty: balanced there
  int block_tokens = 16;
  int blocks = 4096;
  std::string kv_dtype = "f32";  // kv_cache.dtype, as dtype_name writes it
  int max_batch_sequences = 32;
  int max_batch_tokens = 2048;
  int prefill_chunk_tokens = 512;
  bool async_scheduling = true;  // batching.async_scheduling (a pipeline ignores it)
  bool prefix_caching = true;    // kv_cache.prefix_caching
  // A replica spanning nodes: per device (stage-major) the part it belongs
  // to, one part per node, and the parts' names (their nodes', for errors);
  // empty: the whole replica on one node. `part` is the receiver's.
  std::vector<int> hosts;
  std::vector<std::string> part_names;
  int part = 0;
  int devices() const { return pipeline * tensor; }
  // A pipeline's groups already overlap steps: only a replica without one
  // schedules ahead.
  bool schedules_ahead() const { return async_scheduling && pipeline == 1; }
  // Devices of part `p` (all of them for a replica on one node).
  int devices_of(int p) const;
  // The part that samples: it hosts device (P-1, 0), and runs the replica's
  // batcher and worker.
  int leader() const { return hosts.empty() ? 0 : hosts[size_t((pipeline - 1) * tensor)]; }
  bool spans() const { return !part_names.empty() && part_names.size() > 1; }
};

inline int ReplicaPlan::devices_of(int p) const {
  if (hosts.empty()) return devices();
  int n = 0;
  for (int h : hosts) n += h == p ? 1 : 0;
  return n;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaPlan& x) {
  // Prefix caching as a number: a second bool here makes gcc 12 warn,
  // wrongly, of an out-of-bounds copy inside CAF's serializer.
  int prefix_caching = x.prefix_caching;
  return f(caf::meta::type_name("ReplicaPlan"), x.replica, x.epoch, x.pipeline, x.tensor,
           x.stage_bounds, x.block_tokens, x.blocks, x.max_batch_sequences, x.max_batch_tokens,
           x.prefill_chunk_tokens, x.async_scheduling, x.hosts, x.part_names, x.part, x.kv_dtype,
           prefix_caching, caf::meta::load_callback([&]() -> caf::error {
             x.prefix_caching = prefix_caching != 0;
             return caf::none;
           }));
}

// Registers every type above, and the actor handles messages carry, on a
// config (coordinator and nodes alike), and loads CAF's middleman.
void register_wire_types(caf::actor_system_config& cfg);

}  // namespace troupe
