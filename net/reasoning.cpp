#include "net/reasoning.h"

#include <algorithm>

namespace troupe::openai {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// How many of `text`'s last bytes are the first bytes of `marker`.
size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (marker.substr(0, n) == text.substr(text.size() - n)) return n;
  return 0;
}

}  // namespace

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kOpen);
}

ReasoningFilter::ReasoningFilter(ReasoningParser parser, bool opened)
    : state_(parser == ReasoningParser::None ? State::Content : State::Start) {
  // Started inside the reasoning: the answer may still write "<think>"
  // itself first, which Start drops.
  if (parser == ReasoningParser::DeepSeekR1 || (parser != ReasoningParser::None && opened))
    had_reasoning_ = true;
}

ReasoningSplit ReasoningFilter::push(std::string_view text) {
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
      const size_t first = held_.find_first_not_of(" \n\t\r");
      if (first == std::string::npos) return out;  // only whitespace so far: wait
      const std::string_view rest = std::string_view(held_).substr(first);
      if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return out;
      if (rest.starts_with(kOpen)) {
        held_.erase(0, first + kOpen.size());
        had_reasoning_ = true;
        state_ = State::Reasoning;
        continue;
      }
      state_ = had_reasoning_ ? State::Reasoning : State::Content;
      continue;
    }
    // Reasoning: up to "</think>".
    const size_t close = held_.find(kClose);
    if (close != std::string::npos) {
      out.reasoning += held_.substr(0, close);
      held_.erase(0, close + kClose.size());
      state_ = State::Content;
      continue;
    }
    const size_t keep = partial_suffix(held_, kClose);
    out.reasoning += held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
}

ReasoningSplit ReasoningFilter::finish() {
  ReasoningSplit out;
  if (state_ == State::Reasoning || (state_ == State::Start && had_reasoning_))
    out.reasoning = std::move(held_);
  else
    out.content = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace troupe::openai
