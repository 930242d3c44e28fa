#pragma once
// Tool calls in a model's answer: found in the text as vLLM's tool-call
// parsers find them (hermes, llama3_json), for a chat that offered tools.
// Pure functions and a streaming filter, unit-tested.
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "service/chat_template.h"

namespace troupe::openai {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON text, as Python's json.dumps writes it
  bool operator==(const ToolCall&) const = default;
};

struct ParsedAnswer {
  std::string content;  // the text that is not a tool call
  std::vector<ToolCall> calls;
};

// The format a chat template's tool calls take, by its markers: hermes where
// it writes "<tool_call>", mistral where "[TOOL_CALLS]", llama3_json for
// Llama 3.1's "parameters" JSON; none otherwise.
ToolCallFormat detect_tool_call_format(std::string_view jinja);

// The markers of `format` that tokenizers make control tokens (Mistral's
// "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"), whose text a detokenizer leaves
// out unless told to write it: the parser needs them in the text.
std::span<const std::string_view> control_markers(ToolCallFormat format);

// The answer's text split into content and tool calls. Malformed calls leave
// the whole text as content, as vLLM does. Ids are `id_prefix` and the call's
// number; Mistral's, 9 letters and digits hashed from them.
ParsedAnswer parse_tool_calls(ToolCallFormat format, std::string_view text,
                              const std::string& id_prefix);

// A streamed answer: content goes out as it comes, up to where a tool call
// may begin; from there the text is held until the end, when it is parsed
// (or, not a call after all, released as content).
class ToolCallFilter {
 public:
  ToolCallFilter(ToolCallFormat format, std::string id_prefix)
      : format_(format), id_prefix_(std::move(id_prefix)) {}

  // The part of `text` that is content for certain, now.
  std::string push(std::string_view text);
  // At the end: the content still held, and the calls.
  ParsedAnswer finish();

 private:
  ToolCallFormat format_;
  std::string id_prefix_;
  std::string held_;
  bool in_call_ = false;  // the held text begins a tool call
};

// A message's "tool_calls" (OpenAI's shape); with `indexed`, each has its
// "index", as a stream's delta carries them.
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool indexed);

}  // namespace troupe::openai
