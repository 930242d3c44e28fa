#pragma once
// What the fuzz targets share: inputs split into parts, a private scratch
// directory for inputs that the code under test reads as files, the bundled
// data, and the oracle for "only the documented exception".
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at each `separator`, into at most `max_parts` parts (the last
// keeps the rest, separators included).
std::vector<std::string_view> split(std::string_view input, std::string_view separator,
                                    size_t max_parts);

// The separator of multi-file inputs (the Hugging Face directory); each
// target's dictionary lists it, so that mutations keep the structure.
inline constexpr std::string_view kFileSeparator = "\n====\n";

// A directory of this process's own under /dev/shm (else the temp dir): a
// file per input costs a write to memory, not to disk. Removed at exit.
const std::filesystem::path& scratch_dir();
// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
std::filesystem::path scratch_file(const std::string& name, std::string_view bytes);
// Empties scratch_dir()/name, a directory created on first use.
std::filesystem::path fresh_scratch_subdir(const std::string& name);

// TROUPE_SOURCE_DIR / relative: the bundled models and configs.
std::filesystem::path source_path(const std::string& relative);

// A broken promise of the code under test (not the input's fault): printed,
// then abort(), which libFuzzer records as a crash with this input.
[[noreturn]] void violated(const std::string& what);

// Runs `f`; an exception of type E is the documented answer to bad input and
// is swallowed (returns false); anything else escapes to libFuzzer, which
// reports it as a crash. True when `f` returned normally.
template <class E, class F>
bool expect_only(F&& f) {
  try {
    f();
    return true;
  } catch (const E&) {
    return false;
  }
}

}  // namespace troupe::fuzz
