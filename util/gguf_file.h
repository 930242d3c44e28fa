#pragma once
// The GGUF container (llama.cpp's model file, versions 2 and 3): a header,
// typed key/value metadata, tensor descriptions, then the tensors' data at
// `general.alignment`. This reads the container only; what the keys and
// tensors mean for a model is gguf_loader.cpp's and the tokenizer's business.
// Every count, length and offset is checked against the file before it is
// used, so a truncated or corrupt file is refused with a message naming the
// file and the part that is wrong (GgufError). Both the weights' loader
// (gpu/) and the tokenizer (text/) read it.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class GgufError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ggml's element types as GGUF names them: the block size and bytes per
// block that a tensor's extent is computed from.
struct GgmlType {
  const char* name;    // "q4_K", as ggml spells it
  int64_t block;       // elements per block
  size_t bytes;        // bytes per block
  bool dequantizable;  // gpu/loaders/ggml_quants.h converts it to f32
};
// Null for a type id ggml does not have (or no longer has).
const GgmlType* ggml_type(uint32_t id);
std::string ggml_type_name(uint32_t id);  // "type 99" for an unknown id
// The names of the types that are dequantizable, comma-separated.
std::string ggml_dequantizable_names();
enum : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBF16 = 30 };

// Token texts llama.cpp ends a generation on, and reads as control tokens
// whatever type the file gives them (its list, for the architectures read
// here).
bool gguf_ends_generation(std::string_view token_text);

// A metadata value. Scalars of every integer kind, bools included, are in
// `integer`, floats in `real`; arrays keep their strings or numbers (numbers
// as double: exact for every integer a vocabulary or shape holds).
struct GgufValue {
  enum class Kind { Integer, Real, Text, Array };
  Kind kind = Kind::Integer;
  int64_t integer = 0;
  double real = 0;
  std::string text;
  bool array_of_text = false;
  std::vector<std::string> texts;  // an array of strings
  std::vector<double> numbers;     // an array of numbers or bools
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF's order: ne[0] varies fastest (a matrix's columns)
  uint32_t type = 0;        // ggml_type
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

class GgufFile {
 public:
  // Maps `path` and reads its metadata and tensor table. Throws GgufError.
  static GgufFile open(const std::filesystem::path& path);
  // Whether the file starts with GGUF's magic (false for a missing file).
  static bool has_magic(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }

  const GgufValue* find(std::string_view key) const;
  // The value of `key` converted, or nullopt when absent; a value of another
  // kind throws GgufError naming the key.
  std::optional<int64_t> integer(std::string_view key) const;
  std::optional<double> real(std::string_view key) const;  // an integer is accepted too
  std::optional<std::string> text(std::string_view key) const;
  std::optional<bool> boolean(std::string_view key) const;
  const std::vector<std::string>* texts(std::string_view key) const;
  const std::vector<double>* numbers(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* tensor(std::string_view name) const;
  // Holds the mapping that every GgufTensorInfo::data points into.
  std::shared_ptr<const void> keepalive() const { return mapping_; }

 private:
  // The value of `key` if present, after checking it `fits`; else throws
  // GgufError saying it should be `what`.
  const GgufValue* find_as(std::string_view key, bool (*fits)(const GgufValue&),
                           const char* what) const;

  std::filesystem::path path_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
  std::shared_ptr<const void> mapping_;
};

}  // namespace troupe
