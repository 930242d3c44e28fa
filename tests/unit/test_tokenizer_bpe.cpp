// Hugging Face tokenizer.json (byte-level BPE) against the tokenizers
// library's own answers: tests/data/tokenizers holds three real tokenizers
// cut to their first 1500 tokens (Llama 3.1's, Qwen's, GPT-2's; the README
// there says how) and, for 111 texts, the ids, the ids with the
// post-processor's tokens and the decoded text that library gives.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/test_support.h"
#include "text/bpe_tokenizer.h"
#include "text/text_streamer.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

std::filesystem::path fixture(const std::string& name) {
  return test::data_path("tokenizers/" + name + ".tokenizer.json");
}

class TokenizerJsonFile : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerJsonFile, EncodesAndDecodesAsHuggingFaceTokenizers) {
  const Tokenizer tok = Tokenizer::load(fixture(GetParam()));
  const auto expected = nlohmann::json::parse(
      test::read_file(test::data_path("tokenizers/" + GetParam() + ".expected.json")));
  int checked = 0;
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int>>();
    SCOPED_TRACE(nlohmann::json(text).dump());
    EXPECT_EQ(tok.encode(text, false), ids);
    EXPECT_EQ(tok.encode(text, tok.bos_id() >= 0), c["ids_with_special"].get<std::vector<int>>());
    const std::string decoded = tok.decode(ids);
    EXPECT_EQ(decoded, c["decoded"].get<std::string>());
    // Streamed one id at a time, the same text.
    TextStreamer streamer(tok);
    std::string streamed;
    for (int id : ids) streamed += streamer.put(id);
    streamed += streamer.finish();
    EXPECT_EQ(streamed, decoded);
    ++checked;
  }
  EXPECT_GE(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, TokenizerJsonFile,
                         ::testing::Values("llama3_1-small", "qwen-small", "gpt2-small"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(TokenizerJson, SpecialTokensPiecesAndBytes) {
  const Tokenizer tok = Tokenizer::load(fixture("llama3_1-small"));
  EXPECT_EQ(tok.bos_id(), 1500);  // the post-processor's <|begin_of_text|>
  EXPECT_TRUE(tok.is_control(1500));
  EXPECT_FALSE(tok.is_control(100));
  const auto ids = tok.encode(" the", false);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(tok.piece(ids[0]), "\xC4\xA0the");  // "Ġthe", as the file spells it
  EXPECT_EQ(tok.token_bytes(ids[0]), " the");
  EXPECT_EQ(tok.piece(1500), "<|begin_of_text|>");
  EXPECT_EQ(tok.decode({1500, ids[0]}), " the");  // control tokens decode to nothing
  EXPECT_THROW((void)tok.decode({tok.vocab_size()}), std::out_of_range);
  // GPT-2's adds nothing: no BOS.
  const Tokenizer gpt2 = Tokenizer::load(fixture("gpt2-small"));
  EXPECT_EQ(gpt2.bos_id(), -1);
  EXPECT_THROW((void)gpt2.encode("x", true), std::runtime_error);
}

TEST(TokenizerJson, StreamerWritesTheControlTokensItIsToldToSpell) {
  const Tokenizer tok = Tokenizer::load(fixture("qwen-small"));
  ASSERT_TRUE(tok.is_control(1501));  // <|im_start|>
  std::vector<int> ids = tok.encode("\xE2\x98\x83 a", false);
  ASSERT_EQ(tok.token_bytes(ids.at(0)), "\xE2");  // the snowman is three byte tokens
  ids.insert(ids.begin() + 1, 1501);              // inside its bytes
  ids.push_back(1502);                            // <|im_end|>, not spelled
  TextStreamer streamer(tok);
  streamer.spell(std::vector<int>{1501});
  std::string out;
  for (int id : ids) out += streamer.put(id);
  EXPECT_EQ(out + streamer.finish(), "<|im_start|>\xE2\x98\x83 a");
}

TEST(TokenizerJson, StreamerHoldsBackACharacterUntilItsLastByte) {
  const Tokenizer tok = Tokenizer::load(fixture("gpt2-small"));
  const auto ids = tok.encode("\xE2\x98\x83!", false);  // ☃ is three byte tokens here
  ASSERT_GE(ids.size(), 3u);
  TextStreamer streamer(tok);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const std::string piece = streamer.put(ids[i]);
    if (i + 2 < ids.size()) {
      EXPECT_EQ(piece, "") << i;
    }
    out += piece;
  }
  out += streamer.put(ids.back());
  EXPECT_EQ(out, "\xE2\x98\x83!");
  // A cut character at the end comes out as U+FFFD, as decode() has it.
  streamer.reset();
  EXPECT_EQ(streamer.put(ids[0]), "");
  EXPECT_EQ(streamer.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode({ids[0]}), "\xEF\xBF\xBD");
}

TEST(TokenizerJson, EosComesFromTheTokenizerConfigBesideIt) {
  test::TempDir dir;
  test::write_file(dir / "tokenizer.json", test::read_file(fixture("qwen-small")));
  test::write_file(dir / "tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  EXPECT_EQ(Tokenizer::load(dir / "tokenizer.json").eos_id(), 1502);
  test::write_file(dir / "tokenizer_config.json", R"({"eos_token": {"content": "<|endoftext|>"}})");
  EXPECT_EQ(Tokenizer::load(dir / "tokenizer.json").eos_id(), 1500);
}

// A tokenizer.json with `edit` applied to the real GPT-2 one.
std::string edited(const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(test::read_file(fixture("gpt2-small")));
  edit(j);
  return j.dump();
}

TEST(TokenizerJson, RefusesWhatItDoesNotComputeNamingIt) {
  using nlohmann::json;
  const std::pair<std::string, std::string> cases[] = {
      {"{not json", "not valid JSON"},
      {"{}", "no \"model\""},
      {edited([](json& j) { j["model"]["type"] = "WordPiece"; }), "WordPiece"},
      {edited([](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
       }),
       "Metaspace"},
      {edited([](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       }),
       "Lowercase"},
      {edited([](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       }),
       "decoder"},
      {edited([](json& j) { j["model"]["byte_fallback"] = true; }), "byte_fallback"},
      {edited([](json& j) { j["model"]["dropout"] = 0.1; }), "dropout"},
      {edited([](json& j) { j["model"]["merges"].push_back("qqq zzz"); }), "qqq zzz"},
      {edited([](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"Regex", "(?<=x)y"}}}, {"behavior", "Isolated"}};
       }),
       "(?<=x)y"},
      {edited([](json& j) {
         j["post_processor"] = {{"type", "Custom"}};
       }),
       "Custom"},
  };
  test::TempDir dir;
  for (const auto& [content, why] : cases) {
    test::write_file(dir / "tokenizer.json", content);
    try {
      (void)Tokenizer::load(dir / "tokenizer.json");
      ADD_FAILURE() << why << ": accepted";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
      EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
    }
  }
}

// A vocabulary without a byte's token (SmolLM2's lacks a few): the byte is
// left out, as the tokenizers library does, or is the unknown token.
TEST(TokenizerJson, AByteWithoutATokenIsDroppedOrUnknown) {
  using nlohmann::json;
  const std::string micro = "\xC2\xB5";  // U+00B5, byte 0xB5's spelling
  const auto without = [&](const json& unk) {
    return edited([&](json& j) {
      j["model"]["vocab"].erase(micro);
      json merges = json::array();
      for (const json& m : j["model"]["merges"])
        if (m.get<std::string>().find(micro) == std::string::npos) merges.push_back(m);
      j["model"]["merges"] = merges;
      j["model"]["unk_token"] = unk;
    });
  };
  test::TempDir dir;
  test::write_file(dir / "tokenizer.json", without(nullptr));
  const Tokenizer dropped = Tokenizer::load(dir / "tokenizer.json");
  // "aõb" is a, C3 B5, b: without B5 it decodes as "a", a cut character, "b".
  EXPECT_EQ(dropped.decode(dropped.encode("a\xC3\xB5"
                                          "b",
                                          false)),
            "a\xEF\xBF\xBD"
            "b");
  test::write_file(dir / "tokenizer.json", without("<|endoftext|>"));
  const Tokenizer unknown = Tokenizer::load(dir / "tokenizer.json");
  const auto ids = unknown.encode(
      "a\xC3\xB5"
      "b",
      false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 1500), ids.end());
  test::write_file(dir / "tokenizer.json", without("<|no such token|>"));
  EXPECT_THROW((void)Tokenizer::load(dir / "tokenizer.json"), std::runtime_error);
}

TEST(TokenizerJson, SplitBehaviorsAndDigits) {
  using nlohmann::json;
  const auto with_pre = [](json pre) {
    return edited([&](json& j) {
      j["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers", {pre, {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    });
  };
  test::TempDir dir;
  const auto pieces = [&](const std::string& content, const std::string& text) {
    test::write_file(dir / "tokenizer.json", content);
    const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
    std::vector<std::string> out;
    for (int id : tok.encode(text, false)) out.push_back(tok.token_bytes(id));
    return out;
  };
  // Digits one by one: the ids of "1", "2", "3", never "12" or "123".
  const auto digits = pieces(with_pre({{"type", "Digits"}, {"individual_digits", true}}), "a123");
  EXPECT_EQ(digits, (std::vector<std::string>{"a", "1", "2", "3"}));
  // Removed: the delimiter is gone; MergedWithNext: it starts the next piece.
  const json removed = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}};
  std::string joined;
  for (const auto& p : pieces(with_pre(removed), "in-out")) joined += p;
  EXPECT_EQ(joined, "inout");
  const json next = {
      {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithNext"}};
  joined.clear();
  for (const auto& p : pieces(with_pre(next), "a b")) joined += p;
  EXPECT_EQ(joined, "a b");
}

// The pieces a split behavior makes of "a--b-", as the tokenizers library
// folds them: a delimiter joins a neighbour only when that one is text.
TEST(TokenizerJson, SplitBehaviorsFoldAsTheLibraryDoes) {
  using nlohmann::json;
  const auto pieces_of = [&](const std::string& behavior, bool invert = false) {
    const json pre = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"},
                         {"pattern", {{"String", "-"}}},
                         {"behavior", behavior},
                         {"invert", invert}},
                        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    const auto tok = BpeTokenizer::parse(edited([&](json& j) { j["pre_tokenizer"] = pre; }), "t");
    return tok->pre_tokenize_str("a--b-");
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces_of("Isolated"), (V{"a", "-", "-", "b", "-"}));
  EXPECT_EQ(pieces_of("Removed"), (V{"a", "b"}));
  EXPECT_EQ(pieces_of("Contiguous"), (V{"a", "--", "b", "-"}));
  EXPECT_EQ(pieces_of("MergedWithPrevious"), (V{"a-", "-", "b-"}));
  EXPECT_EQ(pieces_of("MergedWithNext"), (V{"a", "-", "-b", "-"}));
  EXPECT_EQ(pieces_of("Removed", true), (V{"-", "-", "-"}));  // inverted: the text is removed
}

// Qwen's NFC normalizer runs before the pre-tokenizer.
TEST(TokenizerJson, NormalizedBeforeSplitting) {
  const auto qwen = BpeTokenizer::parse(test::read_file(fixture("qwen-small")), "qwen");
  EXPECT_EQ(qwen->pre_tokenize_str("cafe\xCC\x81 12"),
            (std::vector<std::string>{"caf\xC3\xA9", " ", "1", "2"}));
}

}  // namespace
}  // namespace troupe
