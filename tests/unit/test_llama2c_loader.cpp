// llama2.c version-0 checkpoints: the bundled models, the exact layout of
// every array, and truncated or inconsistent files.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "support/error_messages.h"
#include "support/test_support.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// The CheckpointError message `f` throws.
std::string error_of(const std::function<void()>& f) {
  return test::message_of<CheckpointError>(f);
}
using test::mentions;

struct Dims {
  int32_t dim, hidden, layers, heads, kv_heads, vocab, seq;
};

// Floats after the header, counted independently of the loader.
int64_t float_count(const Dims& d) {
  const int64_t V = d.vocab < 0 ? -int64_t(d.vocab) : d.vocab, D = d.dim, L = d.layers,
                H = d.hidden, hs = D / d.heads, KV = d.kv_heads * hs;
  int64_t n = V * D + L * D + L * D * D + 2 * L * D * KV + L * D * D + L * D + 3 * L * H * D + D +
              d.seq * hs;
  return d.vocab < 0 ? n + V * D : n;
}

std::string header_bytes(const Dims& d) {
  const int32_t f[7] = {d.dim, d.hidden, d.layers, d.heads, d.kv_heads, d.vocab, d.seq};
  return std::string(reinterpret_cast<const char*>(f), sizeof f);
}

// A synthetic checkpoint whose i-th float holds the value i, so every view
// can be checked against the offset it must start at.
std::string synth_file(const Dims& d) {
  std::vector<float> v(size_t(float_count(d)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return header_bytes(d) +
         std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

constexpr Dims kTiny{8, 12, 2, 4, 2, 10, 6};  // head_size 2, kv_dim 4

TEST(Llama2cLoader, LoadsStories260K) {
  const fs::path path = test::model_path("stories260K") / "stories260K.bin";
  const Checkpoint ck = load_llama2c(path);
  const ModelConfig& c = ck.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_classifier);
  EXPECT_EQ(c.rope, RopeLayout::Interleaved);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 2}));  // run.c stops at BOS; 2 is the Llama EOS
  EXPECT_EQ(ck.source, path);
  EXPECT_TRUE(ck.tokenizer_path.empty());  // its tokenizer is not bundled

  ASSERT_EQ(ck.layers.size(), 5u);
  EXPECT_EQ(ck.tok_embedding.shape(), (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(ck.classifier.raw(), ck.tok_embedding.raw());
  EXPECT_EQ(ck.layers[4].wk.shape(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(ck.layers[4].w_down.shape(), (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(ck.final_norm.shape(), (std::vector<int64_t>{64}));

  // The first and the last weight read sit where run.c puts them.
  const std::string bytes = test::read_file(path);
  EXPECT_EQ(std::memcmp(ck.tok_embedding.raw(), bytes.data() + 28, ck.tok_embedding.nbytes()), 0);
  const size_t freq_bytes = 512 * 8 * 4;  // real + imag, seq_len * head_size/2 each
  EXPECT_EQ(
      std::memcmp(ck.final_norm.raw(), bytes.data() + bytes.size() - freq_bytes - 64 * 4, 64 * 4),
      0);
}

TEST(Llama2cLoader, LoadsFortuneAndFindsTokenizerOneLevelUp) {
  const fs::path path = test::model_path("fortune") / "llama2c" / "model.bin";
  const Checkpoint ck = load_checkpoint(path);
  EXPECT_EQ(ck.config.dim, 192);
  EXPECT_EQ(ck.config.hidden_dim, 512);
  EXPECT_EQ(ck.config.n_layers, 5);
  EXPECT_EQ(ck.config.n_heads, 6);
  EXPECT_EQ(ck.config.n_kv_heads, 2);
  EXPECT_EQ(ck.config.head_dim, 32);
  EXPECT_EQ(ck.config.vocab_size, 2000);
  EXPECT_EQ(ck.config.max_seq_len, 256);
  EXPECT_EQ(ck.tokenizer_path, test::model_path("fortune") / "tokenizer.model");
}

TEST(Llama2cLoader, EveryArraySitsAtItsOffset) {
  TempDir dir;
  Dims d = kTiny;
  d.vocab = -d.vocab;  // untied: the classifier comes last
  test::write_file(dir / "m.bin", synth_file(d));
  test::write_file(dir / "tokenizer.model", "x");
  const Checkpoint ck = load_llama2c(dir / "m.bin");
  EXPECT_FALSE(ck.config.tied_classifier);
  EXPECT_EQ(ck.config.vocab_size, 10);
  EXPECT_EQ(ck.tokenizer_path, dir / "tokenizer.model");
  // Without a tokenizer.model, llama2.c's own tokenizer.bin.
  std::filesystem::remove(dir / "tokenizer.model");
  test::write_file(dir / "tokenizer.bin", "x");
  EXPECT_EQ(load_llama2c(dir / "m.bin").tokenizer_path, dir / "tokenizer.bin");

  const int64_t V = 10, D = 8, L = 2, H = 12, KV = 4, hs = 2, S = 6;
  auto first = [](const Tensor& t) { return int64_t(t.data<float>()[0]); };
  auto last = [](const Tensor& t) { return int64_t(t.data<float>()[t.numel() - 1]); };
  int64_t at = 0;
  EXPECT_EQ(first(ck.tok_embedding), at);
  at += V * D;
  const int64_t rms_att = at, wq = rms_att + L * D, wk = wq + L * D * D, wv = wk + L * KV * D,
                wo = wv + L * KV * D, rms_ffn = wo + L * D * D, w1 = rms_ffn + L * D,
                w2 = w1 + L * H * D, w3 = w2 + L * D * H, rms_final = w3 + L * H * D,
                wcls = rms_final + D + S * hs;
  for (int64_t l = 0; l < L; ++l) {
    const LayerTensors& t = ck.layers[size_t(l)];
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(first(t.attn_norm), rms_att + l * D);
    EXPECT_EQ(first(t.wq), wq + l * D * D);
    EXPECT_EQ(first(t.wk), wk + l * KV * D);
    EXPECT_EQ(first(t.wv), wv + l * KV * D);
    EXPECT_EQ(first(t.wo), wo + l * D * D);
    EXPECT_EQ(first(t.ffn_norm), rms_ffn + l * D);
    EXPECT_EQ(first(t.w_gate), w1 + l * H * D);
    EXPECT_EQ(first(t.w_down), w2 + l * D * H);
    EXPECT_EQ(first(t.w_up), w3 + l * H * D);
    EXPECT_EQ(last(t.w_up), w3 + (l + 1) * H * D - 1);
    EXPECT_EQ(t.wk.shape(), (std::vector<int64_t>{KV, D}));
    EXPECT_EQ(t.w_gate.shape(), (std::vector<int64_t>{H, D}));
  }
  EXPECT_EQ(first(ck.final_norm), rms_final);
  EXPECT_EQ(first(ck.classifier), wcls);
  EXPECT_EQ(last(ck.classifier), float_count(d) - 1);
  EXPECT_EQ(ck.classifier.shape(), (std::vector<int64_t>{V, D}));
}

TEST(Llama2cLoader, MissingPath) {
  TempDir dir;
  const fs::path missing = dir / "nope.bin";
  EXPECT_TRUE(
      mentions(error_of([&] { load_llama2c(missing); }), {missing.string(), "does not exist"}));
  EXPECT_TRUE(
      mentions(error_of([&] { load_checkpoint(missing); }), {missing.string(), "does not exist"}));
}

TEST(Llama2cLoader, EmptyFileAndDirectory) {
  TempDir dir;
  test::write_file(dir / "empty.bin", "");
  EXPECT_TRUE(mentions(error_of([&] { load_checkpoint(dir / "empty.bin"); }),
                       {(dir / "empty.bin").string(), "empty"}));
  EXPECT_TRUE(
      mentions(error_of([&] { load_llama2c(dir.path()); }), {dir.path().string(), "directory"}));
}

TEST(Llama2cLoader, TruncatedAtManySizes) {
  TempDir dir;
  const std::string full = test::read_file(test::model_path("stories260K") / "stories260K.bin");
  const fs::path path = dir / "cut.bin";
  for (size_t size : {size_t(3), size_t(27)}) {
    test::write_file(path, full.substr(0, size));
    EXPECT_TRUE(mentions(error_of([&] { load_llama2c(path); }),
                         {path.string(), std::to_string(size) + " bytes", "header", "truncated"}));
  }
  for (size_t size :
       {size_t(28), size_t(29), size_t(4096), full.size() / 2, full.size() - 4, full.size() - 1}) {
    SCOPED_TRACE(size);
    test::write_file(path, full.substr(0, size));
    EXPECT_TRUE(mentions(error_of([&] { load_checkpoint(path); }),
                         {path.string(), "expected " + std::to_string(full.size()) + " bytes",
                          "is " + std::to_string(size) + " bytes", "truncated"}));
  }
}

TEST(Llama2cLoader, TrailingBytes) {
  TempDir dir;
  const std::string full = test::read_file(test::model_path("stories260K") / "stories260K.bin");
  const fs::path path = dir / "long.bin";
  for (size_t extra : {1, 4, 1000}) {
    test::write_file(path, full + std::string(extra, 'x'));
    EXPECT_TRUE(mentions(error_of([&] { load_llama2c(path); }),
                         {path.string(), "expected " + std::to_string(full.size()) + " bytes",
                          "is " + std::to_string(full.size() + extra) + " bytes", "trailing"}));
  }
}

// Writes a header (plus a little data) and returns the loader's complaint.
std::string header_error(const TempDir& dir, const Dims& d) {
  test::write_file(dir / "h.bin", header_bytes(d) + std::string(64, '\0'));
  return error_of([&] { load_llama2c(dir / "h.bin"); });
}

TEST(Llama2cLoader, ZeroOrNegativeHeaderFields) {
  TempDir dir;
  const std::string file = (dir / "h.bin").string();
  const char* names[] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                         "n_kv_heads", "vocab_size", "seq_len"};
  for (int field = 0; field < 7; ++field) {
    for (int32_t bad : {0, -1, INT32_MIN}) {
      if (field == 5 && bad != 0) continue;  // a negative vocab_size is legal: untied
      Dims d = kTiny;
      (&d.dim)[field] = bad;
      SCOPED_TRACE(std::string(names[field]) + " = " + std::to_string(bad));
      EXPECT_TRUE(mentions(header_error(dir, d), {file, names[field], "must be positive"}));
    }
  }
  Dims d = kTiny;
  d.vocab = INT32_MIN;  // its magnitude does not fit in int32
  EXPECT_TRUE(mentions(header_error(dir, d), {file, "vocab_size", "implausibly large"}));
}

TEST(Llama2cLoader, AbsurdHeaderValuesDoNotOverflow) {
  TempDir dir;
  const std::string file = (dir / "h.bin").string();
  EXPECT_TRUE(
      mentions(header_error(dir, {INT32_MAX, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX, INT32_MAX}),
               {file, "dim", "implausibly large"}));
  // Largest values the bounds allow still give an exact, non-wrapping size.
  const std::string msg = header_error(dir, {65536, 262144, 1024, 4096, 4096, -(1 << 22), 1 << 22});
  EXPECT_TRUE(mentions(msg, {file, "expected ", "truncated"}));
}

TEST(Llama2cLoader, HeadsMustDivide) {
  TempDir dir;
  const std::string file = (dir / "h.bin").string();
  EXPECT_TRUE(mentions(header_error(dir, {10, 12, 2, 4, 2, 10, 6}),
                       {file, "dim 10", "not divisible by n_heads 4"}));
  EXPECT_TRUE(mentions(header_error(dir, {8, 12, 2, 4, 3, 10, 6}),
                       {file, "n_kv_heads 3", "does not divide n_heads 4"}));
  EXPECT_TRUE(mentions(header_error(dir, {8, 12, 2, 8, 8, 10, 6}), {file, "head size 1", "even"}));
  EXPECT_TRUE(mentions(header_error(dir, {8, 12, 2, 4, 8, 10, 6}), {file, "n_kv_heads 8"}));
}

}  // namespace
}  // namespace troupe
