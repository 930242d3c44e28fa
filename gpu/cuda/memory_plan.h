#pragma once
// The device memory pool, planned on the host: every buffer the engine will
// ever use (weights, KV blocks, activations for the largest step, the cuBLAS
// workspace, step metadata) gets an offset in one allocation made at
// start-up, so nothing is allocated while serving. The plan is checked
// against the device's free memory before that allocation: what does not fit
// is refused with a message naming it. Plain C++.
#include <cstddef>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/step_metadata.h"
#include "gpu/dtype.h"
#include "gpu/model_config.h"

namespace troupe::cu {

// Every buffer starts on this boundary (cudaMalloc's own alignment), which
// keeps 16-byte vector loads and cuBLAS's alignment requirements happy.
inline constexpr size_t kPoolAlign = 256;
// cuBLASLt's workspace on Hopper (NVIDIA's recommendation), fixed so that
// algorithm choice never depends on what memory is left.
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(size_t bytes);

class PoolPlan {
 public:
  // Reserves `bytes` for a buffer of `group` (groups are reported as a
  // whole: "weights", "KV cache (...)"); returns its offset in the pool.
  size_t add(const std::string& group, size_t bytes);
  size_t total() const { return total_; }

  struct Group {
    std::string name;
    size_t bytes = 0;
  };
  const std::vector<Group>& groups() const { return groups_; }

  // Throws DeviceMemoryError unless total() + reserve fits in free_bytes,
  // naming `device`, the first group that does not fit, its size and what
  // was free, reserved and planned before it.
  void check_fits(size_t free_bytes, size_t reserve_bytes, const std::string& device) const;

 private:
  std::vector<Group> groups_;
  size_t total_ = 0;
};

// Offsets (into the pool) of the buffers one step uses; f32 unless noted,
// "act" is the GEMM input type (the weights' dtype).
struct StepBuffers {
  size_t x = 0;            // [tokens, dim] residual stream
  size_t xb = 0;           // act [tokens, dim] normalised input of a projection
  size_t qkv = 0;          // [tokens, q + 2 kv] fused projection output
  size_t q = 0;            // [tokens, q] rotated queries
  size_t att = 0;          // act [tokens, q] attention output
  size_t proj = 0;         // [tokens, dim] output / down projection
  size_t gate_up = 0;      // [tokens, 2 hidden]
  size_t h = 0;            // act [tokens, hidden] silu(gate) * up
  size_t final_in = 0;     // act [items, dim] normalised last tokens
  size_t logits = 0;       // [items, vocab]
  size_t partial_acc = 0;  // [items, heads, partitions, head_dim] split decode
  size_t partial_max = 0;  // [items, heads, partitions]
  size_t partial_sum = 0;  // [items, heads, partitions]
  size_t sampled = 0;      // int32 [items] token ids
  size_t flags = 0;        // int32 [items] rows the host must settle
  size_t metadata = 0;     // StepLayout::bytes
  size_t rope = 0;         // [max_seq_len, head_dim / 2] cos, then sin
  size_t workspace = 0;    // kGemmWorkspaceBytes
};

// The most partitions any decode split plan makes for this context length.
int max_decode_partitions(int max_seq_len);

// Adds one step's buffers for `capacity` to the plan (group "activations
// for N tokens / M sequences" and "step metadata").
StepBuffers plan_step_buffers(PoolPlan& plan, const ModelConfig& model, DType act,
                              const StepLayout& layout);

// Bytes of the KV cache: layers x (K, V) x blocks x block_tokens x kv_dim.
size_t kv_cache_bytes(const ModelConfig& model, DType dtype, int block_tokens, int blocks);

}  // namespace troupe::cu
