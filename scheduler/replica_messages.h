#pragma once
// What the request table and a replica's scheduler tell each other: a
// request placed on a replica, and what each step of the replica produced.
// Plain types: the actors carry them (across processes too), the simulator
// passes them directly.
#include <cstdint>
#include <vector>

#include "service/request.h"

namespace troupe {

// A request placed on a replica: the prompt plus every token already
// delivered to the client (resumption after a crash prefills them too).
struct Assignment {
  uint64_t id = 0;
  std::vector<int> tokens;  // prompt + delivered
  int generated = 0;        // delivered tokens, at the end of `tokens`
  int max_tokens = 0;
  SamplingParams sampling;
  bool ignore_eos = false;
  // Higher first: a replica's waiting sequences start in priority order
  // (arrival order within one), as the admission queue releases them.
  int priority = 0;
  uint64_t seq = 0;  // the router's channel numbers it (scheduler/replica_link.h)
};

struct TokenEvent {
  TokenEvent() = default;
  TokenEvent(uint64_t id_, int index_, int token_) : id(id_), index(index_), token(token_) {}

  uint64_t id = 0;
  int index = 0;  // position in the completion, 0-based
  int token = 0;
  bool has_logprobs = false;  // the request asked for them (SamplingParams::logprobs)
  TokenLogprobs logprobs;
};

// A new sequence's prompt log-probabilities (SamplingParams::
// prompt_logprobs): those of its tokens 1.., each given the ones before it;
// reported with its first sampled token.
struct PromptLogprobsEvent {
  uint64_t id = 0;
  std::vector<TokenLogprobs> entries;
};

struct DoneEvent {
  uint64_t id = 0;
  FinishReason reason = FinishReason::Stop;
  int completion_tokens = 0;
  // Prompt tokens it found in the prefix cache when first admitted there.
  int cached_tokens = 0;
};

// What one step of one replica produced (or, with no step, which requests
// ended there), and the replica's load after it.
struct StepEvents {
  int replica = 0;
  uint64_t epoch = 0;  // the placement it ran under (stale ones are ignored)
  double step_s = 0;
  int batch_sequences = 0;  // 0: no step (only ended requests)
  int batch_tokens = 0;
  int prefill_tokens = 0;                    // of batch_tokens, prompt (or resumed) tokens
  std::vector<PromptLogprobsEvent> prompts;  // before the tokens
  std::vector<TokenEvent> tokens;
  std::vector<DoneEvent> done;
  int running = 0;
  int queued_tokens = 0;  // prompt tokens still to prefill there
  int blocks_used = 0;
  int blocks_free = 0;
  int blocks_cached = 0;  // of used and free, those kept for reuse by prefix
  // Prefix caching, since the last events: prompt tokens of the sequences
  // admitted, and how many of them were found in the cache.
  int prefix_queried = 0;
  int prefix_hits = 0;
  // The channel's numbering (scheduler/replica_link.h): this message's, and
  // the last of the router's messages the replica had received.
  uint64_t seq = 0;
  uint64_t acked = 0;
};

}  // namespace troupe
