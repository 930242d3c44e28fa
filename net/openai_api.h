#pragma once
// The OpenAI-compatible completions API as pure functions: request parsing
// and validation (with OpenAI/vLLM-style error messages), response and
// server-sent-event builders, and stop-string handling on streamed text.
// Nothing here does I/O, so all of it is unit-tested without a server.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "service/completion_service.h"
#include "text/stop_strings.h"

namespace troupe {
class Tokenizer;
}

namespace troupe::openai {

// An error as the client sees it: HTTP status plus OpenAI's error object
// {"error": {"message", "type", "param", "code"}}. Empty param/code render as null.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
  double retry_after_s = 0;  // > 0: send a Retry-After header (429, 503)
};

ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
// ServiceError kinds to statuses: BadRequest 400, QueueFull 429, Unavailable
// 503, Timeout 504, Internal 500.
ApiError from_service_error(const ServiceError& e);
nlohmann::json error_json(const ApiError& e);
std::string error_body(const ApiError& e);
// Retry-After is whole seconds; round up so clients never retry too early.
int retry_after_header_seconds(double seconds);

// What the server serves and the limits it enforces.
struct ModelLimits {
  std::string name;        // the only accepted `model`
  int context_length = 0;  // prompt + completion tokens
  int vocab_size = 0;      // valid token ids: [0, vocab_size)
  int max_tokens_cap = 0;  // largest accepted max_tokens; <= 0: only the context bounds it
};

// A validated /v1/completions request, before tokenization.
struct CompletionParams {
  std::string model;
  std::optional<std::string> prompt_text;  // set when the prompt was text
  std::vector<int> prompt_ids;             // set when the prompt was token ids
  int max_tokens = 16;
  float temperature = 1;
  float top_p = 1;
  int top_k = 0;                 // 0: off
  std::optional<uint64_t> seed;  // absent: the server picks one
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int priority = 0;
  bool return_token_ids = false;  // vLLM extension: ids alongside the text
  bool ignore_eos = false;        // vLLM extension: generate max_tokens whatever the model says
};

template <class T>
using Result = std::variant<T, ApiError>;

// Parses and validates a POST /v1/completions body: JSON syntax, field types
// (a known field of the wrong type names the field), value ranges,
// unsupported options (n != 1, echo, logprobs, best_of, suffix, penalties,
// logit_bias), the model name (404), token ids against the vocabulary and
// max_tokens against the cap. Unknown fields are ignored; null means default.
// The context-length check needs the token count: see resolve_prompt().
Result<CompletionParams> parse_completion_request(std::string_view body, const ModelLimits& limits);

// The prompt as token ids: text is encoded (with BOS when the tokenizer has
// one); `tokenizer` may be null, and then only token-id prompts are accepted.
// Checks prompt tokens + max_tokens against the context length.
Result<std::vector<int>> resolve_prompt(const CompletionParams& params, const Tokenizer* tokenizer,
                                        const ModelLimits& limits);

// The 400 for prompt + completion over the context (vLLM's wording), or nullopt.
std::optional<ApiError> check_context_length(int prompt_tokens, int max_tokens, int context_length);

// ---- responses ----

// "cmpl-" + 32 hex digits: a per-process random nonce and the request id, so
// ids are unique across restarts without coordination.
std::string completion_id(uint64_t nonce, uint64_t request_id);

// "stop" or "length"; Cancelled has no OpenAI name and is never reported.
const char* finish_reason_name(FinishReason r);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);

struct ResponseMeta {
  std::string id;       // completion_id()
  int64_t created = 0;  // unix seconds
  std::string model;
};

// The non-streaming response. `token_ids` adds a "token_ids" field to the
// choice (vLLM-style extension) when given.
nlohmann::json completion_response(const ResponseMeta& meta, const std::string& text,
                                   FinishReason reason, const Usage& usage,
                                   const std::vector<int>* token_ids = nullptr);

// One SSE event: "data: <json>\n\n". A text chunk has finish_reason null;
// the last one carries it. With include_usage every chunk has "usage": null
// and usage_chunk() (choices: []) follows the last one, as OpenAI sends it.
std::string sse_text_chunk(const ResponseMeta& meta, const std::string& text,
                           std::optional<FinishReason> reason, bool include_usage,
                           const std::vector<int>* token_ids = nullptr);
std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage);
std::string sse_error(const ApiError& e);  // an error after the stream started
std::string sse_done();                    // "data: [DONE]\n\n"

// GET /v1/models.
nlohmann::json models_response(const ModelLimits& limits, int64_t created);

// `s` as a JSON string literal, appended to `out`: the bytes dump() writes
// for it (invalid UTF-8 replaced by U+FFFD).
void append_json_string(std::string& out, std::string_view s);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD): model
// output cut at a stop string or an odd byte must not break a response.
std::string dump(const nlohmann::json& j);

}  // namespace troupe::openai
