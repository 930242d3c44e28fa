#pragma once
// Atoms and message types exchanged by the serving actors (one process; the
// types are never serialized, hence CAF_ALLOW_UNSAFE_MESSAGE_TYPE).
#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <vector>

#include "service/completion_service.h"
#include "gpu/engine.h"

namespace troupe {

using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using assign_atom = caf::atom_constant<caf::atom("assign")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using events_atom = caf::atom_constant<caf::atom("events")>;
using up_atom = caf::atom_constant<caf::atom("up")>;
using down_atom = caf::atom_constant<caf::atom("down")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using slow_atom = caf::atom_constant<caf::atom("slow")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using stepdone_atom = caf::atom_constant<caf::atom("stepdone")>;
using status_atom = caf::atom_constant<caf::atom("status")>;

// A request placed on a replica: the prompt plus every token already
// delivered to the client (resumption after a crash prefills them too).
struct Assignment {
  uint64_t id = 0;
  std::vector<int> tokens;  // prompt + delivered
  int prompt_len = 0;
  int generated = 0;  // delivered tokens (tokens.size() - prompt_len)
  int max_tokens = 0;
  SamplingParams sampling;
  bool ignore_eos = false;
};

struct TokenEvent {
  uint64_t id;
  int index;  // position in the completion, 0-based
  int token;
};

struct DoneEvent {
  uint64_t id;
  FinishReason reason;
  int completion_tokens;
};

// What one step of one replica produced, and the replica's load after it.
struct StepEvents {
  int replica = 0;
  double step_s = 0;
  int batch_sequences = 0;
  int batch_tokens = 0;
  std::vector<TokenEvent> tokens;
  std::vector<DoneEvent> done;
  int running = 0;
  int waiting = 0;
  int blocks_used = 0;
  int blocks_free = 0;
};

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::CompletionRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::CompletionSink>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::Assignment)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::EngineItem>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::StepEvents)
