#pragma once
// What identifies a model across processes: a node that joins a coordinator
// must serve the very same model, or a request resumed on it would continue
// with other weights. Cheap enough for multi-gigabyte checkpoints: the shape
// of the model, the weights' dtype in memory, and every tensor's shape with
// its first and last bytes.
#include <string>

#include "gpu/checkpoint.h"

namespace troupe {

// 16 hex digits; equal for equal models, different for a different shape,
// dtype, or (almost surely) weights.
std::string model_fingerprint(const Checkpoint& checkpoint, DType weight_dtype);
// The fingerprint and what a person reads to tell two models apart
// ("5e22... (bf16 weights, dim 64, 3 layers, vocabulary 2000, context 256)"):
// what nodes present when they join, equal for equal models.
std::string model_identity(const Checkpoint& checkpoint, DType weight_dtype);

}  // namespace troupe
