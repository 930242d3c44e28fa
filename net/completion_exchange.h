#pragma once
// One POST /v1/completions or /v1/chat/completions exchange, from the service's events to what the
// client gets, as a pure unit: no sockets, no clock reads, no registry. The
// session feeds it the service's events with the time each arrived and does
// what the returned steps say: send these bytes, stop the generation, count
// these figures.
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "net/openai_api.h"
#include "net/response.h"
#include "net/responses_api.h"
#include "service/completion_service.h"
#include "service/reasoning_filter.h"
#include "text/stop_strings.h"
#include "text/text_streamer.h"

namespace troupe {

class Metrics;

// What /metrics counts for an exchange that ended.
struct ExchangeFigures {
  int status = 0;  // what the client got; 499: it went away first
  int prompt_tokens = 0;
  int completion_tokens = 0;  // generated: a final end-of-sequence token counts
  // For a 200 only: time to the first token (with at least one), per output
  // token after it (with at least two), and for the whole request.
  std::optional<double> ttft_s, tpot_s, latency_s;
  int cached_tokens = 0;  // of the prompt, found in the prefix cache
};

void record(const ExchangeFigures& figures, Metrics& metrics);

// What the session does after one event, in this order: stop the service's
// generation, send the response or the stream's bytes, count the figures.
struct ExchangeStep {
  bool cancel_service = false;  // our stop string ended it: stop generating
  // A whole response: non-streaming, or an error before the stream started.
  std::optional<Response> response;
  bool start_stream = false;                // send the 200 event-stream header first
  std::string events;                       // server-sent events to send ("" = nothing now)
  bool end_stream = false;                  // these were the stream's last events
  std::optional<ExchangeFigures> finished;  // the exchange ended

  // The response is complete once these bytes are sent.
  bool ends_response() const { return response.has_value() || end_stream; }
};

class CompletionExchange {
 public:
  using Clock = std::chrono::steady_clock;

  // `tokenizer` may be null: then the text is "" and every token is sent as
  // its id. `prompt_tokens` is the count the service was given; the text
  // continues the prompt whose last ids are `prompt_tail` (see
  // TextStreamer::continue_after), so that it reads on from it.
  CompletionExchange(uint64_t request_id, openai::CompletionParams params,
                     openai::ResponseMeta meta, int prompt_tokens, const Tokenizer* tokenizer,
                     Clock::time_point submitted, std::span<const int> prompt_tail = {});

  // This exchange is one choice of several (meta.index says which): a
  // stream's last events leave out the usage and [DONE], and do not end it;
  // CompletionChoices puts the choices together.
  void make_one_of_several() { one_of_several_ = true; }
  // The response starts with the prompt (CompletionParams::echo): its text,
  // and with `logprobs` its tokens' log-probabilities (on_prompt_logprobs).
  void set_echo(std::string prompt_text, std::vector<int> prompt_ids);

  // The service's events; after the exchange ended they change nothing.
  // `logprobs`: what came with the token (null when none did).
  ExchangeStep on_token(int token_id, const TokenLogprobs* logprobs, Clock::time_point at);
  // Those of prompt tokens 1.., before the first token; kept for the echo.
  void on_prompt_logprobs(const std::vector<TokenLogprobs>& entries);
  ExchangeStep on_done(FinishReason reason, int prompt_tokens, int cached_tokens,
                       Clock::time_point at);
  ExchangeStep on_error(const ServiceError& error);
  // The server's own failure (the submission threw, a handler broke).
  ExchangeStep fail(const openai::ApiError& error);
  // The client went away (or the server stops): ends the exchange; the
  // figures count it as 499.
  ExchangeFigures abandon();

  uint64_t request_id() const { return request_id_; }
  bool finished() const { return state_ == State::Finished; }

 private:
  ExchangeStep finish_ok(FinishReason reason, const std::string& tail, Clock::time_point end);
  ExchangeStep finish_error(const openai::ApiError& error);
  ExchangeStep stream(std::string events, bool last);
  // A chat stream's role chunk before its first text (a response's created
  // events), once; else "".
  std::string opening();
  ExchangeFigures figures(int status, std::optional<Clock::time_point> end) const;
  std::string decode(int token_id);
  std::string decode_tail();
  const std::vector<int>* ids_to_send() const;
  // The pending tokens' log-probabilities as the choice's "logprobs" (none
  // when the request did not ask, or a stream has no pending token); the
  // next call starts after them.
  std::optional<nlohmann::json> take_logprobs();
  void add_logprobs(int token_id, const TokenLogprobs* logprobs);
  // A stop string cut the text: the tokens after the cut were never shown,
  // and their log-probabilities are not either (a token the cut splits stays).
  void drop_logprobs_past_text();
  std::string token_text(int token_id) const;
  openai::TokenLogprob token_logprob(int token_id, const TokenLogprobs* logprobs) const;
  // The echoed prompt's text, once (then "").
  std::string take_echo_text();
  // The echoed prompt's log-probabilities in front of `generated`'s, once.
  void prepend_echo_logprobs(nlohmann::json& generated);
  // What a chunk says of usage: with continuous usage the counts so far, the
  // chunk's own tokens included.
  openai::ChunkUsage chunk_usage(int completion_tokens) const;
  int generated_tokens() const { return completion_tokens_ + (ended_on_eos_ ? 1 : 0); }

  uint64_t request_id_;
  openai::CompletionParams params_;
  openai::ResponseMeta meta_;
  int prompt_tokens_;
  int cached_tokens_ = 0;
  const Tokenizer* tokenizer_;
  std::optional<TextStreamer> streamer_;
  StopStringFilter stop_;
  // A chat that offered tools: the answer's tool calls, held and parsed.
  std::optional<openai::ToolCallFilter> tool_calls_;
  // A server with a reasoning parser: the answer's reasoning told from its
  // reply (tool calls are read from the reply).
  std::optional<ReasoningFilter> reasoning_;
  std::string reasoning_text_;  // non-streaming: the reasoning so far
  int reasoning_tokens_ = 0;    // tokens whose text was all reasoning
  // A /v1/responses exchange: its response object and events.
  std::optional<openai::ResponsesWriter> responses_;
  // The text released for a token (or the end) as reasoning and reply, the
  // reply through the tool-call filter.
  ReasoningSplit split(const std::string& text);
  // A stream's chunk of reasoning, or "" for none.
  std::string reasoning_chunk(const std::string& reasoning, int completion_tokens);
  Clock::time_point submitted_, first_token_, last_token_;
  std::string text_;                            // non-streaming: everything released so far
  std::vector<int> ids_;                        // streaming: ids not yet sent; non-streaming: all
  std::vector<openai::TokenLogprob> logprobs_;  // as ids_, when the request asked for them
  int64_t text_offset_ = 0;                     // of the first of logprobs_
  int64_t released_bytes_ = 0;                  // of text given to the client
  int completion_tokens_ = 0;                   // delivered
  // The service ended the sequence on the model's end-of-sequence token:
  // generated and counted in usage (as vLLM and llama-server count it),
  // though never delivered.
  bool ended_on_eos_ = false;
  // Waiting: nothing sent yet, so an error still gets its own status.
  enum class State { Waiting, Streaming, Finished } state_ = State::Waiting;
  bool warned_overflow_ = false;  // logged once per request
  bool warned_undecodable_ = false;
  bool warned_no_logprobs_ = false;
  bool one_of_several_ = false;
  bool opened_ = false;  // a chat stream's role chunk went out
  // Echo: the prompt's text and ids, what came for its tokens, whether its
  // text and log-probabilities went out, and its tokens' bytes (where the
  // completion's text offsets start).
  bool echo_ = false, echo_text_sent_ = false, echo_logprobs_sent_ = false;
  std::string echo_text_;
  std::vector<int> echo_ids_;
  std::vector<TokenLogprobs> prompt_logprobs_;
  int64_t echo_bytes_ = 0;
};

// The service's request for validated parameters and the prompt's ids; the
// seed is `default_seed` unless the client chose one, which choice i (of
// params.n) takes plus i.
CompletionRequest service_request(uint64_t request_id, const openai::CompletionParams& params,
                                  std::vector<int> prompt, uint64_t default_seed, double timeout_s,
                                  int choice = 0);

}  // namespace troupe
