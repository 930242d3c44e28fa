#pragma once
// What a completion request is, in every layer: its sampling parameters, the
// request as the runtime receives it, and how it can end. Plain types with no
// dependencies, shared by net/, the actors, the scheduler and the engines.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct SamplingParams {
  float temperature = 1;  // 0: greedy (argmax)
  float top_p = 1;        // in (0, 1]; 1: off
  int top_k = 0;          // 0: off
  uint64_t seed = 0;
};

struct CompletionRequest {
  uint64_t id = 0;          // unique per process, assigned by the front end
  std::vector<int> prompt;  // token ids, BOS included when text was given
  int max_tokens = 16;
  SamplingParams sampling;  // temperature 0 = greedy
  int priority = 0;         // higher first; 0 .. priority_levels-1
  // How long the request may take, in seconds from when the runtime accepts
  // it (0 = no limit). The runtime turns it into one absolute deadline and is
  // the only place that enforces it.
  double timeout_s = 0;
  bool ignore_eos = false;  // benchmarks: always generate max_tokens
};

// How a request ended.
enum class FinishReason { Stop, Length, Cancelled };

}  // namespace troupe
