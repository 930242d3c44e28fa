// GGUF files: the container (every truncation and corruption refused),
// dequantization against ggml's own, and models and vocabularies converted
// and quantized by llama.cpp's tools against llama.cpp's answers
// (tests/data/gguf/README.md says how each file was made).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/generate.h"
#include "gpu/loaders/ggml_quants.h"
#include "gpu/model.h"
#include "gpu/tensor.h"
#include "support/error_messages.h"
#include "support/test_support.h"
#include "text/tokenizer.h"
#include "util/gguf_file.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using test::mentions;
using test::TempDir;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string gguf_error_of(const fs::path& p) {
  return test::message_of<GgufError>([&] { GgufFile::open(p); });
}

// A vocabulary-only GGUF written here, for the metadata cases llama.cpp's
// tools do not make: keys as GGUF encodes them, no tensors.
class VocabWriter {
 public:
  VocabWriter& text(const std::string& key, const std::string& v) { return put(key, 8, str(v)); }
  VocabWriter& u32(const std::string& key, uint32_t v) { return put(key, 4, raw(v)); }
  VocabWriter& boolean(const std::string& key, bool v) { return put(key, 7, raw(uint8_t(v))); }
  VocabWriter& texts(const std::string& key, const std::vector<std::string>& v) {
    std::string b = raw(uint32_t(8)) + raw(uint64_t(v.size()));
    for (const auto& e : v) b += str(e);
    return put(key, 9, b);
  }
  VocabWriter& ints(const std::string& key, const std::vector<int32_t>& v) {
    std::string b = raw(uint32_t(5)) + raw(uint64_t(v.size()));
    for (int32_t e : v) b += raw(e);
    return put(key, 9, b);
  }
  void write(const fs::path& p) const {
    write_bytes(p, "GGUF" + raw(uint32_t(3)) + raw(uint64_t(0)) + raw(uint64_t(keys_)) + kv_);
  }

 private:
  template <class T>
  static std::string raw(T v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof v);
  }
  static std::string str(const std::string& s) { return raw(uint64_t(s.size())) + s; }
  VocabWriter& put(const std::string& key, uint32_t type, const std::string& value) {
    kv_ += str(key) + raw(type) + value;
    ++keys_;
    return *this;
  }
  std::string kv_;
  size_t keys_ = 0;
};

// GPT-2's byte alphabet: the 256 byte tokens as a byte-level BPE spells
// them, then "ab" from one merge, then `extra`.
VocabWriter byte_level_vocab(const std::string& pre, const std::vector<std::string>& extra,
                             std::vector<int32_t> extra_kinds) {
  std::vector<std::string> tokens;
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : 256 + shifted++;
    std::string u;
    if (cp < 0x80) {
      u += char(cp);
    } else {
      u += char(0xC0 | (cp >> 6));
      u += char(0x80 | (cp & 0x3F));
    }
    tokens.push_back(u);
  }
  tokens.push_back("ab");
  std::vector<int32_t> kinds(tokens.size(), 1);
  tokens.insert(tokens.end(), extra.begin(), extra.end());
  kinds.insert(kinds.end(), extra_kinds.begin(), extra_kinds.end());
  VocabWriter w;
  w.text("general.architecture", "llama")
      .text("tokenizer.ggml.model", "gpt2")
      .text("tokenizer.ggml.pre", pre)
      .texts("tokenizer.ggml.tokens", tokens)
      .ints("tokenizer.ggml.token_type", kinds);
  return w;
}

// ggml quantized each tensor of dequant.gguf and stored its own
// dequantization beside it ("q4_K" and "q4_K.expected"). ggml may contract
// a multiply and an add into one fused operation where this build does not
// (or the other way), so a value may differ in its last bit: the bound is
// two units in the last place of the larger value.
TEST(GgufDequant, MatchesGgmlForEveryType) {
  const GgufFile f = GgufFile::open(test::data_path("gguf/dequant.gguf"));
  int types = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name.ends_with(".expected")) continue;
    SCOPED_TRACE(t.name);
    const GgufTensorInfo* want = f.tensor(t.name + ".expected");
    ASSERT_NE(want, nullptr);
    ASSERT_EQ(t.ne, want->ne);
    ASSERT_EQ(ggml_type_name(t.type), t.name);
    const int64_t n = t.ne[0] * t.ne[1];
    std::vector<float> got(size_t(n), std::nanf(""));
    std::vector<float> expected(static_cast<size_t>(n));
    std::memcpy(expected.data(), want->data, size_t(n) * 4);
    dequantize_row(t.type, t.data, got.data(), n);
    int64_t off = 0;
    for (size_t i = 0; i < size_t(n); ++i) {
      const float larger = std::max(std::fabs(got[i]), std::fabs(expected[i]));
      const float ulp = std::nextafter(larger, INFINITY) - larger;
      if (!(std::fabs(got[i] - expected[i]) <= 2 * ulp)) ++off;
    }
    EXPECT_EQ(off, 0) << "of " << n;
    ++types;
  }
  EXPECT_EQ(types, 14);  // q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K iq4_nl iq4_xs f16 bf16
}

// A blocks view reads as the f32 tensor it stands for, whole, by rows, by
// row and by columns (a column slice may cut blocks).
TEST(GgufDequant, BlocksViewReadsAsItsFloats) {
  const GgufFile f = GgufFile::open(test::data_path("gguf/dequant.gguf"));
  for (const char* name : {"q4_K", "q8_0", "q6_K"}) {
    SCOPED_TRACE(name);
    const GgufTensorInfo& q = *f.tensor(name);
    const Tensor t = Tensor::blocks_view(q.data, {q.ne[1], q.ne[0]}, q.type, f.keepalive());
    EXPECT_EQ(t.nbytes(), q.nbytes);
    const std::vector<float> all = t.to_f32();
    std::vector<float> want(all.size());
    std::memcpy(want.data(), f.tensor(std::string(name) + ".expected")->data, want.size() * 4);
    EXPECT_EQ(all, want);
    const int64_t cols = q.ne[0];
    const std::vector<float> mid = t.rows(2, 4).to_f32();
    EXPECT_EQ(mid, std::vector<float>(all.begin() + 2 * cols, all.begin() + 4 * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    t.row_to_f32(5, row.data());
    EXPECT_EQ(row, std::vector<float>(all.begin() + 5 * cols, all.end()));
    // Columns that cut blocks: a window on them; of a window, columns that
    // cut none: a copy of those blocks.
    for (const auto& [b, e] : {std::pair{5, 300}, {256, 512}, {0, 256}}) {
      const Tensor slice = t.cols(b, e).rows(1, 3);
      EXPECT_TRUE(slice.is_blocks());
      std::vector<float> want_rows;
      for (int64_t r = 1; r < 3; ++r)
        want_rows.insert(want_rows.end(), all.begin() + r * cols + b, all.begin() + r * cols + e);
      EXPECT_EQ(slice.to_f32(), want_rows) << b << ".." << e;
      const Tensor inner = t.cols(b, e).cols(10, 100);
      std::vector<float> got(90);
      inner.row_to_f32(4, got.data());
      EXPECT_EQ(got, std::vector<float>(all.begin() + 4 * cols + b + 10,
                                        all.begin() + 4 * cols + b + 100));
    }
  }
  EXPECT_THROW(Tensor::blocks_view(nullptr, {2, 100}, 12, nullptr), std::invalid_argument);
}

TEST(GgufFile, ReadsMetadataAndTensorTable) {
  const GgufFile f = GgufFile::open(test::data_path("gguf/dequant.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.text("general.architecture"), "dequant-test");
  EXPECT_FALSE(f.integer("general.nothing").has_value());
  EXPECT_THROW(f.integer("general.architecture"), GgufError);  // a string, not an integer
  const GgufTensorInfo* q = f.tensor("q4_K");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne, (std::vector<int64_t>{512, 6}));
  EXPECT_EQ(q->nbytes, size_t(2 * 6 * 144));
  EXPECT_EQ(f.tensor("q4_k"), nullptr);
}

TEST(GgufFile, EveryTruncationIsRefusedNamingTheFile) {
  const std::string bytes = read_bytes(test::data_path("gguf/dequant.gguf"));
  TempDir dir;
  const fs::path p = dir.path() / "cut.gguf";
  // Every cut inside the header, metadata and tensor table, then some
  // inside the data.
  const size_t table_end = 1200;
  ASSERT_GT(bytes.size(), table_end);
  for (size_t cut = 1; cut < bytes.size(); cut += cut < table_end ? 1 : 4001) {
    write_bytes(p, bytes.substr(0, cut));
    const std::string msg = gguf_error_of(p);
    ASSERT_TRUE(mentions(msg, {"cut.gguf"})) << "cut at " << cut << ": " << msg;
  }
}

TEST(GgufFile, RefusesOtherFilesAndVersions) {
  TempDir dir;
  const fs::path p = dir.path() / "x.gguf";
  write_bytes(p, "GGML" + std::string(60, '\0'));
  EXPECT_TRUE(mentions(gguf_error_of(p), {"not a GGUF file"}));
  std::string bytes = read_bytes(test::data_path("gguf/dequant.gguf"));
  bytes[4] = 1;  // version 1 (32-bit counts)
  write_bytes(p, bytes);
  EXPECT_TRUE(mentions(gguf_error_of(p), {"version 1"}));
  bytes[4] = 0;
  bytes[7] = 3;  // version 3 written big-endian
  write_bytes(p, bytes);
  EXPECT_TRUE(mentions(gguf_error_of(p), {"big-endian"}));
  write_bytes(p, "");
  EXPECT_TRUE(mentions(gguf_error_of(p), {"empty"}));
  EXPECT_FALSE(GgufFile::has_magic(dir.path() / "missing.gguf"));
}

// A tensor whose data would run past the end of the file, or whose offset
// breaks the alignment, is refused by name.
TEST(GgufFile, RefusesTensorsOutsideTheFile) {
  std::string bytes = read_bytes(test::data_path("gguf/dequant.gguf"));
  const GgufFile f = GgufFile::open(test::data_path("gguf/dequant.gguf"));
  // The last tensor's offset field: 8 bytes right before the data's padding.
  const std::string name = f.tensors().back().name;
  const size_t at = bytes.find(name + std::string(1, '\x02'), 0);
  ASSERT_NE(at, std::string::npos);
  // name, n_dims (4), 2 dims (16), type (4), then the offset.
  const size_t offset_at = at + name.size() + 4 + 16 + 4;
  TempDir dir;
  const fs::path p = dir.path() / "far.gguf";
  for (uint64_t bad : {uint64_t(1) << 40, uint64_t(33)}) {
    std::string b = bytes;
    std::memcpy(b.data() + offset_at, &bad, 8);
    write_bytes(p, b);
    const std::string msg = gguf_error_of(p);
    EXPECT_TRUE(mentions(msg, {"tensor " + name})) << msg;
  }
}

nlohmann::json read_json(const fs::path& p) {
  return nlohmann::json::parse(read_bytes(p));
}

// Five small random models converted from Hugging Face checkpoints by
// llama.cpp's convert_hf_to_gguf.py and quantized by llama-quantize (mixes
// of K kinds, q8_0, q4_0), one per architecture this loader maps; each
// carries the bundled fortune model's SentencePiece vocabulary (phi3's with
// Phi-3's added tokens, which its prompt spells). The prompt's ids and 32
// greedy steps are llama.cpp's (models.expected.json); the smallest gap
// between the two likeliest tokens there is 0.005, far above what
// summation order moves.
TEST(GgufLoader, ModelsGiveLlamaCppsTokens) {
  const nlohmann::json expected = read_json(test::data_path("gguf/models.expected.json"));
  ASSERT_EQ(expected["cases"].size(), 6u);
  for (const auto& c : expected["cases"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file);
    const fs::path path = test::data_path("gguf/" + file);
    const Tokenizer tok = Tokenizer::load(path);
    const std::string text = c.value("prompt", std::string(expected["prompt"]));
    const std::vector<int> prompt = tok.encode(text, tok.bos_id() >= 0);
    EXPECT_EQ(prompt, c["prompt_ids"].get<std::vector<int>>());
    const auto model = Model::load(path, DType::F32);
    GenerateRequest req;
    req.prompt = prompt;
    req.max_tokens = 32;
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    EXPECT_EQ(generate(*model, 2, req).ids, c["ids"].get<std::vector<int>>());
  }
}

TEST(GgufLoader, MapsEachArchitecturesSettings) {
  const Checkpoint llama = load_checkpoint(test::data_path("gguf/llama-q4_k_m.gguf"));
  EXPECT_EQ(llama.config.rope, RopeLayout::Interleaved);  // the converter permuted q and k back
  EXPECT_EQ(llama.config.dim, 256);
  EXPECT_EQ(llama.config.hidden_dim, 512);
  EXPECT_EQ(llama.config.n_heads, 4);
  EXPECT_EQ(llama.config.n_kv_heads, 2);
  EXPECT_EQ(llama.config.head_dim, 64);
  EXPECT_EQ(llama.config.vocab_size, 2000);
  EXPECT_EQ(llama.config.max_seq_len, 256);
  EXPECT_FALSE(llama.config.tied_classifier);
  EXPECT_EQ(llama.tokenizer_path, test::data_path("gguf/llama-q4_k_m.gguf"));
  // Quantized weights stay the file's blocks until the model packs them.
  EXPECT_TRUE(llama.layers[0].wq.is_blocks());
  EXPECT_EQ(llama.layers[0].wq.dtype(), DType::F32);
  EXPECT_FALSE(llama.layers[0].attn_norm.is_blocks());

  const Checkpoint qwen2 = load_checkpoint(test::data_path("gguf/qwen2-q5_k_m.gguf"));
  EXPECT_EQ(qwen2.config.rope, RopeLayout::RotateHalf);
  EXPECT_TRUE(qwen2.config.qkv_bias);
  EXPECT_EQ(qwen2.layers[0].bq.shape(), (std::vector<int64_t>{256}));
  const Checkpoint qwen3 = load_checkpoint(test::data_path("gguf/qwen3-q8_0.gguf"));
  EXPECT_TRUE(qwen3.config.qk_norm);
  EXPECT_EQ(qwen3.layers[0].q_norm.shape(), (std::vector<int64_t>{128}));
  // Phi-3: fused projections split, q and k not permuted, the context cut
  // to the sliding window (128 of 256).
  const Checkpoint phi3 = load_checkpoint(test::data_path("gguf/phi3-q4_k_m.gguf"));
  EXPECT_EQ(phi3.config.rope, RopeLayout::RotateHalf);
  EXPECT_EQ(phi3.config.max_seq_len, 128);
  EXPECT_EQ(phi3.config.vocab_size, 2008);
  EXPECT_EQ(phi3.layers[0].wk.shape(), (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(phi3.layers[0].w_up.shape(), (std::vector<int64_t>{512, 256}));
  EXPECT_TRUE(phi3.config.is_eos(2000) && phi3.config.is_eos(2002));  // <|endoftext|>, <|end|>

  // Llama 3.1's scaling arrives as rope_freqs.weight: a divisor per
  // frequency, which must give what the llama3 formula gives for the
  // checkpoint's rope_scaling (factor 8, 1 and 4, original 64 positions).
  const Checkpoint l31 = load_checkpoint(test::data_path("gguf/llama31-q4_0.gguf"));
  ASSERT_EQ(l31.config.rope_scaling.kind, RopeScaling::Kind::Factors);
  RopeScaling llama3;
  llama3.kind = RopeScaling::Kind::Llama3;
  llama3.factor = 8;
  llama3.original_max_position = 64;
  const auto want = rope_frequencies(64, 500000.0f, llama3);
  const auto got = rope_frequencies(64, l31.config.rope_theta, l31.config.rope_scaling);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f * want[i]) << i;
  EXPECT_NE(got, rope_frequencies(64, 500000.0f));  // the scaling is real
}

// Vocabulary-only GGUFs written with llama.cpp's gguf-py from the cut
// tokenizer.json fixtures (tests/data/tokenizers), and the ids llama.cpp's
// tokenizer gives for 117 texts, BOS where the file asks for it and special
// tokens read from their spelling; the SentencePiece-style vocabulary is
// the one in llama-q4_k_m.gguf (the fortune model's).
TEST(GgufVocabulary, TokenizesAsLlamaCpp) {
  const nlohmann::json expected = read_json(test::data_path("gguf/vocab.expected.json"));
  const auto texts = expected["texts"].get<std::vector<std::string>>();
  ASSERT_EQ(expected["ids"].size(), 4u);
  for (const auto& [file, all_ids] : expected["ids"].items()) {
    SCOPED_TRACE(file);
    const Tokenizer tok = Tokenizer::load(test::data_path("gguf/" + file));
    ASSERT_EQ(all_ids.size(), texts.size());
    int wrong = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::vector<int> got = tok.encode(texts[i], tok.bos_id() >= 0);
      const auto want = all_ids[i].get<std::vector<int>>();
      if (got != want && ++wrong <= 3) ADD_FAILURE() << "text " << i << ": " << texts[i];
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(GgufVocabulary, DecodesAndKnowsItsSpecialTokens) {
  const Tokenizer llama3 = Tokenizer::load(test::data_path("gguf/llama3-vocab.gguf"));
  EXPECT_EQ(llama3.bos_id(), 1500);
  EXPECT_EQ(llama3.eos_id(), 1505);
  EXPECT_TRUE(llama3.is_control(1505));
  const std::vector<int> ids = llama3.encode("Hello world<|eot_id|>", false);
  EXPECT_EQ(ids.back(), 1505);
  EXPECT_EQ(llama3.decode(ids), "Hello world");
  const Tokenizer qwen = Tokenizer::load(test::data_path("gguf/qwen2-vocab.gguf"));
  EXPECT_EQ(qwen.bos_id(), -1);  // Qwen adds no BOS
  const Tokenizer spm = Tokenizer::load(test::data_path("gguf/llama-q4_k_m.gguf"));
  const Tokenizer fortune = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  // SentencePiece reads a "▁" in the text as a space, and so does llama.cpp.
  EXPECT_EQ(spm.encode("a\xe2\x96\x81"
                       "b",
                       true),
            fortune.encode("a b", true));
  for (const char* text : {"The meaning of life", "  two spaces\nand a line",
                           "caf\xc3\xa9 \xe2\x82\xac"
                           "5"}) {
    SCOPED_TRACE(text);
    const auto a = spm.encode(text, true);
    EXPECT_EQ(a, fortune.encode(text, true));
    EXPECT_EQ(spm.decode(a), fortune.decode(a));
  }
}

// What llama.cpp makes of a vocabulary's metadata: EOS appended when the
// file asks (add_eos_token), a text llama.cpp ends generations on made a
// control token though the file calls it normal (Qwen2 has "</s>" so), and
// a byte-level vocabulary without merges refused.
TEST(GgufVocabulary, ReadsTheMetadataAsLlamaCppDoes) {
  TempDir dir;
  const fs::path p = dir.path() / "v.gguf";
  byte_level_vocab("gpt-2", {"</s>", "<|bos|>"}, {1, 3})
      .texts("tokenizer.ggml.merges", {"a b"})
      .u32("tokenizer.ggml.bos_token_id", 258)
      .u32("tokenizer.ggml.eos_token_id", 257)
      .boolean("tokenizer.ggml.add_bos_token", true)
      .boolean("tokenizer.ggml.add_eos_token", true)
      .write(p);
  const Tokenizer tok = Tokenizer::load(p);
  EXPECT_EQ(tok.bos_id(), 258);
  EXPECT_TRUE(tok.is_control(257));  // "</s>", a normal token in the file
  EXPECT_EQ(tok.encode("ab</s>", true), (std::vector<int>{258, 256, 257, 257}));
  EXPECT_EQ(tok.decode({256, 257}), "ab");

  byte_level_vocab("gpt-2", {}, {}).write(p);
  const std::string msg = test::message_of<std::runtime_error>([&] { Tokenizer::load(p); });
  EXPECT_TRUE(mentions(msg, {"v.gguf", "without tokenizer.ggml.merges"})) << msg;
  byte_level_vocab("tekken", {}, {}).texts("tokenizer.ggml.merges", {"a b"}).write(p);
  const std::string pre = test::message_of<std::runtime_error>([&] { Tokenizer::load(p); });
  EXPECT_TRUE(mentions(pre, {"tokenizer.ggml.pre 'tekken'"})) << pre;
}

TEST(GgufLoader, RefusesWhatItDoesNotCompute) {
  TempDir dir;
  std::string bytes = read_bytes(test::data_path("gguf/llama-q4_k_m.gguf"));
  const std::string arch = "llama";
  // general.architecture's value: the key, its type (8, string), length 5.
  const size_t at = bytes.find("general.architecture");
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + std::string("general.architecture").size() + 4 + 8;
  ASSERT_EQ(bytes.substr(value, 5), arch);
  bytes.replace(value, 5, "gemma");
  const fs::path p = dir.path() / "gemma.gguf";
  write_bytes(p, bytes);
  const std::string msg = test::message_of<CheckpointError>([&] { load_checkpoint(p); });
  EXPECT_TRUE(mentions(msg, {"gemma.gguf", "architecture 'gemma'"})) << msg;
  // A quantization kind it does not read (mxfp4 here, set in place of a
  // q4_0 tensor's type): refused naming the tensor, its kind and the kinds
  // it reads.
  bytes = read_bytes(test::data_path("gguf/llama31-q4_0.gguf"));
  const std::string tensor = "blk.0.attn_q.weight";
  const size_t info = bytes.find(tensor + std::string(1, '\x02'));
  ASSERT_NE(info, std::string::npos);
  uint32_t type = 0;
  std::memcpy(&type, bytes.data() + info + tensor.size() + 4 + 16, 4);
  ASSERT_EQ(type, 2u);  // q4_0
  type = 39;            // mxfp4: 32 elements in 17 bytes, so the data still fits
  std::memcpy(bytes.data() + info + tensor.size() + 4 + 16, &type, 4);
  const fs::path mx = dir.path() / "mxfp4.gguf";
  write_bytes(mx, bytes);
  const std::string kind = test::message_of<CheckpointError>([&] { load_checkpoint(mx); });
  EXPECT_TRUE(mentions(kind, {"mxfp4.gguf", tensor, "is mxfp4", "q4_K"})) << kind;
  // A vocabulary-only file has no weights, and is told so.
  const std::string none = test::message_of<CheckpointError>(
      [&] { load_checkpoint(test::data_path("gguf/gpt2-vocab.gguf")); });
  EXPECT_TRUE(mentions(none, {"gpt2-vocab.gguf", "vocabulary-only"})) << none;
}

}  // namespace
}  // namespace troupe
