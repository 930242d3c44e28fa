#pragma once
// A read-only memory-mapped file. Tensors loaded from a checkpoint view the
// mapping directly, so the mapping must outlive them: open() hands out a
// shared_ptr that converts to the std::shared_ptr<const void> keepalive that
// Tensor::view takes.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

namespace troupe {

class MappedFile {
 public:
  // Throws CheckpointError naming the path when the file is missing, is not a
  // regular file, is empty, or cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile(std::filesystem::path path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::filesystem::path path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace troupe
