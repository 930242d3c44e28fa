#pragma once
// The LLaMA-family decoder on the CPU backend. One call runs one step for a
// ragged batch: every sequence feeds its own tokens (a prefill chunk or one
// decode token) at its own positions, against its own paged cache.
// Projections run as one GEMM over all tokens of the step; attention runs per
// sequence and head. Every per-token computation has a fixed order, so a
// sequence's logits are bit-identical whatever else shares its step.
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/cpu/gemm.h"
#include "gpu/cpu/kernels.h"
#include "gpu/cpu/packed_matrix.h"
#include "gpu/cpu/thread_pool.h"
#include "gpu/kv_cache.h"

namespace troupe {

struct StepInput {
  SequenceCache* cache = nullptr;
  std::span<const int> tokens;  // appended at positions cache->length, ...
  bool want_logits = true;      // logits of the last token of this input
};

// Scratch buffers of one step, grown on demand and then reused.
class Workspace {
 public:
  void ensure(const ModelConfig& c, int tokens, int outputs, int threads);

  std::vector<float> x, xb, qkv, att, hb, tmp, final_in;
  std::vector<std::vector<float>> scores;  // per thread, max_seq_len
  std::vector<int> pos, seq_of;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  PackedMatrix wqkv;     // [q_dim + 2 kv_dim, dim]
  PackedMatrix wo;       // [dim, q_dim]
  PackedMatrix gate_up;  // [2 hidden, dim]
  PackedMatrix down;     // [dim, hidden]
};

class Model {
 public:
  // Packs the checkpoint's weights in `weight_dtype` (f32, f16 or bf16).
  Model(const Checkpoint& ckpt, DType weight_dtype);
  // Loads and packs; throws CheckpointError.
  static std::shared_ptr<const Model> load(const std::filesystem::path& path, DType weight_dtype);

  const ModelConfig& config() const { return config_; }
  DType weight_dtype() const { return weight_dtype_; }
  const std::filesystem::path& tokenizer_path() const { return tokenizer_path_; }
  const std::filesystem::path& source() const { return source_; }
  // Bytes of all weights held in memory.
  size_t weight_bytes() const;
  // Bytes of weights one decode step streams (everything but the embedding).
  size_t weight_bytes_per_step() const;

  // Runs one step. Checks every id and position first (std::invalid_argument
  // naming the problem), then reserves cache blocks for all inputs (KvCacheFull
  // with nothing changed). `logits` has one row of vocab_size per input; rows
  // of inputs that do not want logits are left untouched.
  void forward(std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool,
               Workspace& ws, float* logits) const;

 private:
  void validate(std::span<const StepInput> inputs) const;
  void embed(int token, float* out) const;
  void attention(int layer, int tokens, std::span<const StepInput> inputs, KvCache& cache,
                 ThreadPool& pool, Workspace& ws) const;

  ModelConfig config_;
  DType weight_dtype_;
  std::filesystem::path tokenizer_path_, source_;
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;
  PackedMatrix classifier_;
  Tensor embedding_;  // [vocab, dim] in weight dtype; empty when tied to the classifier
  kernels::RopeTable rope_;
};

}  // namespace troupe
