#pragma once
// One sequence's part of an engine step: what the replica's scheduler plans
// and every engine (one device, a parallel layout, a GPU) runs. The scheduler
// keeps the only book of KV blocks, so an item carries the sequence's block
// table and position: an engine holds no per-sequence KV state of its own.
#include <cstdint>
#include <vector>

#include "service/request.h"

namespace troupe {

// An item's only token when it is the one its sequence's previous step
// samples: a replica that schedules ahead (ReplicaSchedulerOptions::
// lookahead) plans step N+1 while step N runs, and its worker puts N's
// sampled id in place of this before it launches N+1. Engines never see it.
inline constexpr int kSampledToken = -1;

struct StepItem {
  uint64_t seq = 0;
  std::vector<int> tokens;  // written to the KV cache at positions position, position + 1, ...
                            // (or {kSampledToken}, before the worker launches it)
  int position = 0;         // tokens of the sequence already in the KV cache
  std::vector<int> blocks;  // the sequence's block table; covers position + tokens.size()
  bool sample = false;      // sample a token from the last one's logits
  SamplingParams sampling;  // used when the sequence's sampler is created
  int generated = 0;        // tokens already generated: a new sampler skips that many draws
  // The sequence as the scheduler knows it (prompt, then `generated` output
  // tokens), at least through this item's tokens: on the item that ends a
  // (re)prefill of a sequence whose sampling penalizes tokens it holds
  // (SamplingParams::penalizes), where it ends with this item's tokens and
  // the engine rebuilds the sequence's penalties from it; and on every
  // prefill chunk of a new sequence that asks for its prompt's
  // log-probabilities, where it says which token each row predicts. Empty
  // otherwise.
  std::vector<int> history{};

  // Its token is the one its sequence's previous step samples.
  bool feeds_sampled_token() const { return tokens.size() == 1 && tokens[0] == kSampledToken; }
  // The engine computes every row's logits for it, and the log-probability
  // of each prompt token its rows predict (StepEngine::last_prompt_logprobs).
  // Not for a resumed sequence (generated > 0), whose were reported already
  // (its history may be there for its penalties).
  bool wants_prompt_logprobs() const {
    return sampling.prompt_logprobs >= 0 && generated == 0 && !history.empty();
  }
  // Prompt tokens its rows predict: positions position + 1 .. of history.
  int prompt_rows_predicting() const {
    if (!wants_prompt_logprobs()) return 0;
    const int last = int(history.size()) - 1;  // the last position a row can predict
    const int first = position + 1;
    const int end = position + int(tokens.size());
    return first > last ? 0 : (end < last ? end : last) - first + 1;
  }
};

}  // namespace troupe
