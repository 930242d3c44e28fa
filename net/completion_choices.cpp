#include "net/completion_choices.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

namespace troupe {

CompletionChoices::CompletionChoices(const std::vector<uint64_t>& request_ids,
                                     const openai::CompletionParams& params,
                                     const openai::ResponseMeta& meta,
                                     const std::vector<ChoicePrompt>& prompts,
                                     const Tokenizer* tokenizer, Clock::time_point submitted)
    : ids_(request_ids),
      ended_(request_ids.size(), false),
      bodies_(request_ids.size()),
      completion_tokens_(request_ids.size(), 0),
      meta_(meta),
      n_(params.n),
      alone_(request_ids.size() == 1),
      stream_(params.stream),
      include_usage_(params.include_usage) {
  if (request_ids.empty() || params.n < 1 ||
      request_ids.size() != prompts.size() * size_t(params.n))
    throw std::invalid_argument("CompletionChoices: " + std::to_string(request_ids.size()) +
                                " request ids for " + std::to_string(prompts.size()) +
                                " prompts with n = " + std::to_string(params.n));
  for (const ChoicePrompt& p : prompts) prompt_tokens_.push_back(p.tokens);
  cached_tokens_.assign(prompts.size(), 0);
  choices_.reserve(ids_.size());
  for (size_t i = 0; i < ids_.size(); ++i) {
    openai::ResponseMeta m = meta;
    m.index = int(i);
    const ChoicePrompt& p = prompts[i / size_t(n_)];
    choices_.emplace_back(ids_[i], params, std::move(m), p.tokens, tokenizer, submitted, p.tail);
    if (!alone_) choices_.back().make_one_of_several();
    if (params.echo) choices_.back().set_echo(p.echo_text, p.echo_ids);
  }
}

int CompletionChoices::prompt_tokens() const {
  int sum = 0;
  for (int t : prompt_tokens_) sum += t;
  return sum;
}

openai::Usage CompletionChoices::usage(int completion_tokens) const {
  int cached = 0;
  for (int t : cached_tokens_) cached += t;
  return {prompt_tokens(), completion_tokens, cached};
}

int CompletionChoices::index_of(uint64_t request_id) const {
  for (size_t i = 0; i < ids_.size(); ++i)
    if (ids_[i] == request_id) return int(i);
  return -1;
}

std::vector<uint64_t> CompletionChoices::running() const {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < ids_.size(); ++i)
    if (!choices_[i].finished()) out.push_back(ids_[i]);
  return out;
}

void CompletionChoices::on_prompt_logprobs(uint64_t request_id,
                                           const std::vector<TokenLogprobs>& entries) {
  const int i = index_of(request_id);
  if (i >= 0) choices_[size_t(i)].on_prompt_logprobs(entries);
}

ChoicesStep CompletionChoices::on_token(uint64_t request_id, int token_id,
                                        const TokenLogprobs* logprobs, Clock::time_point at) {
  const int i = index_of(request_id);
  if (i < 0 || finished_) return {};
  return merge(size_t(i), choices_[size_t(i)].on_token(token_id, logprobs, at));
}

ChoicesStep CompletionChoices::on_done(uint64_t request_id, FinishReason reason, int prompt_tokens,
                                       int cached_tokens, Clock::time_point at) {
  const int i = index_of(request_id);
  if (i < 0 || finished_) return {};
  // Only this server cancels; a choice it did not end this way fails them all.
  if (!alone_ && reason == FinishReason::Cancelled && !choices_[size_t(i)].finished())
    return on_error(request_id,
                    {ServiceErrorKind::Unavailable, "The request was cancelled by the server.", 1});
  return merge(size_t(i), choices_[size_t(i)].on_done(reason, prompt_tokens, cached_tokens, at));
}

ChoicesStep CompletionChoices::on_error(uint64_t request_id, const ServiceError& error) {
  const int i = index_of(request_id);
  if (i < 0 || finished_) return {};
  if (alone_) return merge(0, choices_[0].on_error(error));
  return fail_all(openai::from_service_error(error), size_t(i));
}

ChoicesStep CompletionChoices::fail(const openai::ApiError& error) {
  if (finished_) return {};
  if (alone_) return merge(0, choices_[0].fail(error));
  return fail_all(error, std::nullopt);
}

ExchangeFigures CompletionChoices::abandon() {
  if (alone_) {
    finished_ = true;
    return choices_[0].abandon();
  }
  for (auto& c : choices_)
    if (!c.finished()) figures_.push_back(c.abandon());
  finished_ = true;
  return request_figures(499);
}

ExchangeFigures CompletionChoices::request_figures(int status) const {
  ExchangeFigures out;
  out.status = status;
  out.prompt_tokens = prompt_tokens();
  double tpot_sum = 0;
  int tpot_weight = 0;
  for (const ExchangeFigures& f : figures_) {
    out.completion_tokens += f.completion_tokens;
    if (status != 200) continue;
    if (f.ttft_s && (!out.ttft_s || *f.ttft_s < *out.ttft_s)) out.ttft_s = f.ttft_s;
    if (f.latency_s && (!out.latency_s || *f.latency_s > *out.latency_s))
      out.latency_s = f.latency_s;
    if (f.tpot_s && f.completion_tokens > 1) {
      tpot_sum += *f.tpot_s * (f.completion_tokens - 1);
      tpot_weight += f.completion_tokens - 1;
    }
  }
  if (tpot_weight > 0) out.tpot_s = tpot_sum / tpot_weight;
  return out;
}

ChoicesStep CompletionChoices::merge(size_t i, ExchangeStep s) {
  ChoicesStep out;
  if (s.cancel_service) out.cancel.push_back(ids_[i]);
  if (s.start_stream && !streaming_) out.start_stream = streaming_ = true;
  out.events = std::move(s.events);
  if (alone_) {  // the one exchange's step as it is
    out.finished = s.finished;
    out.response = std::move(s.response);
    out.end_stream = s.end_stream;
    finished_ = choices_[0].finished();
    return out;
  }
  if (!choices_[i].finished() || ended_[i]) return out;
  ended_[i] = true;
  if (s.finished) {
    completion_tokens_[i] = s.finished->completion_tokens;
    prompt_tokens_[i / size_t(n_)] = s.finished->prompt_tokens;  // the service's count
    // A prompt's n choices each look it up: what the best of them found.
    int& cached = cached_tokens_[i / size_t(n_)];
    cached = std::max(cached, s.finished->cached_tokens);
    figures_.push_back(*s.finished);
  }
  if (s.response) bodies_[i] = std::move(s.response->body);
  for (bool e : ended_)
    if (!e) return out;
  finished_ = true;
  out.finished = request_figures(200);
  if (stream_) {
    if (include_usage_) {
      int completion = 0;
      for (int c : completion_tokens_) completion += c;
      out.events += openai::sse_usage_chunk(meta_, usage(completion));
    }
    out.events += openai::sse_done();
    out.end_stream = true;
  } else {
    out.response.emplace();
    out.response->body = merged_body();
  }
  return out;
}

ChoicesStep CompletionChoices::fail_all(const openai::ApiError& error,
                                        std::optional<size_t> failed) {
  ChoicesStep out;
  for (size_t j = 0; j < choices_.size(); ++j) {
    if (choices_[j].finished()) continue;
    // Its figures, with the request's status; its bytes are not sent.
    const ExchangeStep s = choices_[j].fail(error);
    if (s.finished) figures_.push_back(*s.finished);
    // A failed choice stops the others; the server's own failure stops
    // them all, and the session does that itself (cancel_service).
    if (failed && j != *failed) out.cancel.push_back(ids_[j]);
  }
  out.finished = request_figures(error.status);
  if (streaming_) {
    out.events = openai::sse_error(error) + openai::sse_done();
    out.end_stream = true;
  } else {
    out.response = error_response(error);
  }
  finished_ = true;
  return out;
}

// Every choice's own response, as one: their choices by index, each prompt
// once and the completions summed in the usage.
std::string CompletionChoices::merged_body() const {
  using nlohmann::json;
  json merged = json::parse(bodies_[0]);
  json choices = json::array();
  int completion = 0;
  for (size_t i = 0; i < bodies_.size(); ++i) {
    json one = json::parse(bodies_[i]);
    choices.push_back(std::move(one["choices"][0]));
    completion += completion_tokens_[i];
  }
  merged["choices"] = std::move(choices);
  merged["usage"] = openai::usage_json(usage(completion));
  return openai::dump(merged);
}

}  // namespace troupe
