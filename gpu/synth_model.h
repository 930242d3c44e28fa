#pragma once
// Random-weight checkpoints for tests and benchmarks: the same seed gives the
// same weights on any machine. Weights are scaled so that activations stay
// finite and of order one through every layer.
#include <cstdint>
#include <string>

#include "gpu/checkpoint.h"

namespace troupe {

// Named shapes: "tiny" (tests), "110m", "1b". Throws std::invalid_argument
// listing the names for an unknown one.
ModelConfig synth_preset(const std::string& name);

// An in-memory checkpoint with owning tensors in `dtype` (Hugging Face
// layout: rotate-half RoPE, untied classifier unless config says tied).
Checkpoint synth_checkpoint(const ModelConfig& config, uint64_t seed, DType dtype);

}  // namespace troupe
