#include "gpu/cuda/memory_plan.h"

#include <cstdio>

#include "gpu/cuda/decode_split.h"

namespace troupe::cu {

std::string format_bytes(size_t bytes) {
  char buf[32];
  const double b = double(bytes);
  if (bytes >= (size_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(size_t(1) << 30));
  else if (bytes >= (size_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(size_t(1) << 20));
  else if (bytes >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

size_t PoolPlan::add(const std::string& group, size_t bytes) {
  const size_t at = total_;
  const size_t aligned = (bytes + kPoolAlign - 1) / kPoolAlign * kPoolAlign;
  total_ += aligned;
  if (groups_.empty() || groups_.back().name != group) groups_.push_back({group, 0});
  groups_.back().bytes += aligned;
  return at;
}

void PoolPlan::check_fits(size_t free_bytes, size_t reserve_bytes,
                          const std::string& device) const {
  const size_t usable = free_bytes > reserve_bytes ? free_bytes - reserve_bytes : 0;
  size_t before = 0;
  std::string planned;
  for (const Group& g : groups_) {
    if (before + g.bytes > usable) {
      const size_t left = usable > before ? usable - before : 0;
      throw DeviceMemoryError(
          device + ": " + g.name + " needs " + format_bytes(g.bytes) + " but only " +
          format_bytes(left) + " is left (" + format_bytes(free_bytes) + " free, " +
          format_bytes(reserve_bytes) + " kept in reserve" +
          (planned.empty() ? std::string() : ", planned before it: " + planned) +
          "); lower the KV blocks, the largest step or the reserve");
    }
    before += g.bytes;
    planned += (planned.empty() ? "" : ", ") + g.name + " " + format_bytes(g.bytes);
  }
}

int max_decode_partitions(int max_seq_len) {
  const int shortest =
      kMinPartitionTokens < kFixedPartitionTokens ? kMinPartitionTokens : kFixedPartitionTokens;
  return (max_seq_len + shortest - 1) / shortest;
}

StepBuffers plan_step_buffers(PoolPlan& plan, const ModelConfig& m, DType act,
                              const StepLayout& layout) {
  const size_t T = size_t(layout.capacity.tokens), S = size_t(layout.capacity.items);
  const size_t a = dtype_size(act), f = sizeof(float);
  const size_t dim = size_t(m.dim), q = size_t(m.q_dim()), kv = size_t(m.kv_dim());
  const size_t hidden = size_t(m.hidden_dim), heads = size_t(m.n_heads);
  const size_t parts = size_t(max_decode_partitions(m.max_seq_len));
  const std::string group =
      "activations for " + std::to_string(T) + " tokens / " + std::to_string(S) + " sequences";
  StepBuffers b;
  b.x = plan.add(group, T * dim * f);
  b.xb = plan.add(group, T * dim * a);
  b.qkv = plan.add(group, T * (q + 2 * kv) * f);
  b.q = plan.add(group, T * q * f);
  b.att = plan.add(group, T * q * a);
  b.proj = plan.add(group, T * dim * f);
  b.gate_up = plan.add(group, T * 2 * hidden * f);
  b.h = plan.add(group, T * hidden * a);
  b.final_in = plan.add(group, S * dim * a);
  b.logits = plan.add(group, S * size_t(m.vocab_size) * f);
  b.partial_acc = plan.add(group, S * heads * parts * size_t(m.head_dim) * f);
  b.partial_max = plan.add(group, S * heads * parts * f);
  b.partial_sum = plan.add(group, S * heads * parts * f);
  b.sampled = plan.add(group, S * sizeof(int));
  b.flags = plan.add(group, S * sizeof(int));
  b.rope = plan.add(group, 2 * size_t(m.max_seq_len) * size_t(m.head_dim / 2) * f);
  b.metadata = plan.add("step metadata", layout.bytes);
  b.workspace = plan.add("cuBLAS workspace", kGemmWorkspaceBytes);
  return b;
}

size_t kv_cache_bytes(const ModelConfig& m, DType dtype, int block_tokens, int blocks) {
  return size_t(m.n_layers) * 2 * size_t(blocks) * size_t(block_tokens) * size_t(m.kv_dim()) *
         dtype_size(dtype);
}

}  // namespace troupe::cu
