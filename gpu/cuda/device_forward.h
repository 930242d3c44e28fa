#pragma once
// One CUDA device's part of a model, the whole of it or a shard's slice
// (ShardDims): the device pool (weights, KV cache, one step's activations
// and metadata, the cuBLASLt workspace), the stream, and the forward pass
// over them. The whole-model engine (cuda_engine.cpp) adds graphs and
// sampling on the device; a shard (cuda_shard.cpp) adds the host-side
// exchange with the other stages and its tensor group.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gpu/checkpoint.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/decode_split.h"
#include "gpu/cuda/device_model.h"
#include "gpu/cuda/gemm.h"
#include "gpu/cuda/memory_plan.h"
#include "gpu/cuda/step_metadata.h"
#include "gpu/model.h"

namespace troupe::cu {

// Launch shapes of one step; a graph is captured for one of these.
struct ForwardShape {
  int tokens = 0;
  int items = 0;
  int rows = 0;  // logits rows computed (and sampled, when sampling)
  int max_item_tokens = 1;
  DecodeSplit split;
};

// A tensor group's all-reduce of `n` f32 on the device, in rank order,
// between two kernels of a shard's forward; it waits for the work queued on
// the stream before it, and its result is there for the work queued after.
using DeviceReduce = std::function<void(float* data, size_t n)>;

// Throws std::invalid_argument unless the sizes in `options` are positive.
void check_options(const CudaEngineOptions& options);

// The slices of `model` a shard holds as a model of its own: its layers,
// query and KV heads, FFN columns and vocabulary rows.
ModelConfig shard_config(const ModelConfig& model, const ShardDims& dims);

class DeviceForward {
 public:
  // Plans the pool for `dims` of the checkpoint's model, checks it against
  // the device's free memory (DeviceMemoryError naming what did not fit),
  // allocates it and uploads the weights in `dtype`. Throws
  // std::runtime_error when CUDA is unavailable, std::invalid_argument when
  // the slice does not suit the kernels.
  DeviceForward(const Checkpoint& ckpt, DType dtype, const ShardDims& dims,
                const CudaEngineOptions& options);
  ~DeviceForward();
  DeviceForward(const DeviceForward&) = delete;
  DeviceForward& operator=(const DeviceForward&) = delete;

  const ModelConfig& model() const { return model_; }  // the whole model's
  const ShardDims& dims() const { return dims_; }
  DType dtype() const { return dtype_; }
  const CudaEngineOptions& options() const { return options_; }
  const StepLayout& layout() const { return layout_; }
  const std::string& name() const { return name_; }  // "CUDA device 0 (NVIDIA H200)"
  cudaStream_t stream() const { return stream_; }
  size_t weight_bytes() const { return weights_.bytes; }
  size_t streamed_bytes() const { return weights_.streamed_bytes; }
  size_t pool_bytes() const { return pool_bytes_; }
  void use_device() const;

  // Device buffers: the step metadata (StepLayout), the residual stream
  // [tokens, dim], the logits [rows, vocab slice], sampled ids and flags.
  void* metadata() const { return pool_ + buf_.metadata; }
  float* x() const { return at<float>(buf_.x); }
  float* logits() const { return at<float>(buf_.logits); }
  int* sampled() const { return at<int>(buf_.sampled); }
  int* flags() const { return at<int>(buf_.flags); }

  // The launch shape of a packed step run eagerly, and of the decode graph
  // of `padded_items` sequences.
  ForwardShape eager_shape(const PackedStep& packed) const;
  ForwardShape graph_shape(int padded_items) const;

  // Queues the step whose metadata is on the device: the embedding (first
  // shard; others start from x as the previous stage left it), the layers,
  // then on the last shard the final norm and classifier of the sampled
  // tokens (and, with `sample`, the sampling kernel); a shard before the
  // last leaves its output in x. `reduce` all-reduces the output and down
  // projections' partial sums of a tensor-parallel shard (empty: one rank).
  void forward(const ForwardShape& shape, bool sample, const DeviceReduce& reduce = {});

 private:
  template <class T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(pool_ + offset);
  }
  void* k_cache(int layer) const { return pool_ + kv_ + size_t(2 * layer) * kv_layer_bytes_; }
  void* v_cache(int layer) const { return pool_ + kv_ + size_t(2 * layer + 1) * kv_layer_bytes_; }
  void release();

  ModelConfig model_;  // the whole model
  ModelConfig local_;  // this slice of it (shard_config)
  ShardDims dims_;
  DType dtype_;
  CudaEngineOptions options_;
  int sm_count_ = 1;
  std::string name_;
  StepLayout layout_;
  StepBuffers buf_;
  size_t kv_ = 0, kv_layer_bytes_ = 0, pool_bytes_ = 0;
  char* pool_ = nullptr;
  DeviceWeights weights_;
  std::unique_ptr<Gemm> gemm_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace troupe::cu
