#pragma once
// Measured per-layer cost, for the pipeline partitioner: the whole model
// runs decode steps of a small batch with some context, and each layer's
// share of the step is timed (the classifier counts on the last layer, as
// the stage holding it runs it). Layers of one shape differ mostly by what
// rides on them, and on real hardware by placement and caches; measuring
// catches both where a count of layers or of bytes misses.
#include <cstdint>
#include <vector>

#include "gpu/checkpoint.h"

namespace troupe {

struct LayerProfileOptions {
  int batch = 8;     // sequences per timed decode step
  int context = 32;  // tokens already cached per sequence
  int repeats = 5;   // timed steps per layer; the median is kept
  int threads = 1;   // threads of the device that will run the stage
};

struct LayerProfile {
  std::vector<double> seconds;         // per layer: median decode-step time
  std::vector<uint64_t> weight_bytes;  // per layer: bytes its shard holds
};

// What a stage holding layer l keeps for it: the layer's matrices and norms,
// plus the embedding on the first layer and the final norm and classifier on
// the last (a split model holds both, tied or not).
std::vector<uint64_t> layer_weight_bytes(const ModelConfig& c, DType dtype);

// Builds the whole model for the measurement and frees it before returning.
// Throws what Model throws for a bad checkpoint, std::invalid_argument for
// bad options.
LayerProfile profile_layers(const Checkpoint& ckpt, DType weight_dtype,
                            const LayerProfileOptions& options = {});

}  // namespace troupe
