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
#include "gpu/loaders/ggml_quants.h"
#include "support/error_messages.h"
#include "support/test_support.h"
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
  EXPECT_EQ(types, 12);  // q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K f16 bf16
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

}  // namespace
}  // namespace troupe
