#pragma once
// A chat answer's reasoning ("<think>...</think>") apart from its reply, as
// vLLM's reasoning parsers split it (server.reasoning_parser): whole, and
// streamed, where a piece that may be the start of a marker is held until
// the next one says.
#include <string>
#include <string_view>

#include "service/chat_template.h"

namespace troupe::openai {

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

class ReasoningFilter {
 public:
  // `opened`: the prompt ends with "<think>" (and whitespace): the
  // template has opened the reasoning, and the answer starts inside it.
  ReasoningFilter(ReasoningParser parser, bool opened);

  // The part of `text` that is reasoning for certain, and the part that is
  // content, now.
  ReasoningSplit push(std::string_view text);
  // At the end: what was held.
  ReasoningSplit finish();
  // Whether the answer has reasoning at all (reasoning_content is a string,
  // not null).
  bool has_reasoning() const { return had_reasoning_; }

 private:
  enum class State { Start, Reasoning, Content };
  State state_;
  std::string held_;
  bool had_reasoning_ = false;
};

// Whether a rendered prompt leaves the answer inside a reasoning block.
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace troupe::openai
