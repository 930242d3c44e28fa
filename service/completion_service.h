#pragma once
// The boundary between the front ends (the HTTP layer in net/) and the actor
// runtime: net/ parses and validates a request, tokenizes it, and submits it
// here; tokens and the final outcome come back through a sink. Everything here
// is plain C++ so that net/ can be tested against a fake service.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "service/request.h"

namespace troupe {

// Why a request failed; net/ maps these to HTTP statuses.
enum class ServiceErrorKind {
  BadRequest,   // 400: e.g. prompt over the context (re-checked by the runtime)
  QueueFull,    // 429 with Retry-After
  Unavailable,  // 503: no live replica (within the deadline)
  Timeout,      // 504: per-request deadline passed
  Internal,     // 500
};

struct ServiceError {
  ServiceErrorKind kind = ServiceErrorKind::Internal;
  std::string message;
  double retry_after_s = 0;  // for QueueFull / Unavailable
};

// Receives one request's results. Called from runtime threads, never
// concurrently for the same request, in order: on_token* then exactly one of
// on_done / on_error. A token is delivered at most once, also across replica
// crashes and resumption.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // `logprobs`: the token's log-probabilities when the request asked for
  // them (SamplingParams::logprobs), else null; valid during the call.
  virtual void on_token(int token_id, const TokenLogprobs* logprobs) = 0;
  // When the request asked for them (SamplingParams::prompt_logprobs), once,
  // before the first on_token: those of prompt tokens 1.., each given the
  // tokens before it.
  virtual void on_prompt_logprobs(const std::vector<TokenLogprobs>& /*entries*/) {}
  // cached_tokens: of the prompt, those found in the prefix cache.
  virtual void on_done(FinishReason reason, int prompt_tokens, int completion_tokens,
                       int cached_tokens) = 0;
  virtual void on_error(const ServiceError& error) = 0;
};

class CompletionService {
 public:
  virtual ~CompletionService() = default;
  // Takes ownership of the request; the sink is held until the request ends.
  virtual void submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) = 0;
  // The client went away: stop generating and free the request's KV blocks.
  // The sink gets on_done(Cancelled) (or nothing if it already ended).
  virtual void cancel(uint64_t request_id) = 0;
  // At least one replica has completed a real step recently or passed a probe.
  virtual bool ready() const = 0;
};

}  // namespace troupe
