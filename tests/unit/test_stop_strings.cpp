#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_support.h"
#include "text/stop_strings.h"
#include "text/text_streamer.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

std::string feed(StopStringFilter& f, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += f.push(p);
  return out;
}

TEST(StopStrings, NoStopsPassesThrough) {
  StopStringFilter f({});
  EXPECT_EQ(f.push("abc"), "abc");
  EXPECT_EQ(f.flush(), "");
  EXPECT_FALSE(f.stopped());
}

TEST(StopStrings, StopInsideOnePiece) {
  StopStringFilter f({"END"});
  EXPECT_EQ(f.push("hello END world"), "hello ");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.push("more"), "");
  EXPECT_EQ(f.flush(), "");
}

TEST(StopStrings, StopSplitAcrossTokensIsHeldThenDropped) {
  StopStringFilter f({"\n\n"});
  EXPECT_EQ(f.push("one"), "one");
  EXPECT_EQ(f.push("\n"), "");  // may be the start of the stop string
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.push("\ntwo"), "");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStrings, HeldTailReleasedWhenItDiverges) {
  StopStringFilter f({"STOP"});
  EXPECT_EQ(f.push("a ST"), "a ");
  EXPECT_EQ(f.push("O"), "");
  EXPECT_EQ(f.push("RM"), "STORM");
  EXPECT_FALSE(f.stopped());
}

TEST(StopStrings, FlushReleasesTailAtEnd) {
  StopStringFilter f({"STOP"});
  EXPECT_EQ(f.push("xS"), "x");
  EXPECT_EQ(f.flush(), "S");
}

TEST(StopStrings, EarliestOfSeveralStopsWins) {
  StopStringFilter f({"world", "lo w"});
  EXPECT_EQ(feed(f, {"hel", "lo", " wor", "ld"}), "hel");
  EXPECT_TRUE(f.stopped());
}

// vLLM's include_stop_str_in_output: the text ends with the stop string
// that ended it (the earliest; of two at one place, the one listed first).
TEST(StopStrings, IncludedStopEndsTheText) {
  StopStringFilter f({"world", "lo w"}, true);
  EXPECT_EQ(feed(f, {"hel", "lo", " wor", "ld"}), "hello w");
  EXPECT_TRUE(f.stopped());
  StopStringFilter split({"\n\n"}, true);
  EXPECT_EQ(feed(split, {"one", "\n", "\ntwo"}), "one\n\n");
  StopStringFilter same_place({"ab", "abc"}, true);
  EXPECT_EQ(feed(same_place, {"xabcd"}), "xab");
  StopStringFilter longer_first({"abc", "ab"}, true);
  EXPECT_EQ(feed(longer_first, {"xabcd"}), "xabc");
}

TEST(StopStrings, OverlappingPrefixes) {
  StopStringFilter f({"aab"});
  EXPECT_EQ(feed(f, {"a", "a", "a", "b", "c"}), "a");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStrings, ConcatenationEqualsTruncatedText) {
  // Every split of the text into pieces gives the same output.
  const std::string text = "The cat sat.\nThe dog ran.\n\nEnd of story";
  const std::string expected = "The cat sat.\nThe dog ran.";
  for (size_t step = 1; step <= 5; ++step) {
    StopStringFilter f({"\n\n", "XYZ"});
    std::string out;
    for (size_t i = 0; i < text.size() && !f.stopped(); i += step)
      out += f.push(text.substr(i, step));
    out += f.flush();
    EXPECT_EQ(out, expected) << "step " << step;
    EXPECT_TRUE(f.stopped());
  }
}

TEST(StopStrings, WithRealTokenizerStream) {
  const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  std::vector<int> ids = tok.encode("You will meet a tall stranger. Beware of dogs.", false);
  TextStreamer ts(tok);
  StopStringFilter f({"stranger"});
  std::string out;
  for (int id : ids) {
    out += f.push(ts.put(id));
    if (f.stopped()) break;
  }
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(out, "You will meet a tall ");
}

}  // namespace
}  // namespace troupe
