#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_support.h"
#include "text/text_streamer.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

std::filesystem::path fortune_tokenizer() {
  return test::model_path("fortune") / "tokenizer.model";
}

const Tokenizer& fortune() {
  static const Tokenizer tok = Tokenizer::load(fortune_tokenizer());
  return tok;
}

// Strings whose round trip must be exact: punctuation, digits, newlines,
// repeated spaces, and non-ASCII text that this 2000-piece model can only
// spell with byte-fallback pieces.
const std::vector<std::string>& samples() {
  static const std::vector<std::string> s = {
      "Hello, world!",
      "The year 1984: 42 + 17 = 59.",
      "line one\nline two\n\nline four",
      "café — naïve ☃",
      "  leading, trailing  and  double spaces  ",
      "\"quotes\" (parens) [brackets] {braces} <angles> ~`!@#$%^&*_-=|\\/?;:'",
      "日本語のテキスト 🎉 emoji, Ελληνικά, русский",
      "You will be married within a year. -- fortune(6)",
      "a",
      "\n",
  };
  return s;
}

// Strict UTF-8 check (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// Streams ids one at a time; returns every chunk, finish() last.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int>& ids) {
  TextStreamer streamer(tok);
  std::vector<std::string> chunks;
  for (int id : ids) chunks.push_back(streamer.put(id));
  chunks.push_back(streamer.finish());
  return chunks;
}

std::string concat(const std::vector<std::string>& chunks) {
  std::string out;
  for (const auto& c : chunks) out += c;
  return out;
}

std::string hex_of(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
    out += ' ';
  }
  return out;
}

std::string ids_str(const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) out += std::to_string(id) + " ";
  return out;
}

TEST(Tokenizer, LoadsFortuneModel) {
  const Tokenizer& tok = fortune();
  EXPECT_EQ(tok.vocab_size(), 2000);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.is_control(1));
  EXPECT_FALSE(tok.is_control(100));
  EXPECT_EQ(tok.piece(13), "<0x0A>");
}

TEST(Tokenizer, RoundTripsText) {
  const Tokenizer& tok = fortune();
  for (const auto& text : samples()) {
    const auto ids = tok.encode(text, /*add_bos=*/false);
    EXPECT_FALSE(ids.empty()) << text;
    for (int id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok.vocab_size());
    }
    EXPECT_EQ(tok.decode(ids), text) << "ids: " << ids_str(ids);
  }
}

TEST(Tokenizer, NonAsciiUsesByteFallback) {
  const Tokenizer& tok = fortune();
  const auto ids = tok.encode("☃", false);
  // U+2603 is E2 98 83; the model has no piece for it.
  int bytes = 0;
  for (int id : ids) bytes += tok.piece(id).rfind("<0x", 0) == 0;
  EXPECT_EQ(bytes, 3) << ids_str(ids);
  EXPECT_EQ(tok.decode(ids), "☃");
}

TEST(Tokenizer, TokenBytesAreWhatEachTokenStandsForAlone) {
  const Tokenizer& tok = fortune();
  // Spaces as spaces, byte pieces as their bytes, control pieces spelled out.
  EXPECT_EQ(tok.token_bytes(13), "\n");
  EXPECT_EQ(tok.token_bytes(2), tok.piece(2));
  std::string joined;
  for (int id : tok.encode("A fool ☃ and\tthe end", false)) joined += tok.token_bytes(id);
  // With the space SentencePiece puts before a text, which decode() drops.
  EXPECT_EQ(joined, " A fool ☃ and\tthe end");
  EXPECT_THROW(tok.token_bytes(2000), std::out_of_range);
}

TEST(Tokenizer, AddsBosWhenAsked) {
  const Tokenizer& tok = fortune();
  for (const auto& text : samples()) {
    const auto plain = tok.encode(text, false);
    const auto with_bos = tok.encode(text, true);
    ASSERT_EQ(with_bos.size(), plain.size() + 1);
    EXPECT_EQ(with_bos[0], 1);
    EXPECT_EQ(std::vector<int>(with_bos.begin() + 1, with_bos.end()), plain);
    // BOS is a control piece: it decodes to nothing.
    EXPECT_EQ(tok.decode(with_bos), text);
  }
  EXPECT_TRUE(tok.encode("", false).empty());
  EXPECT_EQ(tok.encode("", true), std::vector<int>{1});
  EXPECT_EQ(tok.decode({}), "");
}

// A prompt that spells the special tokens means them, as Hugging Face's
// tokenizers and llama.cpp read it (a pre-rendered chat: "...</s>\n<|user|>"):
// the text between is encoded piece by piece, each with SentencePiece's
// space prefix (Hugging Face's legacy Llama tokenizers, llama.cpp).
TEST(Tokenizer, SpelledSpecialTokensAreThoseTokens) {
  const Tokenizer& tok = fortune();
  const auto cat = [](std::initializer_list<std::vector<int>> parts) {
    std::vector<int> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  EXPECT_EQ(tok.encode("A fool</s> and<s>his money", false), cat({tok.encode("A fool", false),
                                                                  {2},
                                                                  tok.encode(" and", false),
                                                                  {1},
                                                                  tok.encode("his money", false)}));
  EXPECT_EQ(tok.encode("</s>", true), (std::vector<int>{1, 2}));
  EXPECT_EQ(tok.encode("<unk><s></s>", false), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(tok.encode("a<</s>>b", false),
            cat({tok.encode("a<", false), {2}, tok.encode(">b", false)}));
  const std::vector<int> partial = tok.encode("<s </s", false);
  EXPECT_EQ(
      std::count(partial.begin(), partial.end(), 1) + std::count(partial.begin(), partial.end(), 2),
      0)
      << "only whole spellings";
  // Decoding drops them (they are control tokens); the text after one kept
  // its own space prefix.
  EXPECT_EQ(tok.decode(tok.encode("A fool</s>and", false)), "A fool and");
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  const Tokenizer& tok = fortune();
  for (int bad : {2000, -1, 1 << 30}) {
    try {
      (void)tok.decode({5, bad, 7});
      FAIL() << "no throw for " << bad;
    } catch (const std::out_of_range& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("2000"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW((void)tok.piece(2000), std::out_of_range);
  EXPECT_THROW((void)tok.is_control(-3), std::out_of_range);
}

TEST(Tokenizer, MissingFileNamesThePath) {
  test::TempDir dir;
  const auto path = dir / "no-such-tokenizer.model";
  try {
    (void)Tokenizer::load(path);
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, CorruptFilesNameThePath) {
  test::TempDir dir;
  const std::string good = test::read_file(fortune_tokenizer());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"garbage.model", "this is not a protobuf"},
      {"empty.model", ""},
      {"truncated.model", good.substr(0, good.size() / 3)},
  };
  for (const auto& [name, bytes] : cases) {
    const auto path = dir / name;
    test::write_file(path, bytes);
    try {
      (void)Tokenizer::load(path);
      FAIL() << "no throw for " << name;
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("not a valid SentencePiece model"), std::string::npos) << msg;
    }
  }
  // A directory: SentencePiece's own Load() would abort the process here.
  try {
    (void)Tokenizer::load(dir.path());
    FAIL() << "no throw for a directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << e.what();
  }
}

// llama2.c's tokenizer.bin of the same vocabulary encodes and decodes as the
// SentencePiece model does: every sample, pieces, specials, streaming.
TEST(Tokenizer, Llama2cTokenizerBinIsTheSentencePieceModel) {
  const Tokenizer bin = Tokenizer::load(test::model_path("fortune") / "llama2c" / "tokenizer.bin");
  const Tokenizer& sp = fortune();
  ASSERT_EQ(bin.vocab_size(), sp.vocab_size());
  EXPECT_EQ(bin.bos_id(), sp.bos_id());
  EXPECT_EQ(bin.eos_id(), sp.eos_id());
  std::vector<std::string> texts = samples();
  texts.push_back("<s>spelled</s> specials and <unk> too");
  texts.push_back("");
  for (const std::string& text : texts) {
    const auto ids = sp.encode(text, true);
    EXPECT_EQ(bin.encode(text, true), ids) << text;
    EXPECT_EQ(bin.decode(ids), sp.decode(ids)) << text;
    TextStreamer streamer(bin);
    std::string streamed;
    for (int id : ids) streamed += streamer.put(id);
    streamed += streamer.finish();
    EXPECT_EQ(streamed, sp.decode(ids)) << text;
  }
  for (int id = 0; id < sp.vocab_size(); ++id) {
    ASSERT_EQ(bin.piece(id), sp.piece(id)) << id;
    ASSERT_EQ(bin.token_bytes(id), sp.token_bytes(id)) << id;
    ASSERT_EQ(bin.is_control(id), sp.is_control(id)) << id;
  }
}

TEST(Tokenizer, BrokenTokenizerBinNamesThePathAndTheProblem) {
  test::TempDir dir;
  const std::string good =
      test::read_file(test::model_path("fortune") / "llama2c" / "tokenizer.bin");
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"empty.bin", "", "header"},
      {"header-only.bin", good.substr(0, 4), "no pieces"},
      {"cut.bin", good.substr(0, good.size() - 3), "ends inside"},
      {"huge-piece.bin", good.substr(0, 8) + std::string("\xff\xff\x00\x00", 4), "length"},
  };
  for (const auto& [name, bytes, why] : cases) {
    const auto path = dir / name;
    test::write_file(path, bytes);
    try {
      (void)Tokenizer::load(path);
      ADD_FAILURE() << "no throw for " << name;
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
    }
  }
}

TEST(Tokenizer, CopiesShareTheModel) {
  Tokenizer copy = fortune();
  EXPECT_EQ(copy.encode("Hello", true), fortune().encode("Hello", true));
}

TEST(TextStreamer, ConcatenationEqualsDecodeOfEncodedText) {
  const Tokenizer& tok = fortune();
  for (const auto& text : samples()) {
    for (bool bos : {false, true}) {
      const auto ids = tok.encode(text, bos);
      const auto chunks = stream(tok, ids);
      EXPECT_EQ(concat(chunks), tok.decode(ids)) << "ids: " << ids_str(ids);
      EXPECT_EQ(concat(chunks), text);
      // Valid input never yields a chunk that splits a character.
      for (const auto& c : chunks) EXPECT_TRUE(valid_utf8(c)) << hex_of(c) << " in " << text;
      EXPECT_EQ(chunks.back(), "") << "nothing should be held back at the end of " << text;
    }
  }
}

TEST(TextStreamer, MultiByteCharacterComesOutWhenComplete) {
  const Tokenizer& tok = fortune();
  const auto ids = tok.encode("a☃b", true);
  const auto chunks = stream(tok, ids);
  // Find the chunk holding the snowman: the two byte pieces before it are silent.
  size_t at = 0;
  while (at < chunks.size() && chunks[at].find("☃") == std::string::npos) ++at;
  ASSERT_LT(at, chunks.size());
  ASSERT_GE(at, 2u);
  EXPECT_EQ(tok.piece(ids[at]), "<0x83>");
  EXPECT_EQ(chunks[at - 1], "");
  EXPECT_EQ(chunks[at - 2], "");
  EXPECT_EQ(concat(chunks), "a☃b");
}

TEST(TextStreamer, LeadingSpaceMatchesWholeDecode) {
  const Tokenizer& tok = fortune();
  // "▁the" alone at the start loses its space; after BOS too; after a lone "▁"
  // it keeps it; mid-text it keeps it.
  const int the = tok.encode("the", false).at(0);
  ASSERT_EQ(tok.piece(the), "▁the");
  const int space = tok.encode(" ", false).at(0);
  const std::vector<std::vector<int>> cases = {
      {the},
      {1, the},
      {1, 1, the, the},
      {space, the},
      {1, space, the},
      {space, space, the},
      {the, space, the},
      {2, the},
      {the, 2, the},
      {0, the},
  };
  for (const auto& ids : cases) {
    EXPECT_EQ(concat(stream(tok, ids)), tok.decode(ids)) << "ids: " << ids_str(ids);
  }
  EXPECT_EQ(concat(stream(tok, {1, the})), "the");
}

TEST(TextStreamer, ConcatenationEqualsDecodeOfRandomIds) {
  const Tokenizer& tok = fortune();
  // Random ids hit every case the model can emit: control and unknown pieces,
  // stray continuation bytes, truncated and overlong sequences, and runs of
  // bytes that form valid characters (biased towards byte pieces for those).
  uint64_t state = 12345;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  const int byte0 = 3;  // <0x00>
  ASSERT_EQ(tok.piece(byte0), "<0x00>");
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int> ids;
    const int len = 1 + int(next(40));
    for (int i = 0; i < len; ++i) {
      const auto kind = next(10);
      if (kind < 4) {
        ids.push_back(int(next(tok.vocab_size())));
      } else if (kind < 6) {
        ids.push_back(byte0 + 0x80 + int(next(64)));  // continuation
      } else if (kind < 8) {
        ids.push_back(byte0 + 0xC0 + int(next(64)));  // lead (some invalid)
      } else if (kind < 9) {
        ids.push_back(int(next(3)));  // unk / BOS / EOS
      } else {
        const auto s = tok.encode(samples()[next(samples().size())], false);
        ids.insert(ids.end(), s.begin(), s.end());
      }
    }
    const auto chunks = stream(tok, ids);
    ASSERT_EQ(concat(chunks), tok.decode(ids)) << "ids: " << ids_str(ids);
  }
}

// A completion continues its prompt: what the streamer gives after the
// prompt's last token is the text decode(prompt + generated) has past
// decode(prompt), the first piece's space included ("life" + " is").
TEST(TextStreamer, AContinuationKeepsItsLeadingSpace) {
  const Tokenizer& tok = fortune();
  const auto continued = [&](const std::vector<int>& prompt, const std::vector<int>& gen) {
    TextStreamer streamer(tok);
    streamer.continue_after(prompt);
    std::string out;
    for (int id : gen) out += streamer.put(id);
    return out + streamer.finish();
  };
  const std::vector<int> prompt = tok.encode("The meaning of life", true);
  const std::vector<int> gen = tok.encode("is the only thing", false);  // "▁is" ...
  ASSERT_EQ(tok.piece(gen.at(0)), "▁is");
  EXPECT_EQ(continued(prompt, gen), " is the only thing");
  // After BOS alone (an empty prompt) the text starts as a text does.
  EXPECT_EQ(continued({1}, gen), "is the only thing");
  // Random prompts (non-ASCII ones end in byte pieces) and continuations:
  // always the text past the prompt's.
  uint64_t state = 99;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int> p = tok.encode(samples()[next(samples().size())], true);
    std::vector<int> g;
    for (int i = 0, n = 1 + int(next(20)); i < n; ++i) g.push_back(int(next(tok.vocab_size())));
    std::vector<int> all = p;
    all.insert(all.end(), g.begin(), g.end());
    const std::string whole = tok.decode(all), head = tok.decode(p);
    ASSERT_EQ(whole.compare(0, head.size(), head), 0) << "ids: " << ids_str(all);
    EXPECT_EQ(continued(p, g), whole.substr(head.size())) << "ids: " << ids_str(all);
  }
}

TEST(TextStreamer, IncompleteTailIsFlushedByFinish) {
  const Tokenizer& tok = fortune();
  const int e2 = 3 + 0xE2, x98 = 3 + 0x98;
  const std::vector<int> ids = {tok.encode("a", false).at(0), e2, x98};
  TextStreamer s(tok);
  EXPECT_EQ(s.put(ids[0]), "a");
  EXPECT_EQ(s.put(ids[1]), "");
  EXPECT_EQ(s.put(ids[2]), "");
  const std::string rest = s.finish();
  EXPECT_EQ("a" + rest, tok.decode(ids));
  EXPECT_NE(rest, "");  // U+FFFD for the broken bytes, as decode() gives
  // finish() resets: the next text starts fresh (its leading space dropped).
  const int the = tok.encode("the", false).at(0);
  EXPECT_EQ(s.put(the), "the");
}

// A spelled control token (a tool-call parser's marker) is written where it
// stands; the text around it reads as without it.
TEST(TextStreamer, SpelledControlTokensAreWrittenWhereTheyStand) {
  const Tokenizer& tok = fortune();
  const int eos = tok.eos_id(), bos = tok.bos_id();
  ASSERT_TRUE(tok.is_control(eos));
  const std::vector<int> hello = tok.encode("Hello", false), world = tok.encode("world", false);
  ASSERT_EQ(world.size(), 1u);                              // "▁world"
  const int e2 = 3 + 0xE2, x98 = 3 + 0x98, x83 = 3 + 0x83;  // the bytes of ☃
  const auto run = [&](const std::vector<int>& ids) {
    TextStreamer s(tok);
    const std::vector<int> spelled = {eos, hello.at(0)};  // an ordinary one is written anyway
    s.spell(spelled);
    std::string out;
    for (int id : ids) out += s.put(id);
    return out + s.finish();
  };
  std::vector<int> ids = hello;
  ids.push_back(eos);
  ids.insert(ids.end(), world.begin(), world.end());
  EXPECT_EQ(run(ids), "Hello</s> world");
  ids.insert(ids.begin(), bos);  // not spelled: left out
  EXPECT_EQ(run(ids), "Hello</s> world");
  ids = {eos};
  ids.insert(ids.end(), world.begin(), world.end());
  EXPECT_EQ(run(ids), "</s>world");  // at the start, as decode() starts a text
  EXPECT_EQ(run({e2, x98, x83, eos, e2, x98, x83}), "☃</s>☃");
  EXPECT_EQ(run({e2, eos, x98, x83}), "</s>☃");  // inside a character: before it
  TextStreamer s(tok);
  EXPECT_THROW(s.spell(std::vector<int>{tok.vocab_size()}), std::out_of_range);
}

TEST(TextStreamer, BadIdThrowsAndLeavesStateAlone) {
  const Tokenizer& tok = fortune();
  const auto ids = tok.encode("Hello there", true);
  TextStreamer s(tok);
  std::string out = s.put(ids[0]);
  EXPECT_THROW((void)s.put(2000), std::out_of_range);
  EXPECT_THROW((void)s.put(-1), std::out_of_range);
  for (size_t i = 1; i < ids.size(); ++i) out += s.put(ids[i]);
  out += s.finish();
  EXPECT_EQ(out, "Hello there");
}

// A Hugging Face directory's SentencePiece model with added tokens past its
// 2000 pieces (as Phi-3's 32000 with <|user|>, <|end|>): 2000-2001 and 2003
// special, 2002 a gap, 2004 a plain added token; and one inside the model.
class AddedTokens : public ::testing::Test {
 protected:
  static constexpr int kEnd = 2000, kAssistant = 2001, kUser = 2003, kPlain = 2004;

  void SetUp() override {
    test::write_file(dir_ / "tokenizer.model", test::read_file(fortune_tokenizer()));
  }
  Tokenizer with_config(const std::string& decoder_entries) {
    test::write_file(dir_ / "tokenizer_config.json",
                     "{\"added_tokens_decoder\": {" + decoder_entries + "}}");
    return Tokenizer::load(dir_ / "tokenizer.model");
  }
  Tokenizer phi_like() {
    return with_config(
        R"("1": {"content": "<s>", "special": true},
           "2000": {"content": "<|end|>", "special": true, "rstrip": true},
           "2001": {"content": "<|assistant|>", "special": true, "rstrip": true},
           "2003": {"content": "<|user|>", "special": true, "rstrip": true},
           "2004": {"content": "<|plain|>", "special": false})");
  }
  test::TempDir dir_;
};

TEST_F(AddedTokens, ExtendTheVocabularyAndAreTheirIdsInAText) {
  const Tokenizer tok = phi_like();
  const Tokenizer& sp = fortune();
  ASSERT_EQ(tok.vocab_size(), 2005);
  // As Phi-3's template writes a turn: rstrip swallows the newline after a
  // tag; the text between tags is encoded on its own.
  const std::vector<int> ids = tok.encode("<|user|>\nA fool<|end|>\n<|assistant|>\n", true);
  std::vector<int> want{1, kUser};
  const std::vector<int> fool = sp.encode("A fool", false);
  want.insert(want.end(), fool.begin(), fool.end());
  want.insert(want.end(), {kEnd, kAssistant});
  EXPECT_EQ(ids, want) << ids_str(ids);
  EXPECT_EQ(tok.encode("plain text", false), sp.encode("plain text", false));
  EXPECT_TRUE(tok.is_control(kEnd));
  EXPECT_TRUE(tok.is_control(2002)) << "a gap stands for nothing";
  EXPECT_FALSE(tok.is_control(kPlain));
  EXPECT_EQ(tok.piece(kUser), "<|user|>");
  EXPECT_EQ(tok.token_bytes(kPlain), "<|plain|>");
  EXPECT_THROW((void)tok.decode({2005}), std::out_of_range);
}

TEST_F(AddedTokens, DecodeAsTransformersDecodesWithoutSpecialTokens) {
  const Tokenizer tok = phi_like();
  const auto ids = [&](const std::string& text) { return tok.encode(text, false); };
  // Special ones drop out as control pieces do; the text after one keeps
  // its own space.
  EXPECT_EQ(tok.decode(ids("<|assistant|>A fool<|end|>")), "A fool");
  EXPECT_EQ(tok.decode(ids("A fool<|end|> and")), "A fool and");
  EXPECT_EQ(tok.decode({kUser, 2002, kEnd}), "");
  // A plain one is its spelling; the space of the piece after it is kept
  // (each stretch of text is encoded with its own space prefix, so
  // "<|plain|>fool" comes back as "<|plain|> fool", as in transformers).
  const auto with = [&](std::vector<int> a, int id, const std::vector<int>& b) {
    a.push_back(id);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  EXPECT_EQ(tok.decode(with(ids("A"), kPlain, ids("fool"))), "A<|plain|> fool");
  EXPECT_EQ(tok.decode(ids("A<|plain|>fool")), "A<|plain|> fool");
  EXPECT_EQ(tok.decode(with({}, kPlain, {3 + 'x'})), "<|plain|>x");
  EXPECT_EQ(tok.decode(with(ids("two"), kEnd, ids("fool"))), "two fool");
}

TEST_F(AddedTokens, StreamingGivesTheDecodedText) {
  const Tokenizer tok = phi_like();
  uint64_t state = 99;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  const std::vector<int> words = tok.encode(" fool money is", false);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int> ids;
    for (int i = 0, len = 1 + int(next(20)); i < len; ++i) {
      const auto kind = next(6);
      if (kind < 2)
        ids.push_back(2000 + int(next(5)));
      else if (kind < 3)
        ids.push_back(3 + 0x80 + int(next(64)));  // a stray byte piece
      else
        ids.push_back(words[next(words.size())]);
    }
    ASSERT_EQ(concat(stream(tok, ids)), tok.decode(ids)) << "ids: " << ids_str(ids);
  }
}

TEST_F(AddedTokens, ComeFromTokenizerJsonOrAddedTokensJsonToo) {
  test::write_file(dir_ / "tokenizer.json",
                   R"({"added_tokens": [{"id": 2001, "content": "<|im_start|>", "special": true},
                                        {"id": 2000, "content": "<|im_end|>", "special": true}]})");
  // tokenizer.json comes first: tokenizer_config.json's tokens are not read.
  Tokenizer tok = with_config(R"("2005": {"content": "<|other|>", "special": true})");
  EXPECT_EQ(tok.vocab_size(), 2002);
  EXPECT_EQ(tok.encode("<|im_start|>a<|im_end|>", false).front(), 2001);
  std::filesystem::remove(dir_ / "tokenizer.json");
  std::filesystem::remove(dir_ / "tokenizer_config.json");
  test::write_file(dir_ / "added_tokens.json", R"({"<|im_end|>": 2000, "<|im_start|>": 2001})");
  tok = Tokenizer::load(dir_ / "tokenizer.model");
  EXPECT_EQ(tok.encode("<|im_start|>", false), (std::vector<int>{2001}));
  EXPECT_EQ(tok.decode({2001}), "<|im_start|>") << "added_tokens.json's tokens are not special";
  // Ids the model has no row for are left out, as llama.cpp's converter does.
  EXPECT_EQ(Tokenizer::load(dir_ / "tokenizer.model", 2001).vocab_size(), 2001);
  EXPECT_EQ(Tokenizer::load(dir_ / "tokenizer.model", 2001).encode("<|im_start|>", false),
            fortune().encode("<|im_start|>", false));
  std::filesystem::remove(dir_ / "added_tokens.json");
  EXPECT_EQ(Tokenizer::load(dir_ / "tokenizer.model").vocab_size(), 2000);
}

TEST_F(AddedTokens, UnreadableFilesAreNamed) {
  for (const std::string& entries :
       {std::string(R"("x": {"content": "a"})"), std::string(R"("2000": {"special": true})"),
        std::string(R"("-4": {"content": "a"})")}) {
    try {
      (void)with_config(entries);
      FAIL() << "accepted " << entries;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    }
  }
  test::write_file(dir_ / "tokenizer.json", "{not json");
  EXPECT_THROW((void)Tokenizer::load(dir_ / "tokenizer.model"), std::runtime_error);
}

}  // namespace
}  // namespace troupe
