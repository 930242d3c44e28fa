#pragma once
// What a completion request is, in every layer: its sampling parameters, the
// request as the runtime receives it, and how it can end. Plain types with no
// dependencies, shared by net/, the actors, the scheduler and the engines.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

// Where an answer's reasoning ("<think>...</think>") is, as a reasoning
// parser reads it (service/reasoning_filter.h): None, there is none; Optional,
// only an answer that opens with "<think>" has it (qwen3); Open, the answer
// starts inside it, "<think>" written or not (deepseek_r1, or a prompt the
// chat template ended with "<think>").
enum class ReasoningStart { None, Optional, Open };

struct SamplingParams {
  float temperature = 1;  // 0: greedy (argmax)
  float top_p = 1;        // in (0, 1]; 1: off
  int top_k = 0;          // 0: off
  uint64_t seed = 0;
  // Log-probabilities to report with each sampled token: -1 none, 0 the
  // sampled token's, k also those of the k likeliest (at most kMaxLogprobs).
  int logprobs = -1;
  // Log-probabilities of the prompt's tokens, each given those before it: -1
  // none, k with the k likeliest alternatives at each position (an echo of
  // the prompt with `logprobs`, as lm-eval's loglikelihood tasks ask).
  int prompt_logprobs = -1;
  // What is done to the logits before the draw (gpu/logit_penalties.h), in
  // vLLM's order: the bias, then the repetition penalty (every token seen,
  // prompt and output), then frequency and presence (output tokens only).
  // Log-probabilities are reported from the logits before any of it.
  float presence_penalty = 0;    // [-2, 2]: subtracted once per id in the output
  float frequency_penalty = 0;   // [-2, 2]: subtracted per occurrence in the output
  float repetition_penalty = 1;  // (0, 2]: a seen id's positive logit / it, negative * it
  std::vector<std::pair<int, float>> logit_bias{};  // (id, [-100, 100]), ids ascending, unique
  // vLLM's: ids whose probability (after temperature) is below min_p times
  // the likeliest's are not drawn; [0, 1], 0: off. Greedy is unaffected.
  float min_p = 0;
  // vLLM's: the first min_tokens tokens cannot end the sequence: the model's
  // end-of-sequence ids and stop_token_ids are not drawn for them, and stop
  // strings are looked for only in the text after them.
  int min_tokens = 0;
  // More ids that end the sequence as its end-of-sequence id does (not
  // delivered; finish reason "stop"), ignore_eos or not. Ascending, unique.
  std::vector<int> stop_token_ids{};
  // vLLM's: when not empty, the only ids that may be drawn. Ascending, unique.
  std::vector<int> allowed_token_ids{};
  // vLLM's bad_words as token ids: a word's last id is not drawn where the
  // output so far ends with the ids before it (a one-id word: never).
  std::vector<std::vector<int>> bad_words{};
  // Structured output: when not empty, a GBNF grammar (grammar/grammar.h)
  // the output's text must follow; only tokens that keep it a prefix of a
  // match are drawn, and the end of sequence only once it is a whole one.
  std::string grammar{};
  // With a grammar: the answer's reasoning, which the grammar leaves free.
  // The grammar shapes what follows it (vLLM's semantics with a reasoning
  // parser), after the reply's leading whitespace.
  ReasoningStart reasoning = ReasoningStart::None;

  // Whether the logits are changed before the draw at all.
  bool adjusts_logits() const {
    return !logit_bias.empty() || min_tokens > 0 || !allowed_token_ids.empty() || penalizes();
  }
  // Whether the change depends on the tokens the sequence holds.
  bool penalizes() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1 ||
           !bad_words.empty() || !grammar.empty();
  }
};

inline constexpr int kMaxLogprobs = 20;
inline constexpr int kMaxLogitBias = 1024;           // entries of SamplingParams::logit_bias
inline constexpr int kMaxStopTokenIds = 1024;        // entries of SamplingParams::stop_token_ids
inline constexpr int kMaxAllowedTokenIds = 1 << 18;  // entries of allowed_token_ids
inline constexpr int kMaxBadWords = 256;             // entries of SamplingParams::bad_words
inline constexpr int kMaxStopStrings = 64;           // entries of `stop`
inline constexpr int kMaxBadWordTokens = 64;         // ids of one of them
inline constexpr size_t kMaxGrammarBytes = 1 << 20;  // SamplingParams::grammar

// A token's log-probability under the model's distribution at that step:
// log-softmax of the raw logits, before temperature, top-k or top-p (as
// vLLM reports them), so that it is the same however the token was chosen.
struct TopLogprob {
  int token = 0;
  float logprob = 0;
};

struct TokenLogprobs {
  float logprob = 0;            // the sampled token's
  std::vector<TopLogprob> top;  // the likeliest first (ties: the lower id first)
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
