#pragma once
// The CUDA backend's public face: whether a CUDA device answers, a
// StepEngine that runs the whole model on one of them, and one that splits
// it over several (pipeline stages of tensor-parallel shards). Plain C++
// with no CUDA headers, so that deploy/ can call it in every build: without
// nvcc the availability check says so and the factories throw.
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/device_queue.h"
#include "gpu/dtype.h"
#include "gpu/engine.h"
#include "gpu/parallel_engine.h"

namespace troupe {

struct CudaEngineOptions {
  int device = 0;  // CUDA device index
  int block_tokens = 16;
  int blocks = 4096;  // KV blocks (the scheduler's book for this engine)
  // The largest step the engine takes: they size the activations in the
  // device pool, so a bigger step is refused rather than allocated.
  int max_batch_tokens = 2048;
  int max_batch_sequences = 256;
  // Device memory left unused after the pool (other processes, NCCL, the
  // CUDA context's own growth).
  size_t reserve_bytes = size_t(1) << 30;
  // Decode steps replay one captured CUDA graph per padded batch size; off:
  // every kernel launched eagerly (for debugging, or to compare).
  bool graphs = true;
  // Batch-invariant numerics: one fixed cuBLASLt algorithm per weight
  // shape without split-K, and decode attention split at a fixed length
  // whatever the batch. A sequence's logits are then bit-identical whatever
  // else shares its step (see README, "Same answer on the GPU").
  bool deterministic = false;
};

// True when a CUDA device answers. Any CUDA error counts as "no GPU" (with
// no driver the runtime answers cudaErrorInsufficientDriver, not "no
// device"); `why` (optional) gets the reason, or the device found.
bool cuda_device_available(std::string* why = nullptr);
// How many CUDA devices answer (0 on any error).
int cuda_device_count();

// The device memory pool could not hold something: what() names it, its
// size, what was free and what was already planned.
class DeviceMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The whole model on one CUDA device, weights and KV cache in `dtype`
// (bf16, f16, or f32), f32 accumulation. Throws std::runtime_error when CUDA
// is unavailable or the model does not suit the kernels (the message says
// which), DeviceMemoryError when the pool does not fit.
std::unique_ptr<StepEngine> make_cuda_engine(const Checkpoint& checkpoint, DType dtype,
                                             CudaEngineOptions options = {});

// The model over a layout of CUDA devices: a ParallelEngine (stages,
// micro-batches, credits, failures, placement across processes as on the
// CPU) whose device d (stage-major) is a shard on CUDA device
// cuda_devices[d] (one entry: every shard on it; shards may share a GPU,
// each with its own stream and pool). Each shard holds its slice in
// `dtype` with `options.blocks` KV blocks; options.device is unused.
// Shards run eagerly (options.graphs has no effect) and sample on the
// host, as the CPU layouts do. Activations cross stages through host
// memory. A tensor group whose ranks are on distinct GPUs of this process,
// none shared with another stage's group, all-reduces over NCCL on the
// device (in rank order: bit-identical to the other communicators);
// otherwise, or across processes, through host memory and the layout's
// communicator. Throws as make_cuda_engine does,
// and std::invalid_argument when the layout does not fit the model or the
// device list does not fit the layout.
std::unique_ptr<StepEngine> make_cuda_parallel_engine(const Checkpoint& checkpoint, DType dtype,
                                                      ParallelEngineOptions layout,
                                                      std::vector<int> cuda_devices,
                                                      CudaEngineOptions options = {},
                                                      DeviceLauncher launcher = {});

}  // namespace troupe
