#pragma once
// OpenAI's Responses API (POST /v1/responses) over the chat path: a request
// is read as the chat completion it asks for (its `input` items as messages,
// `instructions` as the system message, flat function `tools`, `text.format`
// as response_format) and goes through the same validation, template,
// grammar and runtime; only the answer's shape differs: a "response" object
// whose output items are the reasoning, the message and the function calls,
// and, streamed, the API's typed events (response.created, ...,
// response.output_text.delta, ..., response.completed). Nothing is stored:
// a request carries its whole conversation (no previous_response_id).
// Pure functions and a writer, unit-tested without a server.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "net/openai_api.h"

namespace troupe::openai {

// A POST /v1/responses body as CompletionParams (api Responses), with
// errors that name the Responses fields (`input[2].content`,
// `max_output_tokens`, `text.format.schema`). Refused with a 400: what needs
// stored state (previous_response_id, conversation, item_reference,
// background) and tools other than functions.
Result<CompletionParams> parse_responses_request(std::string_view body, const ModelLimits& limits,
                                                 const ChatFormat& tmpl);

// One response: its object, and when streamed its events, from the
// exchange's text as it is released (reasoning first, then the reply) and
// its end. Item ids derive from the response's.
class ResponsesWriter {
 public:
  ResponsesWriter(const ResponseMeta& meta, nlohmann::json request_fields);

  // Streamed: response.created and response.in_progress, once; "" after.
  std::string open();
  // Streamed events for released text (reasoning text opens a reasoning
  // item; reply text closes it and opens the message). Not streamed: the
  // text is only kept. Either returns "" for empty text.
  std::string reasoning(std::string_view text, bool stream);
  std::string reply(std::string_view text, bool stream);
  // The end: the open items closed (an answer with neither text nor calls
  // still has its message, empty), each call an item, then
  // response.completed (or response.incomplete for max_output_tokens).
  std::string finish_stream(FinishReason reason, const Usage& usage, int reasoning_tokens,
                            const std::vector<ToolCall>& calls);
  // The whole response object (non-streaming); the same as
  // finish_stream()'s last event carries.
  nlohmann::json finish(FinishReason reason, const Usage& usage, int reasoning_tokens,
                        const std::vector<ToolCall>& calls);
  // An error after the stream started: an "error" event.
  std::string error(const ApiError& e);

 private:
  enum class Open { None, Reasoning, Message };
  std::string event(const char* type, nlohmann::json data);
  std::string open_item(Open kind);
  std::string append(Open kind, std::string_view text, bool stream);
  std::string close_item();
  nlohmann::json item(Open kind, const char* status) const;
  void close_items(const std::vector<ToolCall>& calls, std::string* events);
  void settle(FinishReason reason, const Usage& usage, int reasoning_tokens);
  nlohmann::json response(const char* status) const;

  ResponseMeta meta_;
  nlohmann::json fields_;
  std::string hex_;  // the response id's unique part, for item ids
  int sequence_ = 0;
  bool opened_ = false;
  nlohmann::json output_ = nlohmann::json::array();  // items closed so far
  Open open_ = Open::None;
  std::string text_;  // the open item's
  bool message_done_ = false;
  std::string status_ = "in_progress";
  nlohmann::json incomplete_ = nullptr;
  nlohmann::json usage_ = nullptr;
};

}  // namespace troupe::openai
