#pragma once
// When a sequence ends, decided once for every path that generates tokens
// (troupe generate, the serving runtime, the simulator), so that they cannot
// drift apart.
#include <algorithm>
#include <optional>
#include <vector>

#include "service/request.h"

namespace troupe {

struct StopRule {
  std::vector<int> eos_ids;  // the model's end-of-sequence ids
  int context_length = 0;    // positions the model can hold

  struct Outcome {
    bool deliver = true;                 // the token goes to the client
    std::optional<FinishReason> finish;  // the sequence ends after it
  };

  // A token was sampled for a sequence that had already delivered
  // `generated` tokens and fed `fed` tokens to the model (prompt included).
  // EOS ends it without being delivered (unless ignore_eos); otherwise the
  // token is delivered, and the sequence ends when it reaches max_tokens or
  // the context has no room to feed the token back.
  Outcome judge(int token, int generated, int max_tokens, int fed, bool ignore_eos) const {
    return judge(token, generated, max_tokens, fed, ignore_eos, SamplingParams{});
  }
  // With the request's own stop ids (SamplingParams::stop_token_ids), which
  // end it as EOS does, ignore_eos or not; neither ends one of the first
  // min_tokens tokens (the sampler does not draw them there: this only
  // matters if nothing else could be drawn).
  Outcome judge(int token, int generated, int max_tokens, int fed, bool ignore_eos,
                const SamplingParams& sampling) const {
    if (generated >= sampling.min_tokens) {
      if (!ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end())
        return {false, FinishReason::Stop};
      const auto& stops = sampling.stop_token_ids;
      if (std::find(stops.begin(), stops.end(), token) != stops.end())
        return {false, FinishReason::Stop};
    }
    if (generated + 1 >= max_tokens || fed >= context_length) return {true, FinishReason::Length};
    return {true, std::nullopt};
  }
};

}  // namespace troupe
