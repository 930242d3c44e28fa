#pragma once
// The model's weights in the device pool: per layer the fused QKV and
// gate|up matrices (the checkpoint's row blocks stacked, as the CPU model
// packs them), the output and down projections in the weights' dtype, norms
// in f32. A shard holds its layers' slices as the CPU shard does (heads,
// FFN columns, vocabulary rows; gpu/model.h), but the whole embedding
// table: a first stage then embeds without an all-reduce. Planned into the
// pool first, uploaded once the pool exists.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/cuda/memory_plan.h"
#include "gpu/model.h"

namespace troupe::cu {

struct DeviceLayer {
  const void* wqkv = nullptr;     // [q + 2 kv, dim]
  const void* wo = nullptr;       // [dim, q]
  const void* gate_up = nullptr;  // [2 hidden, dim]
  const void* down = nullptr;     // [dim, hidden]
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
};

struct DeviceWeights {
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;
  const void* classifier = nullptr;  // [vocab slice, dim]; last stage only
  const void* embedding = nullptr;   // [vocab, dim], first stage only; the classifier when tied
  size_t bytes = 0;                  // everything uploaded
  size_t streamed_bytes = 0;         // what one decode step reads (all but the embedding)
};

class WeightPlan {
 public:
  // Adds every weight tensor of the shard `dims` to `plan` (group "weights").
  WeightPlan(PoolPlan& plan, const ModelConfig& model, const ShardDims& dims, DType dtype);
  // Converts and copies the checkpoint's tensors into the pool at `pool`
  // (synchronous: start-up only).
  DeviceWeights upload(const Checkpoint& ckpt, char* pool) const;

 private:
  struct LayerOffsets {
    size_t wqkv, wo, gate_up, down, attn_norm, ffn_norm;
  };
  DType dtype_;
  ShardDims dims_;
  int head_dim_ = 0;
  std::vector<LayerOffsets> layers_;
  size_t final_norm_ = 0, classifier_ = 0, embedding_ = 0;
  bool tied_ = true;  // the embedding is this shard's classifier
  size_t bytes_ = 0, embedding_bytes_ = 0;
};

}  // namespace troupe::cu
