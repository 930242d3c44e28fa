// safetensors reader and writer: round trips, dtype conversion, and corrupt
// headers that must be refused with a message naming the file and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>

#include "gpu/checkpoint.h"
#include "gpu/loaders/safetensors.h"
#include "support/error_messages.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::TempDir;

// The CheckpointError message `f` throws.
std::string error_of(const std::function<void()>& f) {
  return test::message_of<CheckpointError>(f);
}
using test::mentions;

// A safetensors file as raw bytes: little-endian length, header, data.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char(uint8_t(n >> (8 * i)));
  return out + header + data;
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

Tensor f32_tensor(std::vector<int64_t> shape, float start) {
  Tensor t = Tensor::zeros(std::move(shape), DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_mut<float>()[i] = start + float(i);
  return t;
}

Tensor u16_tensor(std::vector<int64_t> shape, DType dtype, std::initializer_list<uint16_t> bits) {
  Tensor t = Tensor::zeros(std::move(shape), dtype);
  std::memcpy(t.raw_mut(), bits.begin(), bits.size() * 2);
  return t;
}

class SafetensorsBadInput : public ::testing::Test {
 protected:
  // Writes `bytes` to a file and returns the message reading it throws.
  std::string read_error(const std::string& bytes) {
    test::write_file(file_, bytes);
    return error_of([&] { read_safetensors(file_); });
  }
  std::string one_tensor(const std::string& entry, const std::string& data) {
    return read_error(raw_file("{\"w\":" + entry + "}", data));
  }

  TempDir dir_;
  std::filesystem::path file_ = dir_ / "bad.safetensors";
};

TEST(SafetensorsLoader, RoundTripsTensorsAndMetadata) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  const Tensor a = f32_tensor({2, 3}, 1.0f);
  const Tensor b = f32_tensor({5}, -7.0f);
  const Tensor scalar = f32_tensor({}, 42.0f);
  write_safetensors(path, {{"b", b}, {"a", a}, {"s", scalar}}, {{"format", "pt"}});

  const SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_EQ(f.tensors.size(), 3u);
  for (const auto& [name, want] : {std::pair{"a", a}, std::pair{"b", b}, std::pair{"s", scalar}}) {
    const Tensor* got = f.find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->shape(), want.shape()) << name;
    EXPECT_EQ(got->dtype(), DType::F32);
    EXPECT_EQ(std::memcmp(got->raw(), want.raw(), want.nbytes()), 0) << name;
  }
  EXPECT_EQ(f.find("nope"), nullptr);

  // The data region starts on an 8-byte boundary.
  const std::string bytes = test::read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
}

TEST(SafetensorsLoader, ViewsOutliveTheFileObject) {
  TempDir dir;
  write_safetensors(dir / "m.safetensors", {{"w", f32_tensor({4}, 3.0f)}});
  Tensor w;
  {
    const SafetensorsFile f = read_safetensors(dir / "m.safetensors");
    w = *f.find("w");
  }
  EXPECT_EQ(w.data<float>()[3], 6.0f);
}

TEST(SafetensorsLoader, F16AndBf16ConvertToF32) {
  TempDir dir;
  const auto path = dir / "half.safetensors";
  // Bit patterns written by hand: 1, -2.5, 0.15625, 65504 (largest f16), 2^-10,
  // 2^-24 (smallest subnormal), -0.
  const Tensor h =
      u16_tensor({7}, DType::F16, {0x3C00, 0xC100, 0x3100, 0x7BFF, 0x1400, 0x0001, 0x8000});
  // 1, -3, 1024, 3.140625, 2^-126 (smallest normal).
  const Tensor bf = u16_tensor({5, 1}, DType::BF16, {0x3F80, 0xC040, 0x4480, 0x4049, 0x0080});
  const Tensor f = f32_tensor({3}, 0.5f);
  write_safetensors(path, {{"h", h}, {"bf", bf}, {"f", f}});

  const SafetensorsFile st = read_safetensors(path);
  ASSERT_EQ(st.find("h")->dtype(), DType::F16);
  ASSERT_EQ(st.find("bf")->dtype(), DType::BF16);
  EXPECT_EQ(st.find("bf")->shape(), (std::vector<int64_t>{5, 1}));
  const std::vector<float> hv = st.find("h")->to_f32();
  const std::vector<float> want_h{1.0f, -2.5f, 0.15625f, 65504.0f, 0x1p-10f, 0x1p-24f, -0.0f};
  EXPECT_EQ(hv, want_h);
  EXPECT_TRUE(std::signbit(hv[6]));
  EXPECT_EQ(st.find("bf")->to_f32(),
            (std::vector<float>{1.0f, -3.0f, 1024.0f, 3.140625f, 0x1p-126f}));
  EXPECT_EQ(st.find("f")->to_f32(), (std::vector<float>{0.5f, 1.5f, 2.5f}));
  // Every tensor is aligned to its element size, though 7 f16 elements
  // leave the region's end at an odd multiple of 2.
  for (const auto& [name, t] : st.tensors)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % dtype_size(t.dtype()), 0u) << name;
}

TEST(SafetensorsLoader, CopiesMisalignedTensors) {
  // A foreign writer that did not pad: the data region starts 1 byte past a
  // multiple of 4.
  TempDir dir;
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string padded = header;
  while ((8 + padded.size()) % 4 != 1) padded += ' ';
  test::write_file(dir / "m.safetensors", raw_file(padded, f32_bytes({1.25f, -9.0f})));
  const SafetensorsFile st = read_safetensors(dir / "m.safetensors");
  const Tensor& w = *st.find("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.raw()) % 4, 0u);
  EXPECT_EQ(w.to_f32(), (std::vector<float>{1.25f, -9.0f}));
}

TEST(SafetensorsLoader, AcceptsOverlappingAndEmptyTensors) {
  TempDir dir;
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                             R"("z":{"dtype":"BF16","shape":[0,4],"data_offsets":[8,8]}})";
  test::write_file(dir / "m.safetensors", raw_file(header, f32_bytes({2.0f, 4.0f})));
  const SafetensorsFile st = read_safetensors(dir / "m.safetensors");
  EXPECT_EQ(st.find("a")->to_f32(), st.find("b")->to_f32());
  EXPECT_EQ(st.find("z")->numel(), 0);
}

TEST(SafetensorsLoader, ReadsBundledFortuneModel) {
  const SafetensorsFile st = read_safetensors(test::model_path("fortune") / "model.safetensors");
  EXPECT_EQ(st.tensors.size(), 1u + 5u * 9u + 1u);
  EXPECT_EQ(st.metadata.at("format"), "pt");
  EXPECT_EQ(st.find("model.embed_tokens.weight")->shape(), (std::vector<int64_t>{2000, 192}));
}

TEST_F(SafetensorsBadInput, MissingFile) {
  const auto missing = dir_ / "nope.safetensors";
  EXPECT_TRUE(
      mentions(error_of([&] { read_safetensors(missing); }), {missing.string(), "does not exist"}));
}

TEST_F(SafetensorsBadInput, EmptyFile) {
  EXPECT_TRUE(mentions(read_error(""), {file_.string(), "empty"}));
}

TEST_F(SafetensorsBadInput, ShorterThanLengthPrefix) {
  EXPECT_TRUE(mentions(read_error("abc"), {file_.string(), "too short"}));
}

TEST_F(SafetensorsBadInput, HeaderLengthLargerThanFile) {
  std::string bytes = raw_file("{}", "");
  bytes[0] = char(200);
  EXPECT_TRUE(mentions(read_error(bytes), {file_.string(), "header length 200"}));
  std::string huge = raw_file("{}", "");
  for (int i = 0; i < 8; ++i) huge[i] = char(0xff);  // 2^64 - 1: must not wrap
  EXPECT_TRUE(mentions(read_error(huge), {file_.string(), "header length"}));
}

TEST_F(SafetensorsBadInput, MalformedJson) {
  EXPECT_TRUE(
      mentions(read_error(raw_file("{\"w\": {\"dtype\": ", "")), {file_.string(), "malformed"}));
  EXPECT_TRUE(mentions(read_error(raw_file("[1, 2]", "")), {file_.string(), "must be an object"}));
  EXPECT_TRUE(mentions(read_error(raw_file("{\"w\": 3}", "")), {file_.string(), "'w'"}));
}

TEST_F(SafetensorsBadInput, OffsetsOutOfRange) {
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", f32_bytes({1, 2, 3})),
      {file_.string(), "'w'", "past the end", "12 bytes"}));
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", f32_bytes({1, 2, 3})),
      {file_.string(), "'w'", "begin after end"}));
  EXPECT_TRUE(
      mentions(one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", f32_bytes({1})),
               {file_.string(), "'w'", "negative"}));
  EXPECT_TRUE(
      mentions(one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", f32_bytes({1})),
               {file_.string(), "'w'", "data_offsets"}));
  EXPECT_TRUE(
      mentions(one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]})",
                          f32_bytes({1})),
               {file_.string(), "past the end"}));
}

TEST_F(SafetensorsBadInput, ByteSizeDisagreesWithShape) {
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,16]})", f32_bytes({1, 2, 3, 4})),
      {file_.string(), "'w'", "[2, 3]", "needs 24 bytes", "span 16"}));
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"BF16","shape":[4],"data_offsets":[0,16]})", f32_bytes({1, 2, 3, 4})),
      {file_.string(), "needs 8 bytes"}));
}

TEST_F(SafetensorsBadInput, UnsupportedDtype) {
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"I64","shape":[2],"data_offsets":[0,16]})", f32_bytes({1, 2, 3, 4})),
      {file_.string(), "'w'", "I64", "not supported"}));
  EXPECT_TRUE(
      mentions(one_tensor(R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})", f32_bytes({1, 2})),
               {file_.string(), "'w'", "dtype"}));
}

TEST_F(SafetensorsBadInput, BadShapes) {
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", f32_bytes({1, 2})),
      {file_.string(), "'w'", "negative"}));
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", f32_bytes({1, 2})),
      {file_.string(), "'w'", "integer"}));
  EXPECT_TRUE(
      mentions(one_tensor(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})", f32_bytes({1, 2})),
               {file_.string(), "'w'", "shape"}));
  // Products that wrap around 64 bits must not sneak past the size check.
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[4294967296,4294967296,1],"data_offsets":[0,0]})", ""),
      {file_.string(), "'w'", "absurdly large"}));
  EXPECT_TRUE(mentions(
      one_tensor(R"({"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]})", ""),
      {file_.string(), "'w'", "absurdly large"}));
}

TEST_F(SafetensorsBadInput, MissingFieldsAndBadMetadata) {
  EXPECT_TRUE(mentions(one_tensor(R"({"dtype":"F32","shape":[2]})", f32_bytes({1, 2})),
                       {file_.string(), "'w'", "data_offsets"}));
  EXPECT_TRUE(mentions(read_error(raw_file(R"({"__metadata__":{"format":1}})", "")),
                       {file_.string(), "__metadata__", "format"}));
}

TEST(SafetensorsWriter, RefusesDuplicateReservedAndEmpty) {
  TempDir dir;
  const auto path = dir / "w.safetensors";
  const Tensor t = f32_tensor({1}, 0.0f);
  EXPECT_TRUE(mentions(error_of([&] {
                         write_safetensors(path, {{"a", t}, {"a", t}});
                       }),
                       {path.string(), "'a'", "twice"}));
  EXPECT_TRUE(mentions(error_of([&] {
                         write_safetensors(path, {{"__metadata__", t}});
                       }),
                       {path.string(), "__metadata__"}));
  EXPECT_TRUE(mentions(error_of([&] {
                         write_safetensors(path, {{"e", Tensor()}});
                       }),
                       {path.string(), "'e'", "no data"}));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsWriter, ReportsUnwritablePath) {
  TempDir dir;
  const auto path = dir / "no-such-dir" / "w.safetensors";
  EXPECT_TRUE(mentions(error_of([&] {
                         write_safetensors(path, {{"a", f32_tensor({1}, 0)}});
                       }),
                       {path.string()}));
}

}  // namespace
}  // namespace troupe
