#pragma once
// The OpenAI-compatible completions and chat completions APIs as pure
// functions: request parsing and validation (with OpenAI/vLLM-style error
// messages), response and server-sent-event builders. A chat request becomes
// a completion of its rendered messages (net/chat_template.h): the same
// parameters, the same path through the runtime, another response shape.
// Nothing here does I/O, so all of it is unit-tested without a server.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "net/chat_template.h"
#include "net/tool_calls.h"
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
  std::string name;         // the only accepted `model`
  int context_length = 0;   // prompt + completion tokens
  int vocab_size = 0;       // valid token ids: [0, vocab_size)
  int max_tokens_cap = 0;   // largest accepted max_tokens; <= 0: only the context bounds it
  int priority_levels = 0;  // valid priorities: 0 .. priority_levels-1; <= 0: not checked here
  // Whether the engines compute prompt log-probabilities (`echo` with
  // `logprobs`); the CUDA engines do not yet, and such requests get a 400.
  bool prompt_logprobs = true;
  // Why structured output (response_format json_object/json_schema, vLLM's
  // guided_json/guided_choice/guided_grammar, forced tool calls) cannot be
  // served: no tokenizer, or engines that sample on a CUDA device. Empty:
  // it can.
  std::string structured_output_refusal{};
};

// Which endpoint a request came in on, and so which shape its response has.
enum class Api {
  Completions,  // POST /v1/completions: "text_completion"
  Chat,         // POST /v1/chat/completions: "chat.completion(.chunk)"
  Responses,    // POST /v1/responses: a chat, answered as a "response" (net/responses_api.h)
};

// Whether the prompt is a chat's rendered messages (a chat's rules apply).
inline bool is_chat(Api api) {
  return api != Api::Completions;
}

// A validated /v1/completions or /v1/chat/completions request, before
// tokenization (a chat's prompt_text is its rendered messages).
struct CompletionParams {
  Api api = Api::Completions;
  std::string model;
  std::optional<std::string> prompt_text;  // set when the prompt was text
  std::vector<int> prompt_ids;             // set when the prompt was token ids
  // A batch (`prompt` an array of several texts or of several id arrays):
  // each prompt answered as if it came alone, its choices after the
  // previous prompt's. prompt_text and prompt_ids are unset then.
  struct Prompt {
    std::optional<std::string> text;
    std::vector<int> ids;
  };
  std::vector<Prompt> batch;
  int max_tokens = 16;
  // No max_tokens given to a chat: max_tokens is the cap, lowered by
  // resolve_prompt() to what the context leaves after the prompt.
  bool max_tokens_from_context = false;
  float temperature = 1;
  float top_p = 1;
  int top_k = 0;                 // 0: off
  std::optional<uint64_t> seed;  // absent: the server picks one
  float presence_penalty = 0;    // see SamplingParams
  float frequency_penalty = 0;
  float repetition_penalty = 1;                   // vLLM extension
  std::vector<std::pair<int, float>> logit_bias;  // ids ascending
  float min_p = 0;                                // vLLM extensions, see SamplingParams
  int min_tokens = 0;
  std::vector<int> stop_token_ids;          // ascending, unique
  std::vector<int> allowed_token_ids;       // ascending, unique; empty: every id
  std::vector<std::string> bad_words_text;  // as sent; resolve_prompts() tokenizes them
  std::vector<std::vector<int>> bad_words;  // their token ids
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;  // vLLM extension: the text ends with the stop string
  int truncate_prompt_tokens = 0;           // vLLM extension: > 0 keeps the prompt's last this many
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every
  // chunk's "usage" holds the counts so far instead of null.
  bool continuous_usage = false;
  int priority = 0;
  bool return_token_ids = false;  // vLLM extension: ids alongside the text
  bool ignore_eos = false;        // vLLM extension: generate max_tokens whatever the model says
  // Log-probabilities with each token: -1 none, else this many likeliest
  // alternatives too (completions: `logprobs`; chat: `logprobs` with
  // `top_logprobs`).
  int logprobs = -1;
  int n = 1;  // choices: generations of the one prompt, each with its own seed
  // Completions: the text starts with the prompt, and with `logprobs` so do
  // the log-probabilities (the first token's null); max_tokens may be 0.
  bool echo = false;
  // A chat that offered tools (tool_choice auto): the answer's tool calls,
  // in the model's format, become the message's tool_calls.
  ToolCallFormat tool_calls = ToolCallFormat::None;
  // A chat's answer: how its reasoning is told from its reply (the server's
  // reasoning parser).
  ReasoningParser reasoning = ReasoningParser::None;
  // Structured output: the GBNF grammar the answer follows (checked), from
  // response_format, guided_* or a forced tool call; empty: none.
  std::string grammar;
  // Responses: the request's fields its response repeats (instructions,
  // tools, text, ...).
  nlohmann::json response_fields;
};

// The most choices (`n`) one request may ask for, the most prompts in a
// batch, and the most answers (prompts x n) one request may ask for.
inline constexpr int kMaxChoices = 64;
inline constexpr int kMaxBatchPrompts = 64;
inline constexpr int kMaxAnswers = 256;

template <class T>
using Result = std::variant<T, ApiError>;

// Parses and validates a POST /v1/completions body: JSON syntax, field types
// (a known field of the wrong type names the field), value ranges,
// unsupported options (echo, best_of, suffix, penalties,
// logit_bias), `logprobs` an integer 0..kMaxLogprobs, the model name (404), token ids against the
// vocabulary and max_tokens against the cap. Unknown fields are ignored; null means default. The
// context-length check needs the token count: see resolve_prompt().
Result<CompletionParams> parse_completion_request(std::string_view body, const ModelLimits& limits);

// Parses and validates a POST /v1/chat/completions body by the same rules and
// the same code, with `messages` (roles system, user, assistant; "developer"
// is OpenAI's newer name for system; content a string or an array of
// {"type": "text", "text"} parts) rendered by `tmpl` into prompt_text in
// place of `prompt`, `max_completion_tokens` as the newer name of
// `max_tokens` (it wins when both are given; neither: what the context
// leaves, within the cap), `logprobs` a boolean with `top_logprobs`
// 0..kMaxLogprobs (which needs it), and tools, functions and
// response formats other than text refused as unsupported.
Result<CompletionParams> parse_chat_request(std::string_view body, const ModelLimits& limits,
                                            const ChatFormat& tmpl);

// The prompt as token ids: text is encoded (with BOS when the tokenizer has
// one); `tokenizer` may be null, and then only token-id prompts are accepted.
// Checks prompt tokens + max_tokens against the context length, after
// fitting max_tokens to the context when max_tokens_from_context is set.
Result<std::vector<int>> resolve_prompt(CompletionParams& params, const Tokenizer* tokenizer,
                                        const ModelLimits& limits);
// Every prompt of a request as token ids: the one prompt, or each of a
// batch's by resolve_prompt()'s rules (an error names the prompt's index).
Result<std::vector<std::vector<int>>> resolve_prompts(CompletionParams& params,
                                                      const Tokenizer* tokenizer,
                                                      const ModelLimits& limits);
// Bytes of prompt text to tokenize (a batch's, all together).
size_t prompt_text_bytes(const CompletionParams& params);

// The 400 for prompt + completion over the context (vLLM's wording), or nullopt.
std::optional<ApiError> check_context_length(int prompt_tokens, int max_tokens, int context_length);

// ---- responses ----

// "cmpl-" (a chat: "chatcmpl-", a response: "resp_") + 32 hex digits: a
// per-process random nonce and the request id, so ids are unique across
// restarts without coordination. With a `tag` (the client's X-Request-Id):
// "cmpl-<tag>" (chat: "chatcmpl-<tag>", a response: "resp_<tag>").
std::string completion_id(uint64_t nonce, uint64_t request_id, Api api = Api::Completions,
                          std::string_view tag = {});

// "stop" or "length"; Cancelled has no OpenAI name and is never reported.
const char* finish_reason_name(FinishReason r);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // of the prompt, found in the prefix cache
};
nlohmann::json usage_json(const Usage& u);

// What a stream's chunk says of usage: no "usage" field (include_usage off),
// null (the totals come in a last chunk of their own), or the counts so far
// (vLLM's continuous_usage_stats).
struct ChunkUsage {
  ChunkUsage(bool include = false) : include(include) {}  // NOLINT: a bool reads as "null or none"
  ChunkUsage(const Usage& so_far) : include(true), so_far(so_far) {}  // NOLINT
  bool include;
  std::optional<Usage> so_far;
};

struct ResponseMeta {
  std::string id;       // completion_id()
  int64_t created = 0;  // unix seconds
  std::string model;
  Api api = Api::Completions;  // the response's shape
  int index = 0;               // the choice's
  // tool_choice named a function: an answer with its call ends as any other
  // (finish_reason "stop"), as OpenAI's and vLLM's do.
  bool named_tool_call = false;
};

// One generated token's log-probabilities as a response shows them.
struct TokenLogprob {
  std::string token;             // the bytes it stands for (Tokenizer::token_bytes)
  std::optional<float> logprob;  // absent: the runtime gave none
  std::vector<std::pair<std::string, float>> top;  // likeliest first
};

// A choice's "logprobs" for these tokens. Completions (OpenAI's legacy
// shape, as vLLM fills it): {"tokens", "token_logprobs", "top_logprobs": one
// {token: logprob} object per token, the sampled token included,
// "text_offset": each token's byte offset in the completion's text, from
// `text_offset`}. Chat: {"content": [{"token", "logprob", "bytes",
// "top_logprobs": [{"token", "logprob", "bytes"}]}]}. An impossible token's
// -inf is written -9999.0, as OpenAI and vLLM write it.
nlohmann::json logprobs_json(Api api, const std::vector<TokenLogprob>& tokens,
                             int64_t text_offset = 0);

// The non-streaming response: a "text_completion" with choices[].text, or
// for a chat a "chat.completion" with choices[].message {role: "assistant",
// content}. `token_ids` adds a "token_ids" field to the choice (vLLM-style
// extension) when given.
// With `tool_calls` (not empty), a chat's message carries them, its content
// is null when it has no text, and the finish reason is "tool_calls". With
// `reasoning` (a server with a reasoning parser), the message has
// "reasoning_content": the text, or null when the answer had none; its
// content is null when empty.
nlohmann::json completion_response(const ResponseMeta& meta, const std::string& text,
                                   FinishReason reason, const Usage& usage,
                                   const std::vector<int>* token_ids = nullptr,
                                   const nlohmann::json* logprobs = nullptr,
                                   const std::vector<ToolCall>* tool_calls = nullptr,
                                   const std::optional<std::string>* reasoning = nullptr);

// One SSE event: "data: <json>\n\n". A text chunk has finish_reason null;
// the last one carries it. With include_usage every chunk has "usage": null
// and usage_chunk() (choices: []) follows the last one, as OpenAI sends it.
// A chat's chunks are "chat.completion.chunk" with the text as
// delta.content; one with a finish reason and no text has an empty delta.
// `logprobs` (logprobs_json()) fills the choice's "logprobs", else null.
// `reasoning`: the text is a chat's reasoning, delta.reasoning_content.
std::string sse_text_chunk(const ResponseMeta& meta, const std::string& text,
                           std::optional<FinishReason> reason, const ChunkUsage& usage,
                           const std::vector<int>* token_ids = nullptr,
                           const nlohmann::json* logprobs = nullptr, bool reasoning = false);
// A chat stream's first chunk: delta {"role": "assistant", "content": ""}.
std::string sse_role_chunk(const ResponseMeta& meta, const ChunkUsage& usage);
// The chunks that end a stream's choice: the last text with the finish
// reason in one chunk, or for a chat the text (when there is any) and then
// the finish reason with an empty delta.
// With `tool_calls` (not empty): the text, then a chunk whose delta holds the
// whole calls (each with its index), then finish reason "tool_calls".
std::string sse_finish_chunks(const ResponseMeta& meta, const std::string& text,
                              FinishReason reason, const ChunkUsage& usage,
                              const std::vector<int>* token_ids = nullptr,
                              const nlohmann::json* logprobs = nullptr,
                              const std::vector<ToolCall>* tool_calls = nullptr);
std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage);
std::string sse_error(const ApiError& e);  // an error after the stream started
std::string sse_done();                    // "data: [DONE]\n\n"

// GET /v1/models: the list of the one model served.
nlohmann::json models_response(const ModelLimits& limits, int64_t created);
// GET /v1/models/{id}: that model's object, or a 404 (model_not_found), as
// for an unknown `model` in a request.
Result<nlohmann::json> model_response(std::string_view id, const ModelLimits& limits,
                                      int64_t created);

// ---- vLLM's tokenizer endpoints ----

// A POST /tokenize body: `prompt` (a text) or a chat's `messages`, rendered
// by the server's template as /v1/chat/completions renders them
// (`add_generation_prompt`, default true: ending where the assistant's turn
// begins). `add_special_tokens` (default true) adds the BOS the completion
// endpoints add, so that `count` is the usage's prompt_tokens for the same
// text; `return_token_strs` adds each id's piece. `model`, when given, must
// be the served one (404).
struct TokenizeParams {
  std::string text;
  bool chat = false;  // text is rendered `messages`
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
Result<TokenizeParams> parse_tokenize_request(std::string_view body, const ModelLimits& limits,
                                              const ChatFormat& tmpl);
// {"count", "max_model_len", "tokens", "token_strs" (null unless asked)};
// a 400 when the server has no tokenizer.
Result<nlohmann::json> tokenize_response(const TokenizeParams& params, const Tokenizer* tokenizer,
                                         const ModelLimits& limits);
// A POST /detokenize body: `tokens`, ids within the vocabulary (a 400 names
// the first that is not), and `model` as for /tokenize.
Result<std::vector<int>> parse_detokenize_request(std::string_view body, const ModelLimits& limits);
// {"prompt": the ids' text}, as the completions would write it; a 400 when
// the server has no tokenizer.
Result<nlohmann::json> detokenize_response(const std::vector<int>& ids, const Tokenizer* tokenizer);

// `s` as a JSON string literal, appended to `out`: the bytes dump() writes
// for it (invalid UTF-8 replaced by U+FFFD).
void append_json_string(std::string& out, std::string_view s);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD): model
// output cut at a stop string or an odd byte must not break a response. A
// completion's top_logprobs maps list their tokens likeliest first.
std::string dump(const nlohmann::json& j);

}  // namespace troupe::openai
