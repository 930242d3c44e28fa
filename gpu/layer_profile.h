#pragma once
// Measured per-layer cost, for the pipeline partitioner: each layer is built
// alone (the first with the embedding, the last with the final norm and the
// classifier, as the stage holding it would) and timed on decode steps of a
// small batch with some context. Layers of one shape differ mostly by what
// rides on them (the classifier), and on real hardware by placement and
// caches; measuring catches both where a count of layers or of bytes misses.
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

// Builds one layer at a time, so it needs the memory of one layer (plus the
// classifier) at most. Throws what Model throws for a bad checkpoint.
LayerProfile profile_layers(const Checkpoint& ckpt, DType weight_dtype,
                            const LayerProfileOptions& options = {});

}  // namespace troupe
