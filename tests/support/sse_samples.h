#pragma once
// Completion streams as an OpenAI-compatible server sends them, for the tests
// of the client side (the SSE parser, CompletionStream, the serving bench).
#include <nlohmann/json.hpp>
#include <string>

namespace troupe::test {

// One event with a text chunk and no finish reason.
inline std::string token_chunk(const std::string& text) {
  return "data: " +
         nlohmann::json{{"id", "cmpl-1"},
                        {"object", "text_completion"},
                        {"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}}
             .dump() +
         "\n\n";
}

// A comment, `tokens` text chunks (t0, t1, ...), the finish chunk, the usage
// chunk when asked, and [DONE].
inline std::string sample_stream(int tokens, bool usage) {
  using nlohmann::json;
  std::string s = ": keep-alive comment\n\n";
  for (int i = 0; i < tokens; ++i) {
    std::string text = "t";
    text.append(std::to_string(i));
    s += token_chunk(text);
  }
  s += "data: " +
       json{{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}}}}.dump() +
       "\n\n";
  if (usage)
    s += "data: " +
         json{{"choices", json::array()},
              {"usage", {{"prompt_tokens", 4}, {"completion_tokens", tokens}, {"total_tokens", 9}}}}
             .dump() +
         "\n\n";
  return s + "data: [DONE]\n\n";
}

}  // namespace troupe::test
