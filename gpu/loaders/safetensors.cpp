#include "gpu/loaders/safetensors.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "gpu/checkpoint.h"

namespace troupe {
namespace {

using nlohmann::json;

// The reference implementation's limit; a longer header is corrupt or hostile.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr size_t kLengthPrefixBytes = 8;
constexpr size_t kDataAlignment = 8;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw CheckpointError(path.string() + ": " + what);
}

std::optional<DType> safetensors_dtype(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "F16") return DType::F16;
  if (name == "BF16") return DType::BF16;
  return std::nullopt;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
  }
  return "?";
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A non-negative JSON integer; `what` says where it sits, for the message.
uint64_t json_u64(const std::filesystem::path& path, const json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail(path, what + " is negative (" + v.dump() + ")");
  fail(path, what + " must be a non-negative integer, got " + v.dump());
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct TensorEntry {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// Elements in `shape`, refusing any shape whose dims (zeros aside) multiply
// past int64: Tensor's own index arithmetic must never overflow either.
uint64_t checked_numel(const std::filesystem::path& path, const std::string& tensor,
                       const std::vector<int64_t>& shape) {
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d == 0) {
      has_zero = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero_product, uint64_t(d), &nonzero_product) ||
        nonzero_product > uint64_t(std::numeric_limits<int64_t>::max()) / 8)
      fail(path, "tensor '" + tensor + "' has an absurdly large shape");
  }
  return has_zero ? 0 : nonzero_product;
}

std::vector<int64_t> parse_shape(const std::filesystem::path& path, const std::string& tensor,
                                 const json& v) {
  if (!v.is_array()) fail(path, "tensor '" + tensor + "': \"shape\" must be an array");
  std::vector<int64_t> shape;
  for (size_t i = 0; i < v.size(); ++i) {
    const uint64_t d =
        json_u64(path, v[i], "tensor '" + tensor + "': shape dimension " + std::to_string(i));
    if (d > uint64_t(std::numeric_limits<int64_t>::max()))
      fail(path, "tensor '" + tensor + "' has an absurdly large shape");
    shape.push_back(int64_t(d));
  }
  return shape;
}

TensorEntry parse_entry(const std::filesystem::path& path, const std::string& name, const json& v,
                        uint64_t data_bytes) {
  if (!v.is_object()) fail(path, "header entry '" + name + "' must be an object");
  const std::string where = "tensor '" + name + "'";
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(path, where + " has no \"" + key + "\"");

  const json& dt = v["dtype"];
  if (!dt.is_string()) fail(path, where + ": \"dtype\" must be a string");
  const auto dtype = safetensors_dtype(dt.get<std::string>());
  if (!dtype)
    fail(path, where + " has dtype " + dt.get<std::string>() +
                   ", which is not supported (only F32, F16 and BF16 are)");

  TensorEntry e{*dtype, parse_shape(path, name, v["shape"]), 0, 0};

  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(path, where + ": \"data_offsets\" must be an array [begin, end]");
  e.begin = json_u64(path, off[0], where + ": data_offsets begin");
  e.end = json_u64(path, off[1], where + ": data_offsets end");
  if (e.begin > e.end)
    fail(path, where + " has data_offsets [" + std::to_string(e.begin) + ", " +
                   std::to_string(e.end) + "] with begin after end");
  if (e.end > data_bytes)
    fail(path, where + " has data_offsets [" + std::to_string(e.begin) + ", " +
                   std::to_string(e.end) + "] past the end of the data region (" +
                   std::to_string(data_bytes) + " bytes)");

  const uint64_t numel = checked_numel(path, name, e.shape);
  const uint64_t want = numel * dtype_size(*dtype);  // numel is bounded well below overflow
  if (e.end - e.begin != want)
    fail(path, where + " of dtype " + dt.get<std::string>() + " and shape " + shape_text(e.shape) +
                   " needs " + std::to_string(want) + " bytes, but its data_offsets span " +
                   std::to_string(e.end - e.begin));
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::filesystem::path& path,
                                                  const json& v) {
  if (!v.is_object()) fail(path, "\"__metadata__\" must be an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string()) fail(path, "\"__metadata__\" value for '" + k + "' must be a string");
    out[k] = val.get<std::string>();
  }
  return out;
}

json parse_header(const MappedFile& file, uint64_t header_bytes) {
  const char* begin = reinterpret_cast<const char*>(file.data()) + kLengthPrefixBytes;
  json header;
  try {
    header = json::parse(begin, begin + header_bytes);
  } catch (const json::exception& e) {
    fail(file.path(), std::string("the JSON header is malformed: ") + e.what());
  }
  if (!header.is_object()) fail(file.path(), "the JSON header must be an object");
  return header;
}

// The tensor's bytes as a view, or as an owned copy when they are not aligned
// to the element size (a foreign writer that did not pad its header).
Tensor make_tensor(const std::shared_ptr<const MappedFile>& file, const uint8_t* data_start,
                   const std::string& name, const TensorEntry& e) {
  const uint8_t* p = data_start + e.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) == 0)
    return Tensor::view(p, e.shape, e.dtype, file);
  spdlog::debug("{}: tensor '{}' is misaligned; copying it", file->path().string(), name);
  Tensor t = Tensor::zeros(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.raw_mut(), p, size_t(e.end - e.begin));
  return t;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  SafetensorsFile out;
  out.path = path;
  out.mapping = MappedFile::open(path);
  const MappedFile& file = *out.mapping;
  if (file.size() < kLengthPrefixBytes)
    fail(path, "is " + std::to_string(file.size()) +
                   " bytes, too short for the 8-byte safetensors header length");
  const uint64_t header_bytes = read_u64_le(file.data());
  const uint64_t after_prefix = file.size() - kLengthPrefixBytes;
  if (header_bytes > after_prefix || header_bytes > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_bytes) + " exceeds the " +
                   std::to_string(after_prefix) + " bytes that follow it (file is " +
                   std::to_string(file.size()) + " bytes)");
  const uint64_t data_bytes = after_prefix - header_bytes;

  const json header = parse_header(file, header_bytes);
  // Validate every entry before handing out any view.
  std::vector<std::pair<std::string, TensorEntry>> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      out.metadata = parse_metadata(path, v);
      continue;
    }
    entries.emplace_back(name, parse_entry(path, name, v, data_bytes));
  }
  const uint8_t* data_start = file.data() + kLengthPrefixBytes + header_bytes;
  for (const auto& [name, e] : entries)
    out.tensors.emplace(name, make_tensor(out.mapping, data_start, name, e));
  spdlog::debug("{}: {} tensors", path.string(), out.tensors.size());
  return out;
}

namespace {

void check_writable(const std::filesystem::path& path,
                    const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail(path, "a tensor cannot be named \"__metadata__\"");
    if (!seen.insert(name).second) fail(path, "tensor '" + name + "' is given twice");
    // Only a tensor with a zero dimension may lack memory; a default Tensor
    // would otherwise be written as a scalar with no bytes.
    if (t.empty() && (t.shape().empty() || t.numel() != 0))
      fail(path, "tensor '" + name + "' has no data");
  }
}

// Indices of `tensors` in file order: larger elements first, so that
// contiguous packing keeps every tensor aligned to its element size.
std::vector<size_t> file_order(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = dtype_size(tensors[a].second.dtype());
    const size_t sb = dtype_size(tensors[b].second.dtype());
    return sa != sb ? sa > sb : tensors[a].first < tensors[b].first;
  });
  return order;
}

std::string header_text(const std::filesystem::path& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::vector<size_t>& order,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    const uint64_t bytes = t.empty() ? 0 : t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // names that are not valid UTF-8
    fail(path, std::string("cannot encode the header: ") + e.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data region starts aligned.
  while ((kLengthPrefixBytes + text.size()) % kDataAlignment != 0) text += ' ';
  return text;
}

}  // namespace

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_writable(path, tensors);
  const auto order = file_order(tensors);
  const std::string header = header_text(path, tensors, order, metadata);

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail(path, "cannot create " + tmp.string());
    uint8_t prefix[kLengthPrefixBytes];
    for (size_t i = 0; i < kLengthPrefixBytes; ++i)
      prefix[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
    f.write(reinterpret_cast<const char*>(prefix), sizeof prefix);
    f.write(header.data(), std::streamsize(header.size()));
    for (size_t i : order) {
      const Tensor& t = tensors[i].second;
      if (!t.empty()) f.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
    }
    f.flush();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      fail(path, "write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    fail(path, "cannot move the written file into place: " + why);
  }
}

}  // namespace troupe
