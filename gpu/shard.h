#pragma once
// One device's share of a replica: a range of layers and a tensor-parallel
// slice of them (ShardSpec), with its own weights and KV cache. The
// ParallelEngine drives shards of any backend alike: each takes its
// micro-batch's items, reads the previous stage's activations from the host
// (ShardIo::x_in), all-reduces partial sums through its tensor group, and
// leaves the next stage's input or its logits slice in host memory.
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/comm/communicator.h"
#include "gpu/model.h"
#include "service/step_item.h"

namespace troupe {

class Shard {
 public:
  virtual ~Shard() = default;

  virtual const ShardDims& dims() const = 0;
  // Runs `items` (whose block tables and positions the scheduler set) through
  // this shard's layers, appending their tokens to its KV cache. Every item
  // is checked first (std::invalid_argument naming it, nothing touched).
  // Returns once io's outputs are in host memory.
  virtual void forward(std::span<const StepItem> items, const ShardIo& io) = 0;
  // Bytes of the weights it holds, and of those one decode step reads.
  virtual size_t weight_bytes() const = 0;
  virtual size_t streamed_bytes() const = 0;
};

// Makes the shard of device `device` (stage-major index in the replica)
// holding `spec`.
using ShardFactory = std::function<std::unique_ptr<Shard>(const ShardSpec& spec, int device)>;
// The T ranks of a tensor group whose devices are all in this process
// (stage `stage`); a backend whose devices exchange faster than through
// host memory gives its own.
using LocalGroupFactory =
    std::function<std::vector<std::unique_ptr<Communicator>>(int stage, int ranks)>;

// CPU shards: the checkpoint's slice packed in `dtype`, each with a pool of
// threads[device] threads (one entry: the same for all) and a KV cache of
// `blocks` blocks of `block_tokens` positions of `kv_dtype` elements.
ShardFactory cpu_shards(const Checkpoint& ckpt, DType dtype, std::vector<int> threads,
                        int block_tokens, int blocks, DType kv_dtype = DType::F32);

}  // namespace troupe
