#pragma once
// The safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
// {string: string}}, then the raw tensor bytes (offsets relative to the end of
// the header). Only F32, F16 and BF16 tensors are accepted.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu/loaders/mmap_file.h"
#include "gpu/tensor.h"

namespace troupe {

struct SafetensorsFile {
  std::filesystem::path path;
  std::shared_ptr<const MappedFile> mapping;
  // Views into `mapping` (each keeps it alive); a tensor whose bytes are not
  // aligned to its element size is copied instead, so readers may always
  // dereference data<T>() directly.
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  // Null when the file has no tensor of that name.
  const Tensor* find(const std::string& name) const;
};

// Maps and parses `path`, checking the whole header (sizes, offsets, dtypes,
// shapes) before any tensor is handed out. Throws CheckpointError naming the
// file and the problem.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

// Writes `tensors` (names unique, not "__metadata__") and `metadata`. The data
// region starts on an 8-byte boundary and tensors are laid out contiguously in
// order of decreasing element size, then name, so each starts aligned to its
// element size; gaps between tensors would be rejected by the reference
// safetensors library. Written through a temporary file and renamed, so a
// failed write never leaves a half-written file at `path`.
// Throws CheckpointError naming `path`.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace troupe
