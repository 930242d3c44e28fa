// A chat answer's reasoning told from its reply (service/reasoning_filter.h): the same
// split however the answer's text arrives in pieces.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service/reasoning_filter.h"

namespace troupe {
namespace {

struct Whole {
  std::string reasoning, content;
  bool has = false;
};

Whole run(ReasoningParser parser, bool opened, const std::vector<std::string>& pieces) {
  ReasoningFilter f(reasoning_start(parser, opened ? "<think>\n" : ""));
  Whole w;
  for (const std::string& p : pieces) {
    const ReasoningSplit s = f.push(p);
    w.reasoning += s.reasoning;
    w.content += s.content;
  }
  const ReasoningSplit s = f.finish();
  w.reasoning += s.reasoning;
  w.content += s.content;
  w.has = f.has_reasoning();
  return w;
}

TEST(Reasoning, TheSplitIsTheSameHoweverTheTextArrives) {
  struct Case {
    ReasoningParser parser;
    bool opened;
    std::string text, reasoning, content;
    bool has;
  };
  const std::vector<Case> cases = {
      {ReasoningParser::Qwen3, false, "<think>a</think>b", "a", "b", true},
      {ReasoningParser::Qwen3, false, "\n <think>a <th</think>", "a <th", "", true},
      {ReasoningParser::Qwen3, false, "no <think>here</think>", "", "no <think>here</think>",
       false},
      {ReasoningParser::Qwen3, false, "<thin", "", "<thin", false},
      {ReasoningParser::Qwen3, true, "a</think>b</think>", "a", "b</think>", true},
      {ReasoningParser::DeepSeekR1, false, "a</thi", "a</thi", "", true},
      {ReasoningParser::DeepSeekR1, false, "<think>\nx</think>\n\ny", "\nx", "\n\ny", true},
      {ReasoningParser::None, false, "<think>a</think>b", "", "<think>a</think>b", false},
  };
  for (const Case& c : cases) {
    for (size_t cut = 0; cut <= c.text.size(); ++cut)
      for (size_t cut2 = cut; cut2 <= c.text.size(); ++cut2) {
        const Whole w =
            run(c.parser, c.opened,
                {c.text.substr(0, cut), c.text.substr(cut, cut2 - cut), c.text.substr(cut2)});
        ASSERT_EQ(w.reasoning, c.reasoning) << c.text << " cut at " << cut << ", " << cut2;
        ASSERT_EQ(w.content, c.content) << c.text << " cut at " << cut << ", " << cut2;
        ASSERT_EQ(w.has, c.has) << c.text;
      }
  }
}

TEST(Reasoning, APromptThatEndsInThinkOpensTheReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("x<think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
  EXPECT_EQ(reasoning_start(ReasoningParser::Qwen3, "<|im_start|>assistant\n"),
            ReasoningStart::Optional);
  EXPECT_EQ(reasoning_start(ReasoningParser::Qwen3, "<|im_start|>assistant\n<think>\n"),
            ReasoningStart::Open);
  EXPECT_EQ(reasoning_start(ReasoningParser::DeepSeekR1, ""), ReasoningStart::Open);
  EXPECT_EQ(reasoning_start(ReasoningParser::None, "<think>"), ReasoningStart::None);
  // Qwen3's template with enable_thinking false closes it: all reply.
  EXPECT_EQ(reasoning_start(ReasoningParser::Qwen3, "assistant\n<think>\n\n</think>\n\n"),
            ReasoningStart::None);
  EXPECT_EQ(reasoning_start(ReasoningParser::DeepSeekR1, "<think>\n\n</think>\n\n"),
            ReasoningStart::None);
}

}  // namespace
}  // namespace troupe
