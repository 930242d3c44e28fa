#include "fuzz_support.h"

#include <unistd.h>

#include <fstream>
#include <system_error>

namespace troupe::fuzz {

namespace fs = std::filesystem;

std::vector<std::string_view> split(std::string_view input, std::string_view separator,
                                    size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = input.find(separator);
    if (at == std::string_view::npos) break;
    parts.push_back(input.substr(0, at));
    input.remove_prefix(at + separator.size());
  }
  parts.push_back(input);
  return parts;
}

namespace {

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::error_code ec;
    const fs::path base =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    path = base / ("troupe-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

const fs::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

fs::path scratch_file(const std::string& name, std::string_view bytes) {
  const fs::path p = scratch_dir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.close();
  if (!out) violated("cannot write the scratch file " + p.string());
  return p;
}

fs::path fresh_scratch_subdir(const std::string& name) {
  const fs::path p = scratch_dir() / name;
  std::error_code ec;
  fs::remove_all(p, ec);
  fs::create_directories(p);
  return p;
}

fs::path source_path(const std::string& relative) {
  return fs::path(TROUPE_SOURCE_DIR) / relative;
}

void violated(const std::string& what) {
  std::fprintf(stderr, "fuzz: broken promise: %s\n", what.c_str());
  std::abort();
}

}  // namespace troupe::fuzz
