// The pre-tokenizer regexes against Hugging Face tokenizers' own splits
// (tests/data/tokenizers/regex-splits.expected.json), and the syntax this
// engine refuses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/test_support.h"
#include "text/pretoken_regex.h"
#include "text/unicode.h"

namespace troupe {
namespace {

std::vector<std::string> split(const PretokenRegex& re, const std::string& text) {
  const unicode::CodePoints cps = unicode::decode_utf8(text);
  std::vector<std::string> pieces;
  size_t last = 0;
  for (size_t pos = 0; pos < cps.points.size();) {
    const auto m = re.find(cps.points, pos);
    if (!m) break;
    if (m->begin > last)
      pieces.push_back(text.substr(cps.offsets[last], cps.offsets[m->begin] - cps.offsets[last]));
    pieces.push_back(
        text.substr(cps.offsets[m->begin], cps.offsets[m->end] - cps.offsets[m->begin]));
    last = pos = m->end;
  }
  if (last < cps.points.size()) pieces.push_back(text.substr(cps.offsets[last]));
  return pieces;
}

TEST(PretokenRegex, SplitsAsHuggingFaceTokenizersDo) {
  const auto data = nlohmann::json::parse(
      test::read_file(test::data_path("tokenizers/regex-splits.expected.json")));
  int checked = 0;
  for (const auto& [name, pattern] : data["patterns"].items()) {
    const PretokenRegex re(pattern.get<std::string>());
    for (const auto& c : data["cases"]) {
      const std::string text = c["text"];
      EXPECT_EQ(split(re, text), c[name].get<std::vector<std::string>>())
          << name << " on " << nlohmann::json(text).dump();
      ++checked;
    }
  }
  EXPECT_GE(checked, 300);
}

TEST(PretokenRegex, LeftmostMatchWithAlternativesInOrder) {
  const PretokenRegex re("ab|abc|x+?y");
  const std::u32string text = U"zzabc xxxy";
  auto m = re.find(text, 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->begin, 2u);
  EXPECT_EQ(m->end, 4u);  // "ab": the first alternative that matches, not the longest
  m = re.find(text, 4);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->begin, 6u);
  EXPECT_EQ(m->end, 10u);
  EXPECT_FALSE(re.find(U"zzz", 0));
}

TEST(PretokenRegex, CountedRepeatsLookaheadAndCaseFolding) {
  const PretokenRegex digits("\\p{N}{1,3}");
  auto m = digits.find(U"x12345", 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->end - m->begin, 3u);
  const PretokenRegex spaces("\\s+(?!\\S)");
  m = spaces.find(U"a   b", 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->begin, 1u);
  EXPECT_EQ(m->end, 3u);  // leaves the last space to the word that follows
  const PretokenRegex contraction("(?i:'s|'re)");
  m = contraction.find(U"WE'RE", 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->begin, 2u);
  EXPECT_EQ(m->end, 5u);
  const PretokenRegex cls("[^\\r\\n\\p{L}\\p{N}]?[a-c\\x{4E2D}]+");
  m = cls.find(U"!abc\u4E2Dd", 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->end, 5u);
}

TEST(PretokenRegex, RefusesWhatItDoesNotComputeNamingIt) {
  const std::pair<const char*, const char*> cases[] = {
      {"^a", "anchor"},
      {"a$", "anchor"},
      {"(?<=a)b", "unsupported group"},
      {"a++", "possessive"},
      {"(a)\\1", "unsupported escape"},
      {"[a[b]]", "nested class"},
      {"(a", "without its ')'"},
      {"a)", "unmatched ')'"},
      {"(a?)*", "may match nothing"},
      {"\\p{Foo}", "unknown property"},
      {"a{3,1}", "m < n"},
      {"*a", "nothing to repeat"},
      {"[z-a]", "before its start"},
  };
  for (const auto& [pattern, why] : cases) {
    try {
      PretokenRegex re(pattern);
      ADD_FAILURE() << pattern << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(why), std::string::npos) << pattern << ": " << msg;
      EXPECT_NE(msg.find(pattern), std::string::npos) << msg;
    }
  }
}

TEST(Unicode, LossyDecodingReplacesEachMaximalInvalidSubsequence) {
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  EXPECT_EQ(unicode::utf8_lossy("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(unicode::utf8_lossy("a\xE2\x98"), "a" + r);  // a cut character: one
  EXPECT_EQ(unicode::utf8_lossy("\xE2\x98x"), r + "x");
  EXPECT_EQ(unicode::utf8_lossy("\xF0\x80"), r + r);          // F0 80 is never valid
  EXPECT_EQ(unicode::utf8_lossy("\xED\xA0\x80"), r + r + r);  // a surrogate
  EXPECT_EQ(unicode::utf8_lossy("\xC0\xAF"), r + r);          // overlong
  EXPECT_EQ(unicode::utf8_lossy("\xFF"), r);
}

TEST(Unicode, IncompleteTailIsOnlyAValidStart) {
  EXPECT_EQ(unicode::incomplete_utf8_tail("ab"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xE2"), 1u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xE2\x98"), 2u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xE2\x98\x83"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xF0\x80"), 0u);  // can never complete
  EXPECT_EQ(unicode::incomplete_utf8_tail("\x98"), 0u);
}

TEST(Unicode, CategoriesAndWhiteSpace) {
  using G = unicode::GeneralCategory;
  EXPECT_EQ(unicode::general_category(U'a'), G::Ll);
  EXPECT_EQ(unicode::general_category(U'\u4E2D'), G::Lo);
  EXPECT_EQ(unicode::general_category(U'\u0661'), G::Nd);  // Arabic-Indic one
  EXPECT_EQ(unicode::general_category(U'\u00BD'), G::No);
  EXPECT_EQ(unicode::general_category(U'\u0301'), G::Mn);
  EXPECT_EQ(unicode::general_category(U'\U0001F600'), G::So);
  EXPECT_EQ(unicode::general_category(0x10FFFF), G::Cn);
  EXPECT_TRUE(unicode::is_white_space(U'\u3000'));
  EXPECT_TRUE(unicode::is_white_space(U'\u0085'));
  EXPECT_FALSE(unicode::is_white_space(U'\u200B'));  // zero width space is not White_Space
}

TEST(Unicode, NfcComposesAndOrdersAsUnicodeSays) {
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::nfc("cafe\xCC\x81"), "caf\xC3\xA9");               // e + acute -> é
  EXPECT_EQ(unicode::nfc("\xE2\x84\xAB"), "\xC3\x85");                  // Angstrom sign -> Å
  EXPECT_EQ(unicode::nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul L+V -> 가
  // d + dot below + dot above: the marks are put in class order, the first composes.
  EXPECT_EQ(unicode::nfc("d\xCC\x87\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");
  // A composition exclusion stays decomposed (U+0958 is KA + NUKTA).
  EXPECT_EQ(unicode::nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
}

}  // namespace
}  // namespace troupe
