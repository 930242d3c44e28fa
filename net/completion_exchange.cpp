#include "net/completion_exchange.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "metrics/metrics.h"

namespace troupe {

namespace {

double seconds(CompletionExchange::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Where a chat answer's reasoning is, by the server's parser and the
// prompt's end; the text a completion (not a chat) gets is never split.
ReasoningStart answer_reasoning(const openai::CompletionParams& p) {
  if (!openai::is_chat(p.api)) return ReasoningStart::None;
  return reasoning_start(p.reasoning, p.prompt_text ? std::string_view(*p.prompt_text) : "");
}

// The ids of those `texts` that are one token each.
std::vector<int> token_ids(const Tokenizer& tokenizer, std::span<const std::string_view> texts) {
  std::vector<int> ids;
  for (std::string_view text : texts)
    if (const std::vector<int> one = tokenizer.encode(text, /*add_bos=*/false); one.size() == 1)
      ids.push_back(one[0]);
  return ids;
}

}  // namespace

void record(const ExchangeFigures& f, Metrics& m) {
  m.request_finished(f.status);
  // A prompt counts once the model has read it: the request was answered,
  // or generated something before it ended otherwise (refused, queued and
  // timed out, or left by its client before its first token: not read).
  if (f.status == 200 || f.completion_tokens > 0) m.add_prompt_tokens(f.prompt_tokens);
  m.add_generation_tokens(f.completion_tokens);
  if (f.ttft_s) m.observe_time_to_first_token(*f.ttft_s);
  if (f.tpot_s) m.observe_time_per_output_token(*f.tpot_s);
  if (f.latency_s) m.observe_request_latency(*f.latency_s);
}

CompletionExchange::CompletionExchange(uint64_t request_id, openai::CompletionParams params,
                                       openai::ResponseMeta meta, int prompt_tokens,
                                       const Tokenizer* tokenizer, Clock::time_point submitted,
                                       std::span<const int> prompt_tail)
    : request_id_(request_id),
      params_(std::move(params)),
      meta_(std::move(meta)),
      prompt_tokens_(prompt_tokens),
      tokenizer_(tokenizer),
      stop_(params_.stop, params_.include_stop_str_in_output),
      submitted_(submitted) {
  if (tokenizer) {
    streamer_.emplace(*tokenizer);
    streamer_->continue_after(prompt_tail);
  }
  if (openai::is_chat(params_.api) && params_.tool_calls != ToolCallFormat::None) {
    // "chatcmpl-tool-", the completion's own hex, and its choice's index.
    const size_t dash = meta_.id.find('-');
    tool_calls_.emplace(params_.tool_calls,
                        params_.api == openai::Api::Responses
                            ? "call_" + meta_.id.substr(meta_.id.find('_') + 1) + "_"
                            : "chatcmpl-tool-" + meta_.id.substr(dash + 1) + "-" +
                                  std::to_string(meta_.index) + "-");
    if (streamer_)
      streamer_->spell(token_ids(*tokenizer, openai::control_markers(params_.tool_calls)));
  }
  // With a parser, even an answer that cannot have reasoning says so
  // (reasoning_content null).
  if (openai::is_chat(params_.api) && params_.reasoning != ReasoningParser::None)
    reasoning_.emplace(answer_reasoning(params_));
  if (params_.api == openai::Api::Responses) responses_.emplace(meta_, params_.response_fields);
}

ReasoningSplit CompletionExchange::split(const std::string& text) {
  ReasoningSplit out;
  if (reasoning_)
    out = reasoning_->push(text);
  else
    out.content = text;
  if (tool_calls_) out.content = tool_calls_->push(out.content);
  return out;
}

std::string CompletionExchange::reasoning_chunk(const std::string& reasoning,
                                                int completion_tokens) {
  if (reasoning.empty()) return {};
  return openai::sse_text_chunk(meta_, reasoning, std::nullopt, chunk_usage(completion_tokens),
                                nullptr, nullptr, /*reasoning=*/true);
}

void CompletionExchange::set_echo(std::string prompt_text, std::vector<int> prompt_ids) {
  echo_ = true;
  echo_text_ = std::move(prompt_text);
  echo_ids_ = std::move(prompt_ids);
  echo_bytes_ = 0;
  for (int id : echo_ids_) echo_bytes_ += int64_t(token_text(id).size());
}

void CompletionExchange::on_prompt_logprobs(const std::vector<TokenLogprobs>& entries) {
  if (echo_ && !finished()) prompt_logprobs_ = entries;
}

std::string CompletionExchange::take_echo_text() {
  if (!echo_ || echo_text_sent_) return {};
  echo_text_sent_ = true;
  return echo_text_;
}

void CompletionExchange::prepend_echo_logprobs(nlohmann::json& generated) {
  if (!echo_ || echo_logprobs_sent_) return;
  echo_logprobs_sent_ = true;
  // The first token has nothing before it; the others have what the
  // service computed (all of them, unless its engine cannot).
  std::vector<openai::TokenLogprob> prompt;
  for (size_t i = 0; i < echo_ids_.size(); ++i) {
    const bool have = i > 0 && i - 1 < prompt_logprobs_.size();
    prompt.push_back(token_logprob(echo_ids_[i], have ? &prompt_logprobs_[i - 1] : nullptr));
  }
  if (echo_ids_.size() > 1 + prompt_logprobs_.size())
    spdlog::warn(
        "request {}: log-probabilities for {} of the prompt's {} tokens came; the rest "
        "are null",
        request_id_, prompt_logprobs_.size(), echo_ids_.size() - 1);
  nlohmann::json j = openai::logprobs_json(meta_.api, prompt, 0);
  for (auto& [key, values] : j.items())
    values.insert(values.end(), generated[key].begin(), generated[key].end());
  generated = std::move(j);
}

ExchangeStep CompletionExchange::on_token(int token_id, const TokenLogprobs* logprobs,
                                          Clock::time_point at) {
  if (finished()) return {};
  // An echo of the prompt alone: the one token the service samples is not
  // the client's.
  if (params_.max_tokens == 0) return {};
  if (completion_tokens_ >= params_.max_tokens) {
    // A service bug must not make a response longer than the client allowed.
    if (!warned_overflow_)
      spdlog::warn("request {}: the service sent more than max_tokens={} tokens; extra ignored",
                   request_id_, params_.max_tokens);
    warned_overflow_ = true;
    return {};
  }
  if (completion_tokens_ == 0) first_token_ = at;
  last_token_ = at;
  ++completion_tokens_;
  ids_.push_back(token_id);
  add_logprobs(token_id, logprobs);

  // Stop strings are looked for only after min_tokens tokens (vLLM's rule);
  // nothing is held back before, so the text of those goes out as it is.
  std::string out =
      completion_tokens_ <= params_.min_tokens ? decode(token_id) : stop_.push(decode(token_id));
  if (stop_.stopped()) {
    // Our stop string, not the service's: end now and stop the generation.
    ExchangeStep step = finish_ok(FinishReason::Stop, out, at);
    step.cancel_service = true;
    return step;
  }
  released_bytes_ += int64_t(out.size());
  ReasoningSplit piece = split(out);
  out = std::move(piece.content);
  if (!piece.reasoning.empty() && out.empty()) ++reasoning_tokens_;
  if (!params_.stream) {
    text_ += out;
    reasoning_text_ += piece.reasoning;
    return {};
  }
  // Without a tokenizer every token is news (its id); with one, only text
  // is, and the echoed prompt.
  if (out.empty() && piece.reasoning.empty() && tokenizer_ && (!echo_ || echo_text_sent_))
    return {};
  const auto lp = take_logprobs();
  std::string chunk = opening();
  if (responses_) {
    // One call after the other: each numbers its events.
    chunk += responses_->reasoning(piece.reasoning, true);
    chunk += responses_->reply(out, true);
  } else if (!piece.reasoning.empty() && out.empty()) {
    // The token's ids and log-probabilities go with its reasoning.
    chunk += openai::sse_text_chunk(meta_, piece.reasoning, std::nullopt,
                                    chunk_usage(generated_tokens()), ids_to_send(),
                                    lp ? &*lp : nullptr, /*reasoning=*/true);
  } else {
    chunk += reasoning_chunk(piece.reasoning, generated_tokens());
    chunk +=
        openai::sse_text_chunk(meta_, take_echo_text() + out, std::nullopt,
                               chunk_usage(generated_tokens()), ids_to_send(), lp ? &*lp : nullptr);
  }
  ids_.clear();
  return stream(std::move(chunk), /*last=*/false);
}

ExchangeStep CompletionExchange::on_done(FinishReason reason, int prompt_tokens, int cached_tokens,
                                         Clock::time_point at) {
  if (finished()) return {};
  if (reason == FinishReason::Cancelled) {
    // Only this server cancels, and then the exchange has already ended.
    return on_error({ServiceErrorKind::Unavailable, "The request was cancelled by the server.", 1});
  }
  if (prompt_tokens > 0) prompt_tokens_ = prompt_tokens;
  cached_tokens_ = std::max(0, cached_tokens);
  // The service stops a sequence itself only on an end-of-sequence token
  // (stop strings are this exchange's), which max_tokens leaves room for.
  ended_on_eos_ = reason == FinishReason::Stop && completion_tokens_ < params_.max_tokens;
  if (params_.max_tokens == 0) reason = FinishReason::Length;  // the prompt alone was asked for
  std::string out = stop_.push(decode_tail());
  if (stop_.stopped()) {
    reason = FinishReason::Stop;
  } else {
    out += stop_.flush();
  }
  return finish_ok(reason, out, at);
}

ExchangeStep CompletionExchange::on_error(const ServiceError& error) {
  return fail(openai::from_service_error(error));
}

ExchangeStep CompletionExchange::fail(const openai::ApiError& error) {
  if (finished()) return {};
  return finish_error(error);
}

ExchangeFigures CompletionExchange::abandon() {
  state_ = State::Finished;
  return figures(499, std::nullopt);
}

ExchangeStep CompletionExchange::finish_ok(FinishReason reason, const std::string& tail,
                                           Clock::time_point end) {
  const openai::Usage usage{prompt_tokens_, generated_tokens(), cached_tokens_};
  ExchangeStep step;
  released_bytes_ += int64_t(tail.size());
  if (stop_.stopped()) drop_logprobs_past_text();
  const auto lp = take_logprobs();
  ReasoningSplit piece = split(tail);
  if (reasoning_) {
    // What the reasoning filter held: its reply part goes through the
    // tool-call filter like the rest.
    ReasoningSplit held = reasoning_->finish();
    piece.reasoning += held.reasoning;
    piece.content += tool_calls_ ? tool_calls_->push(held.content) : held.content;
  }
  std::string text = std::move(piece.content);
  std::vector<openai::ToolCall> calls;
  if (tool_calls_) {
    openai::ParsedAnswer answer = tool_calls_->finish();
    text += answer.content;
    calls = std::move(answer.calls);
  }
  const std::vector<openai::ToolCall>* called = calls.empty() ? nullptr : &calls;
  if (responses_) {
    if (params_.stream) {
      std::string events = opening();
      events += responses_->reasoning(piece.reasoning, true);
      events += responses_->reply(text, true);
      events += responses_->finish_stream(reason, usage, reasoning_tokens_, calls);
      step = stream(std::move(events), /*last=*/true);
    } else {
      responses_->reasoning(reasoning_text_ + piece.reasoning, false);
      responses_->reply(text_ + text, false);
      step.response.emplace();
      step.response->body =
          openai::dump(responses_->finish(reason, usage, reasoning_tokens_, calls));
    }
  } else if (params_.stream) {
    std::string events = opening() + reasoning_chunk(piece.reasoning, usage.completion_tokens) +
                         openai::sse_finish_chunks(meta_, take_echo_text() + text, reason,
                                                   chunk_usage(usage.completion_tokens),
                                                   ids_to_send(), lp ? &*lp : nullptr, called);
    // One choice of several: the stream goes on with the others'
    // (CompletionChoices ends it).
    const bool last = !one_of_several_;
    if (last && params_.include_usage) events += openai::sse_usage_chunk(meta_, usage);
    if (last) events += openai::sse_done();
    step = stream(std::move(events), last);
  } else {
    text_ += text;
    reasoning_text_ += piece.reasoning;
    std::optional<std::string> reasoning;
    if (reasoning_ && reasoning_->has_reasoning()) reasoning = reasoning_text_;
    step.response.emplace();
    step.response->body = openai::dump(openai::completion_response(
        meta_, take_echo_text() + text_, reason, usage, ids_to_send(), lp ? &*lp : nullptr, called,
        reasoning_ ? &reasoning : nullptr));
  }
  state_ = State::Finished;
  step.finished = figures(200, end);
  return step;
}

ExchangeStep CompletionExchange::finish_error(const openai::ApiError& error) {
  ExchangeStep step;
  if (state_ == State::Streaming) {
    step = stream(
        responses_ ? responses_->error(error) : openai::sse_error(error) + openai::sse_done(),
        /*last=*/true);
  } else {
    step.response = error_response(error);
  }
  state_ = State::Finished;
  step.finished = figures(error.status, std::nullopt);
  return step;
}

openai::ChunkUsage CompletionExchange::chunk_usage(int completion_tokens) const {
  if (!params_.continuous_usage) return params_.include_usage;
  return openai::Usage{prompt_tokens_, completion_tokens, cached_tokens_};
}

std::string CompletionExchange::opening() {
  if (responses_) return responses_->open();
  if (meta_.api != openai::Api::Chat || opened_) return {};
  opened_ = true;
  return openai::sse_role_chunk(meta_, chunk_usage(0));
}

// The stream's header goes out with its first events, not at submission, so
// that an error before any token (429, 503) still gets its own status.
ExchangeStep CompletionExchange::stream(std::string events, bool last) {
  ExchangeStep step;
  step.start_stream = state_ == State::Waiting;
  state_ = State::Streaming;
  step.events = std::move(events);
  step.end_stream = last;
  return step;
}

ExchangeFigures CompletionExchange::figures(int status,
                                            std::optional<Clock::time_point> end) const {
  ExchangeFigures f;
  f.status = status;
  f.prompt_tokens = prompt_tokens_;
  f.cached_tokens = cached_tokens_;
  f.completion_tokens = generated_tokens();
  if (status != 200 || !end) return f;
  if (completion_tokens_ > 0) f.ttft_s = seconds(first_token_ - submitted_);
  if (completion_tokens_ > 1)
    f.tpot_s = seconds(last_token_ - first_token_) / (completion_tokens_ - 1);
  f.latency_s = seconds(*end - submitted_);
  return f;
}

std::string CompletionExchange::decode(int token_id) {
  if (!streamer_) return {};
  try {
    return streamer_->put(token_id);
  } catch (const std::exception& e) {
    // A model may have more vocabulary rows than its tokenizer has tokens
    // (padded embeddings): such a token is no text, as in Hugging Face's
    // decoding; said once per request.
    if (!warned_undecodable_)
      spdlog::warn("request {}: token {} cannot be decoded (no text for it): {}", request_id_,
                   token_id, e.what());
    warned_undecodable_ = true;
    return {};
  }
}

std::string CompletionExchange::decode_tail() {
  if (!streamer_) return {};
  try {
    return streamer_->finish();
  } catch (const std::exception& e) {
    spdlog::warn("request {}: decoding the tail failed: {}", request_id_, e.what());
    return {};
  }
}

const std::vector<int>* CompletionExchange::ids_to_send() const {
  return (params_.return_token_ids || !tokenizer_) ? &ids_ : nullptr;
}

std::string CompletionExchange::token_text(int token_id) const {
  if (tokenizer_) {
    try {
      return tokenizer_->token_bytes(token_id);
    } catch (const std::exception&) {
      // Not in the vocabulary: shown as its id, as without a tokenizer.
    }
  }
  return "token_id:" + std::to_string(token_id);
}

openai::TokenLogprob CompletionExchange::token_logprob(int token_id,
                                                       const TokenLogprobs* logprobs) const {
  openai::TokenLogprob t{token_text(token_id), std::nullopt, {}};
  if (!logprobs) return t;
  t.logprob = logprobs->logprob;
  for (const TopLogprob& alt : logprobs->top) {
    if (int(t.top.size()) == params_.logprobs) break;
    t.top.emplace_back(token_text(alt.token), alt.logprob);
  }
  return t;
}

void CompletionExchange::add_logprobs(int token_id, const TokenLogprobs* logprobs) {
  if (params_.logprobs < 0) return;
  if (!logprobs && !warned_no_logprobs_) {
    spdlog::warn("request {}: the runtime sent a token without the log-probabilities asked for",
                 request_id_);
    warned_no_logprobs_ = true;
  }
  logprobs_.push_back(token_logprob(token_id, logprobs));
}

void CompletionExchange::drop_logprobs_past_text() {
  int64_t offset = text_offset_;
  size_t keep = 0;
  while (keep < logprobs_.size() && offset < released_bytes_)
    offset += int64_t(logprobs_[keep++].token.size());
  logprobs_.resize(keep);
}

std::optional<nlohmann::json> CompletionExchange::take_logprobs() {
  // A stream's chunk without tokens (the finish reason alone) has none, as
  // OpenAI sends it; a whole response always has them, maybe empty.
  // An echo's prompt tokens come first, once; the completion's offsets
  // start after them.
  const bool echo_pending = echo_ && !echo_logprobs_sent_;
  if (params_.logprobs < 0 || (params_.stream && logprobs_.empty() && !echo_pending))
    return std::nullopt;
  nlohmann::json j = openai::logprobs_json(meta_.api, logprobs_, echo_bytes_ + text_offset_);
  prepend_echo_logprobs(j);
  for (const auto& t : logprobs_) text_offset_ += int64_t(t.token.size());
  logprobs_.clear();
  return j;
}

CompletionRequest service_request(uint64_t request_id, const openai::CompletionParams& params,
                                  std::vector<int> prompt, uint64_t default_seed, double timeout_s,
                                  int choice) {
  CompletionRequest r;
  r.id = request_id;
  r.prompt = std::move(prompt);
  // An echo of the prompt alone still samples one token, which is dropped.
  r.max_tokens = std::max(1, params.max_tokens);
  r.sampling.temperature = params.temperature;
  r.sampling.top_p = params.top_p;
  r.sampling.top_k = params.top_k;
  r.sampling.seed = params.seed ? *params.seed + uint64_t(choice) : default_seed;
  r.sampling.logprobs = params.logprobs;
  if (params.echo && params.logprobs >= 0) r.sampling.prompt_logprobs = params.logprobs;
  r.sampling.presence_penalty = params.presence_penalty;
  r.sampling.frequency_penalty = params.frequency_penalty;
  r.sampling.repetition_penalty = params.repetition_penalty;
  r.sampling.logit_bias = params.logit_bias;
  r.sampling.min_p = params.min_p;
  r.sampling.min_tokens = params.min_tokens;
  r.sampling.stop_token_ids = params.stop_token_ids;
  r.sampling.allowed_token_ids = params.allowed_token_ids;
  r.sampling.bad_words = params.bad_words;
  r.sampling.grammar = params.grammar;
  if (!params.grammar.empty()) r.sampling.reasoning = answer_reasoning(params);
  r.priority = params.priority;
  r.timeout_s = timeout_s;
  r.ignore_eos = params.ignore_eos;
  return r;
}

}  // namespace troupe
