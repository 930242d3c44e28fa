#include "gpu/checkpoint.h"

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
  return load_llama2c(path);
}

}  // namespace troupe
