#pragma once
// Helpers shared by the tests: paths to bundled data, temp dirs, running the
// CLI (tests/support/process_support.h has child processes and HTTP).
#include <filesystem>
#include <string>
#include <vector>

namespace troupe::test {

// The repository: $TROUPE_SOURCE_DIR, else where the tests were built from.
std::filesystem::path source_dir();
std::filesystem::path model_path(const std::string& name);  // models/NAME
std::filesystem::path data_path(const std::string& name);   // tests/data/NAME
// The troupe command under test (integration tests).
std::string troupe_binary();

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::string read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, const std::string& bytes);

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs argv (no shell), capturing stdout and stderr; kills it after timeout_s.
CommandResult run_command(const std::vector<std::string>& argv, int timeout_s = 120);

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The value of the Prometheus sample line that starts with `series `
// (the exact series text), or "<missing>".
std::string prometheus_sample(const std::string& text, const std::string& series);

}  // namespace troupe::test
