// Helpers shared by the subcommands.
#include "apps/commands.h"

#include <filesystem>
#include <thread>

namespace troupe::app {

std::filesystem::path default_model_path() {
  const std::filesystem::path here = "models/fortune";
  if (std::filesystem::exists(here)) return here;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (std::filesystem::exists(dir / "models/fortune")) return dir / "models/fortune";
    }
  }
  return here;
}

std::filesystem::path resolve_tokenizer(const std::filesystem::path& model_tokenizer,
                                        const std::string& option) {
  if (!option.empty()) return option;
  return model_tokenizer;
}

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

}  // namespace troupe::app
