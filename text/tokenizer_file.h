#pragma once
// Reading a tokenizer's files whole, with errors that name them.
#include <filesystem>
#include <string>

namespace troupe {

// The file's bytes. Throws std::runtime_error naming `path` when it is
// missing, not a regular file, unreadable or too large for a `kind` (a few
// hundred MB: a tokenizer file, not a checkpoint pointed at by mistake).
std::string read_tokenizer_file(const std::filesystem::path& path, const char* kind);

}  // namespace troupe
