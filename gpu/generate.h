#pragma once
// Single-sequence generation over the batched engine: prefill the prompt in
// chunks, then decode one token per step until EOS, max_tokens or the end of
// the context. Used by `troupe generate`, the tests, and as the reference the
// serving path must match.
#include <functional>
#include <string>
#include <vector>

#include "gpu/engine.h"
#include "gpu/model.h"
#include "gpu/sampler.h"
#include "service/request.h"

namespace troupe {

struct GenerateRequest {
  std::vector<int> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;
  int prefill_chunk = 512;
};

struct GenerateResult {
  std::vector<int> ids;                               // generated ids (EOS not included)
  FinishReason finish_reason = FinishReason::Length;  // Stop (EOS) or Length (max_tokens, context)
  double prefill_s = 0, decode_s = 0;  // wall time of prompt processing, then of decoding
};

// Checks a request against the model: a clear std::invalid_argument for an
// empty prompt, a prompt longer than the context, ids outside the vocabulary,
// or max_tokens < 1.
void validate_request(const ModelConfig& config, const GenerateRequest& req);

// One sequence through any step engine (one device, or a ParallelEngine
// layout), in blocks 0, 1, ... of its cache (a stopped generation leaves
// them free); the engine samples with req.sampling and the stop rule is
// service/stop_rule.h's, as in serving. on_token is called with each id as
// it is produced; returning false stops.
GenerateResult generate(StepEngine& engine, const ModelConfig& config, const GenerateRequest& req,
                        const std::function<bool(int)>& on_token = nullptr);

// The same on one device holding `model`, with its own cache sized for one
// sequence.
GenerateResult generate(const Model& model, int threads, const GenerateRequest& req,
                        const std::function<bool(int)>& on_token = nullptr);

}  // namespace troupe
