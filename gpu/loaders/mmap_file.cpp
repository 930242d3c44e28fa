#include "gpu/loaders/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "gpu/checkpoint.h"

namespace troupe {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw CheckpointError(path.string() + ": " + what);
}

std::string errno_text(int err) {
  return std::strerror(err);
}

// Closes the descriptor on every path out of open(); the mapping does not need it.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) fail(path, "does not exist");
  if (std::filesystem::is_directory(status)) fail(path, "is a directory, expected a file");
  if (!std::filesystem::is_regular_file(status)) fail(path, "is not a regular file");

  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail(path, "cannot open: " + errno_text(errno));
  // Size from the open descriptor, not the earlier stat, so a file replaced in
  // between cannot make us map more than it holds.
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
  if (st.st_size == 0) fail(path, "is empty");
  const size_t size = size_t(st.st_size);

  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (p == MAP_FAILED)
    fail(path, "cannot memory-map " + std::to_string(size) + " bytes: " + errno_text(errno));
  std::unique_ptr<MappedFile> owner;
  try {
    owner.reset(new MappedFile(path, static_cast<const uint8_t*>(p), size));
  } catch (...) {
    ::munmap(p, size);  // nothing owns the mapping yet
    throw;
  }
  return std::shared_ptr<const MappedFile>(std::move(owner));
}

MappedFile::~MappedFile() {
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace troupe
