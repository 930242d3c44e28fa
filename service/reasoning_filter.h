#pragma once
// A chat answer's reasoning ("<think>...</think>") apart from its reply, as
// vLLM's reasoning parsers split it (server.reasoning_parser): whole, and
// streamed, where a piece that may be the start of a marker is held until
// the next one says. The front end splits the answer's text with it; an
// engine following a grammar splits the same tokens with it, so that the
// grammar shapes exactly the reply the client is given.
#include <algorithm>
#include <string>
#include <string_view>

#include "service/chat_template.h"
#include "service/request.h"

namespace troupe {

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

inline constexpr std::string_view kReasoningOpen = "<think>";
inline constexpr std::string_view kReasoningClose = "</think>";

inline bool is_reasoning_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// Whether a rendered prompt leaves the answer inside a reasoning block.
inline bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_reasoning_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kReasoningOpen);
}

// Whether a rendered prompt ends with a closed reasoning block (Qwen3's
// template with enable_thinking false): the answer is all reply.
inline bool prompt_closes_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_reasoning_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kReasoningClose);
}

// Where the answer to `prompt` has its reasoning, under `parser`.
inline ReasoningStart reasoning_start(ReasoningParser parser, std::string_view prompt) {
  if (parser == ReasoningParser::None || prompt_closes_reasoning(prompt))
    return ReasoningStart::None;
  if (parser == ReasoningParser::DeepSeekR1 || prompt_opens_reasoning(prompt))
    return ReasoningStart::Open;
  return ReasoningStart::Optional;
}

class ReasoningFilter {
 public:
  explicit ReasoningFilter(ReasoningStart start)
      : state_(start == ReasoningStart::None ? State::Content : State::Start),
        had_reasoning_(start == ReasoningStart::Open) {}

  // The part of `text` that is reasoning for certain, and the part that is
  // content, now.
  ReasoningSplit push(std::string_view text) {
    ReasoningSplit out;
    held_ += text;
    for (;;) {
      if (state_ == State::Content) {
        out.content += held_;
        held_.clear();
        return out;
      }
      if (state_ == State::Start) {
        // Leading whitespace, then "<think>" or not.
        const std::string_view rest = held_after_space();
        if (rest.empty() ||
            (rest.size() < kReasoningOpen.size() && kReasoningOpen.starts_with(rest)))
          return out;  // only whitespace, or the start of the marker, so far: wait
        if (rest.starts_with(kReasoningOpen)) {
          held_.erase(0, held_.size() - rest.size() + kReasoningOpen.size());
          had_reasoning_ = true;
          state_ = State::Reasoning;
          continue;
        }
        // Started inside the reasoning: the answer may still write "<think>"
        // itself first, which Start drops.
        state_ = had_reasoning_ ? State::Reasoning : State::Content;
        continue;
      }
      // Reasoning: up to "</think>".
      const size_t close = held_.find(kReasoningClose);
      if (close != std::string::npos) {
        out.reasoning += held_.substr(0, close);
        held_.erase(0, close + kReasoningClose.size());
        state_ = State::Content;
        continue;
      }
      const size_t keep = partial_close();
      out.reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
  }

  // At the end: what was held.
  ReasoningSplit finish() {
    ReasoningSplit out;
    if (state_ == State::Reasoning || (state_ == State::Start && had_reasoning_))
      out.reasoning = std::move(held_);
    else
      out.content = std::move(held_);
    held_.clear();
    return out;
  }

  // Whether the answer has reasoning at all (reasoning_content is a string,
  // not null).
  bool has_reasoning() const { return had_reasoning_; }
  // Whatever comes next is content.
  bool in_content() const { return state_ == State::Content; }
  // Nothing but whitespace, and perhaps the first bytes of "<think>", so
  // far, in an answer that may have no reasoning: the next text decides.
  bool undecided() const { return state_ == State::Start && !had_reasoning_; }
  // What is held for the next text to decide: whitespace, a part of a marker.
  std::string_view held() const { return held_; }
  // What is held after its leading whitespace.
  std::string_view held_after_space() const {
    const size_t first = held_.find_first_not_of(" \n\t\r");
    return first == std::string::npos ? std::string_view() : std::string_view(held_).substr(first);
  }

 private:
  enum class State { Start, Reasoning, Content };

  // How many of the held bytes are the first bytes of "</think>".
  size_t partial_close() const {
    for (size_t n = std::min(held_.size(), kReasoningClose.size() - 1); n > 0; --n)
      if (kReasoningClose.substr(0, n) == std::string_view(held_).substr(held_.size() - n))
        return n;
    return 0;
  }

  State state_;
  bool had_reasoning_;
  std::string held_;
};

}  // namespace troupe
