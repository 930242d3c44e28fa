#pragma once
// The choices of one request (`n` per prompt, for each prompt of a batch):
// each a request of its own to the service with its own seed, answered by its
// own CompletionExchange, and put together here into the one response the
// client asked for. Like the exchange, a pure unit: the session feeds it the
// service's events and does what the steps say.
//
// Streamed, every choice's chunks go out as they come, each with its index,
// and the usage (summed) and [DONE] once every choice has ended. Whole, the
// response waits for every choice and lists them by index. Each prompt's
// tokens count once in the usage, the completions' add up. A choice that
// fails fails the request: the others are stopped, and the client gets that
// error (an error event, once streaming). /metrics counts the request once:
// its first token of any choice, its tokens of all, its end.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "net/completion_exchange.h"

namespace troupe {

// What the session does after one event, in this order: stop these
// requests at the service, send the response or the stream's bytes, count
// the figures (once the request has ended).
struct ChoicesStep {
  std::vector<uint64_t> cancel;
  std::optional<Response> response;
  bool start_stream = false;
  std::string events;
  bool end_stream = false;
  std::optional<ExchangeFigures> finished;

  bool ends_response() const { return response.has_value() || end_stream; }
};

// A prompt as its choices' exchanges see it (CompletionExchange's
// prompt_tokens and prompt_tail).
struct ChoicePrompt {
  int tokens = 0;
  std::vector<int> tail;
  // With echo (CompletionParams::echo): the prompt's text and all its ids.
  std::string echo_text{};
  std::vector<int> echo_ids{};
};

class CompletionChoices {
 public:
  using Clock = CompletionExchange::Clock;

  // Choice i answers request_ids[i], a continuation of prompts[i / params.n]
  // (index i in the response); there are prompts x params.n of them. The
  // rest is as for CompletionExchange.
  CompletionChoices(const std::vector<uint64_t>& request_ids,
                    const openai::CompletionParams& params, const openai::ResponseMeta& meta,
                    const std::vector<ChoicePrompt>& prompts, const Tokenizer* tokenizer,
                    Clock::time_point submitted);

  // The service's events for one choice's request; unknown ids and events
  // after the request ended change nothing.
  ChoicesStep on_token(uint64_t request_id, int token_id, const TokenLogprobs* logprobs,
                       Clock::time_point at);
  void on_prompt_logprobs(uint64_t request_id, const std::vector<TokenLogprobs>& entries);
  ChoicesStep on_done(uint64_t request_id, FinishReason reason, int prompt_tokens,
                      int cached_tokens, Clock::time_point at);
  ChoicesStep on_error(uint64_t request_id, const ServiceError& error);
  // The server's own failure: every choice ends with it (the caller stops
  // what still runs at the service: running()).
  ChoicesStep fail(const openai::ApiError& error);
  // The client went away: the request counts as 499.
  ExchangeFigures abandon();

  bool has(uint64_t request_id) const { return index_of(request_id) >= 0; }
  // The requests still running at the service.
  std::vector<uint64_t> running() const;
  bool finished() const { return finished_; }

 private:
  int index_of(uint64_t request_id) const;
  // One choice's step as the request's.
  ChoicesStep merge(size_t i, ExchangeStep step);
  ChoicesStep fail_all(const openai::ApiError& error, std::optional<size_t> failed);
  std::string merged_body() const;
  // The request's figures from its choices' (figures_), with this status.
  ExchangeFigures request_figures(int status) const;
  int prompt_tokens() const;  // all prompts'
  openai::Usage usage(int completion_tokens) const;

  std::vector<uint64_t> ids_;
  std::vector<CompletionExchange> choices_;
  std::vector<bool> ended_;
  std::vector<std::string> bodies_;  // whole responses: each choice's own
  std::vector<int> completion_tokens_;
  std::vector<ExchangeFigures> figures_;  // of the choices that ended
  openai::ResponseMeta meta_;
  int n_;       // choices per prompt
  bool alone_;  // one choice in all: its exchange's steps as they are
  bool stream_, include_usage_;
  std::vector<int> prompt_tokens_;  // per prompt: the service's count once known
  std::vector<int> cached_tokens_;  // per prompt: found in the prefix cache
  bool streaming_ = false;          // the stream's header went out
  bool finished_ = false;
};

}  // namespace troupe
