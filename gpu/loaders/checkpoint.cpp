#include "gpu/checkpoint.h"

#include "util/gguf_file.h"

namespace troupe {

namespace fs = std::filesystem;

Checkpoint load_checkpoint(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) throw CheckpointError(path.string() + ": does not exist");
  if (fs::is_directory(status)) return load_hf_dir(path);
  if (!fs::is_regular_file(status))
    throw CheckpointError(path.string() + ": is neither a regular file nor a directory");
  // A file from a Hugging Face checkpoint would otherwise fail llama2.c's size
  // check with a baffling message.
  if (path.extension() == ".safetensors" || path.extension() == ".json")
    throw CheckpointError(path.string() +
                          ": looks like one file of a Hugging Face checkpoint; pass the directory "
                          "that holds config.json instead");
  if (path.extension() == ".gguf" || GgufFile::has_magic(path)) return load_gguf(path);
  return load_llama2c(path);
}

}  // namespace troupe
