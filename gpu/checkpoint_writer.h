#pragma once
// Writes a checkpoint as a Hugging Face directory (config.json +
// model.safetensors), the layout load_hf_dir reads back.
#include <filesystem>

#include "gpu/checkpoint.h"

namespace troupe {

// Tensors are written in their own dtype. Throws CheckpointError naming the
// file on I/O failure.
void write_hf_checkpoint(const Checkpoint& ckpt, const std::filesystem::path& dir);

}  // namespace troupe
