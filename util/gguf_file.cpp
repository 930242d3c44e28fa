#include "util/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

namespace troupe {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kQK = 32;    // elements per block of the _0 and _1 kinds
constexpr int64_t kQKK = 256;  // elements per block of the K kinds

// Indexed by ggml_type id; ids ggml removed have no name.
constexpr GgmlType kTypes[] = {
    {"f32", 1, 4, true},           // 0
    {"f16", 1, 2, true},           // 1
    {"q4_0", kQK, 18, true},       // 2
    {"q4_1", kQK, 20, true},       // 3
    {nullptr, 0, 0, false},        // 4 (removed)
    {nullptr, 0, 0, false},        // 5 (removed)
    {"q5_0", kQK, 22, true},       // 6
    {"q5_1", kQK, 24, true},       // 7
    {"q8_0", kQK, 34, true},       // 8
    {"q8_1", kQK, 36, false},      // 9
    {"q2_K", kQKK, 84, true},      // 10
    {"q3_K", kQKK, 110, true},     // 11
    {"q4_K", kQKK, 144, true},     // 12
    {"q5_K", kQKK, 176, true},     // 13
    {"q6_K", kQKK, 210, true},     // 14
    {"q8_K", kQKK, 292, false},    // 15
    {"iq2_xxs", kQKK, 66, false},  // 16
    {"iq2_xs", kQKK, 74, false},   // 17
    {"iq3_xxs", kQKK, 98, false},  // 18
    {"iq1_s", kQKK, 50, false},    // 19
    {"iq4_nl", kQK, 18, true},     // 20
    {"iq3_s", kQKK, 110, false},   // 21
    {"iq2_s", kQKK, 82, false},    // 22
    {"iq4_xs", kQKK, 136, true},   // 23
    {"i8", 1, 1, false},           // 24
    {"i16", 1, 2, false},          // 25
    {"i32", 1, 4, false},          // 26
    {"i64", 1, 8, false},          // 27
    {"f64", 1, 8, false},          // 28
    {"iq1_m", kQKK, 56, false},    // 29
    {"bf16", 1, 2, true},          // 30
    {nullptr, 0, 0, false},        // 31 (removed)
    {nullptr, 0, 0, false},        // 32 (removed)
    {nullptr, 0, 0, false},        // 33 (removed)
    {"tq1_0", kQKK, 54, false},    // 34
    {"tq2_0", kQKK, 66, false},    // 35
    {nullptr, 0, 0, false},        // 36 (removed)
    {nullptr, 0, 0, false},        // 37 (removed)
    {nullptr, 0, 0, false},        // 38 (removed)
    {"mxfp4", kQK, 17, false},     // 39
};

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
// Bounds far above any real file, low enough that sizes computed from them
// cannot overflow and a corrupt count cannot ask for gigabytes of vectors.
constexpr uint64_t kMaxKeys = 1 << 20;
constexpr uint64_t kMaxTensors = 1 << 20;
constexpr uint64_t kMaxArray = uint64_t(1) << 28;
constexpr uint32_t kMaxDims = 4;

enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw GgufError(path.string() + ": " + what);
}

// Reads the file front to back; every read checks that the bytes are there.
class Cursor {
 public:
  Cursor(const fs::path& path, const uint8_t* data, size_t size)
      : path_(path), data_(data), size_(size) {}

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }

  std::string string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what.c_str());
    need(n, what.c_str());
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_)
      fail(path_, "ends inside " + std::string(what) + " (at byte " + std::to_string(pos_) +
                      " of " + std::to_string(size_) + "; truncated or not a GGUF file)");
  }

  const fs::path& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool is_integer_type(uint32_t t) {
  return t <= kI32 || t == kBool || t == kU64 || t == kI64;
}

double read_number(Cursor& in, uint32_t t, const std::string& key) {
  const char* what = key.c_str();
  switch (t) {
    case kU8:
      return in.read<uint8_t>(what);
    case kI8:
      return in.read<int8_t>(what);
    case kU16:
      return in.read<uint16_t>(what);
    case kI16:
      return in.read<int16_t>(what);
    case kU32:
      return in.read<uint32_t>(what);
    case kI32:
      return in.read<int32_t>(what);
    case kF32:
      return in.read<float>(what);
    case kBool:
      return in.read<uint8_t>(what) != 0;
    case kU64:
      return double(in.read<uint64_t>(what));
    case kI64:
      return double(in.read<int64_t>(what));
    case kF64:
      return in.read<double>(what);
    default:
      return 0;
  }
}

GgufValue read_value(Cursor& in, uint32_t type, const std::string& key, const fs::path& path) {
  GgufValue v;
  const char* what = key.c_str();
  if (type == kString) {
    v.kind = GgufValue::Kind::Text;
    v.text = in.string("the value of " + key);
  } else if (type == kU64) {
    const uint64_t u = in.read<uint64_t>(what);
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      fail(path, "metadata " + key + " = " + std::to_string(u) + " is out of range");
    v.integer = int64_t(u);
  } else if (type == kI64) {
    v.integer = in.read<int64_t>(what);
  } else if (is_integer_type(type)) {
    v.integer = int64_t(read_number(in, type, key));
  } else if (type == kF32 || type == kF64) {
    v.kind = GgufValue::Kind::Real;
    v.real = read_number(in, type, key);
  } else if (type == kArray) {
    v.kind = GgufValue::Kind::Array;
    const uint32_t elem = in.read<uint32_t>(what);
    const uint64_t n = in.read<uint64_t>(what);
    // Each element takes at least a byte (a string: its 8-byte length), so
    // a count the rest of the file cannot hold is refused before anything
    // is reserved for it.
    const uint64_t least = elem == kString                                ? 8
                           : elem == kU16 || elem == kI16                 ? 2
                           : elem == kU32 || elem == kI32 || elem == kF32 ? 4
                           : elem >= kU64 && elem <= kF64                 ? 8
                                                                          : 1;
    if (n > kMaxArray || n > in.remaining() / least)
      fail(path, "metadata " + key + " is an array of " + std::to_string(n) +
                     " elements, more than the file holds");
    if (elem == kString) {
      v.array_of_text = true;
      v.texts.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.texts.push_back(in.string("an element of " + key));
    } else if (elem <= kF64 && elem != kString && elem != kArray) {
      v.numbers.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.numbers.push_back(read_number(in, elem, key));
    } else {
      fail(path, "metadata " + key + " is an array of value type " + std::to_string(elem) +
                     ", which GGUF does not have (nested arrays are not read)");
    }
  } else {
    fail(path, "metadata " + key + " has value type " + std::to_string(type) +
                   ", which GGUF does not have");
  }
  return v;
}

// The file mapped read-only, unmapped when the last tensor view lets go.
std::shared_ptr<const void> map_file(const fs::path& path, size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "is not a regular file");
  }
  size = size_t(st.st_size);
  if (size == 0) {
    ::close(fd);
    fail(path, "is empty");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail(path, std::string("cannot map: ") + std::strerror(err));
  return std::shared_ptr<const void>(
      p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
}

}  // namespace

const GgmlType* ggml_type(uint32_t id) {
  if (id >= std::size(kTypes) || !kTypes[id].name) return nullptr;
  return &kTypes[id];
}

std::string ggml_type_name(uint32_t id) {
  const GgmlType* t = ggml_type(id);
  return t ? t->name : "type " + std::to_string(id);
}

std::string ggml_dequantizable_names() {
  std::string names;
  for (const GgmlType& t : kTypes)
    if (t.dequantizable) names += (names.empty() ? "" : ", ") + std::string(t.name);
  return names;
}

bool gguf_ends_generation(std::string_view t) {
  for (const char* e : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                        "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>"})
    if (t == e) return true;
  return false;
}

bool GgufFile::has_magic(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, kMagic, 4) == 0;
}

GgufFile GgufFile::open(const fs::path& path) {
  GgufFile f;
  f.path_ = path;
  size_t size = 0;
  f.mapping_ = map_file(path, size);
  const auto* base = static_cast<const uint8_t*>(f.mapping_.get());
  Cursor in(path, base, size);
  char magic[4];
  for (char& c : magic) c = char(in.read<uint8_t>("the magic number"));
  if (std::memcmp(magic, kMagic, 4) != 0) fail(path, "is not a GGUF file (no GGUF magic)");
  f.version_ = in.read<uint32_t>("the version");
  if ((f.version_ & 0xFFFF) == 0 && (f.version_ >> 16) != 0)
    fail(path, "is a big-endian GGUF file; this runtime reads little-endian ones");
  if (f.version_ != 2 && f.version_ != 3)
    fail(path, "is GGUF version " + std::to_string(f.version_) +
                   "; versions 2 and 3 are read (convert it again with a newer llama.cpp)");
  const uint64_t n_tensors = in.read<uint64_t>("the tensor count");
  const uint64_t n_keys = in.read<uint64_t>("the metadata count");
  if (n_tensors > kMaxTensors || n_keys > kMaxKeys)
    fail(path, "says it holds " + std::to_string(n_tensors) + " tensors and " +
                   std::to_string(n_keys) + " metadata keys, implausibly many (corrupt)");
  for (uint64_t i = 0; i < n_keys; ++i) {
    std::string key = in.string("a metadata key");
    const uint32_t type = in.read<uint32_t>(key.c_str());
    GgufValue value = read_value(in, type, key, path);
    if (!f.metadata_.emplace(key, std::move(value)).second)
      fail(path, "metadata key " + key + " appears twice");
  }
  uint64_t alignment = 32;
  if (const auto a = f.integer("general.alignment")) {
    if (*a <= 0 || *a > (1 << 20) || (*a & (*a - 1)) != 0)
      fail(path, "general.alignment = " + std::to_string(*a) + " is not a power of two");
    alignment = uint64_t(*a);
  }
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = in.string("a tensor name");
    const uint32_t n_dims = in.read<uint32_t>(t.name.c_str());
    if (t.name.empty())
      fail(path, "tensor #" + std::to_string(i) + " of " + std::to_string(n_tensors) +
                     " has no name (is the tensor count right?)");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(path, "tensor " + t.name + " has " + std::to_string(n_dims) + " dimensions");
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = in.read<uint64_t>(t.name.c_str());
      if (ne == 0 || ne > (uint64_t(1) << 40) || elements > (uint64_t(1) << 40) / ne)
        fail(path, "tensor " + t.name + " has an impossible shape (dimension " + std::to_string(d) +
                       " is " + std::to_string(ne) + ")");
      elements *= ne;
      t.ne.push_back(int64_t(ne));
    }
    t.type = in.read<uint32_t>(t.name.c_str());
    const uint64_t offset = in.read<uint64_t>(t.name.c_str());
    if (const GgmlType* type = ggml_type(t.type)) {
      if (t.ne[0] % type->block != 0)
        fail(path, "tensor " + t.name + " has rows of " + std::to_string(t.ne[0]) +
                       " elements, not a whole number of " + type->name + " blocks of " +
                       std::to_string(type->block));
      t.nbytes = size_t(elements / uint64_t(type->block) * type->bytes);
    }
    offsets.push_back(offset);
    if (!f.by_name_.emplace(t.name, f.tensors_.size()).second)
      fail(path, "tensor " + t.name + " appears twice");
    f.tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (in.pos() + alignment - 1) / alignment * alignment;
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    GgufTensorInfo& t = f.tensors_[i];
    const uint64_t offset = offsets[i];
    if (offset % alignment != 0)
      fail(path, "tensor " + t.name + " starts at offset " + std::to_string(offset) +
                     ", not a multiple of the alignment " + std::to_string(alignment));
    if (data_start > size || offset > size - data_start || t.nbytes > size - data_start - offset)
      fail(path, "tensor " + t.name + " (" + std::to_string(t.nbytes) + " bytes at offset " +
                     std::to_string(offset) + ") runs past the end of the file (" +
                     std::to_string(size) + " bytes; truncated?)");
    t.data = base + data_start + offset;
  }
  // Tensors may not share bytes (a corrupt offset would otherwise hand one
  // tensor another's weights).
  std::vector<size_t> order(f.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f.tensors_[a].data < f.tensors_[b].data; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo &prev = f.tensors_[order[i - 1]], &next = f.tensors_[order[i]];
    if (prev.data + prev.nbytes > next.data)
      fail(path, "tensors " + prev.name + " and " + next.name + " overlap in the file");
  }
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufValue* GgufFile::find_as(std::string_view key, bool (*fits)(const GgufValue&),
                                   const char* what) const {
  const GgufValue* v = find(key);
  if (v && !fits(*v)) fail(path_, "metadata " + std::string(key) + " should be " + what);
  return v;
}

namespace {
using Kind = GgufValue::Kind;
bool is_integer(const GgufValue& v) {
  return v.kind == Kind::Integer;
}
bool is_number(const GgufValue& v) {
  return v.kind == Kind::Integer || v.kind == Kind::Real;
}
bool is_text(const GgufValue& v) {
  return v.kind == Kind::Text;
}
// An empty array is either kind.
bool is_texts(const GgufValue& v) {
  return v.kind == Kind::Array && (v.array_of_text || v.numbers.empty());
}
bool is_numbers(const GgufValue& v) {
  return v.kind == Kind::Array && !v.array_of_text;
}
}  // namespace

std::optional<int64_t> GgufFile::integer(std::string_view key) const {
  const GgufValue* v = find_as(key, is_integer, "an integer");
  return v ? std::optional(v->integer) : std::nullopt;
}

std::optional<double> GgufFile::real(std::string_view key) const {
  const GgufValue* v = find_as(key, is_number, "a number");
  if (!v) return std::nullopt;
  return v->kind == Kind::Integer ? double(v->integer) : v->real;
}

std::optional<std::string> GgufFile::text(std::string_view key) const {
  const GgufValue* v = find_as(key, is_text, "a string");
  return v ? std::optional(v->text) : std::nullopt;
}

std::optional<bool> GgufFile::boolean(std::string_view key) const {
  const GgufValue* v = find_as(key, is_integer, "a bool");
  return v ? std::optional(v->integer != 0) : std::nullopt;
}

const std::vector<std::string>* GgufFile::texts(std::string_view key) const {
  const GgufValue* v = find_as(key, is_texts, "an array of strings");
  return v ? &v->texts : nullptr;
}

const std::vector<double>* GgufFile::numbers(std::string_view key) const {
  const GgufValue* v = find_as(key, is_numbers, "an array of numbers");
  return v ? &v->numbers : nullptr;
}

const GgufTensorInfo* GgufFile::tensor(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace troupe
