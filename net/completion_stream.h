#pragma once
// A streamed /v1/completions response as a client sees it: the server-sent
// events read for their tokens, usage, errors and the final [DONE].
#include <chrono>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "net/sse_parser.h"

namespace troupe {

// A usage object's prompt_tokens_details.cached_tokens (0 when absent).
int cached_prompt_tokens(const nlohmann::json& usage);

// Counts output tokens and records when they arrived.
class CompletionStream {
 public:
  using Clock = std::chrono::steady_clock;

  void feed(std::string_view body_bytes, Clock::time_point now);

  bool done() const { return done_; }  // saw data: [DONE]
  // Not empty when the stream carried an error object or was not JSON.
  const std::string& error() const { return error_; }
  // The server's message for an error object.
  const std::string& error_detail() const { return error_detail_; }
  // usage.completion_tokens when the server sent it, else the count from
  // chunks (token_ids when present, else one per chunk with non-empty text).
  int output_tokens() const { return usage_tokens_ ? *usage_tokens_ : counted_tokens_; }
  bool has_usage() const { return usage_tokens_.has_value(); }
  // usage.prompt_tokens_details.cached_tokens when the server sent it.
  int cached_tokens() const { return cached_tokens_; }
  int counted_tokens() const { return counted_tokens_; }
  const std::optional<Clock::time_point>& first_token() const { return first_; }
  const std::optional<Clock::time_point>& last_token() const { return last_; }

 private:
  void event(const std::string& data, Clock::time_point now);
  SseParser sse_;
  bool done_ = false;
  std::string error_;
  std::string error_detail_;
  std::optional<int> usage_tokens_;
  int cached_tokens_ = 0;
  int counted_tokens_ = 0;
  std::optional<Clock::time_point> first_, last_;
};

}  // namespace troupe
