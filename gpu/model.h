#pragma once
// The LLaMA-family decoder on the CPU backend. One call runs one step for a
// ragged batch: every sequence feeds its own tokens (a prefill chunk or one
// decode token) at its own positions, against its own paged cache.
// Projections run as one GEMM over all tokens of the step; attention runs per
// sequence and kv head, over tiles of the query heads that read it. Every per-token computation has
// a fixed order, so a sequence's logits are bit-identical whatever else shares its step.
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/cpu/gemm.h"
#include "gpu/cpu/kernels.h"
#include "gpu/cpu/packed_matrix.h"
#include "gpu/cpu/thread_pool.h"
#include "gpu/kv_cache.h"

namespace troupe {

class Communicator;

// Which part of the model a device holds: tensor-parallel rank `tp_rank` of
// `tp_size` (a slice of every layer's heads and FFN columns, and of the
// vocabulary), for layers [layer_begin, layer_end) of the pipeline.
struct ShardSpec {
  int tp_rank = 0;
  int tp_size = 1;
  int layer_begin = 0;
  int layer_end = -1;  // -1: through the last layer
};

// The slices a shard holds, derived from a ShardSpec and the model.
struct ShardDims {
  int layer_begin = 0, layer_end = 0;
  int head_begin = 0, heads = 0;        // query heads
  int kv_head_begin = 0, kv_heads = 0;  // kv heads (replicated when fewer than shards)
  int hidden_begin = 0, hidden = 0;     // FFN columns
  int vocab_begin = 0, vocab = 0;       // embedding / classifier rows
  int vocab_stride = 0;                 // ceil(vocab_size / tp_size): gather width
  bool first = true, last = true;       // holds the embedding / the classifier
  int layers() const { return layer_end - layer_begin; }
};

// A parallel layout that does not fit the model; what() says why, and for
// the tensor degree which degrees would fit.
class LayoutMisfit : public std::invalid_argument {
 public:
  enum class Axis { Tensor, Pipeline };
  LayoutMisfit(Axis axis, const std::string& why) : std::invalid_argument(why), axis_(axis) {}
  Axis axis() const { return axis_; }

 private:
  Axis axis_;
};

// The one rule for which layouts fit a model: the tensor degree T splits the
// attention heads evenly, splits the KV heads evenly or replicates them
// evenly (vLLM's rule), and is at most the FFN width and the vocabulary; the
// pipeline degree P is at most the layers (a stage needs one). Throws
// LayoutMisfit; std::invalid_argument for impossible model dimensions.
void check_layout_fits(const ModelConfig& config, int pipeline, int tensor);

// Throws std::invalid_argument saying why the layout does not fit the model
// (check_layout_fits, a rank or layer range out of bounds).
ShardDims shard_dims(const ModelConfig& config, const ShardSpec& spec);

struct StepInput {
  SequenceCache* cache = nullptr;
  std::span<const int> tokens;  // appended at positions cache->length, ...
  bool want_logits = true;      // logits of the last token of this input
  bool all_logits = false;      // every token's logits too (ShardIo::row_logits)
};

// Query heads of one step that attend together (kernels::attend_tile): all
// of one sequence and one kv head of this shard.
struct AttentionTile {
  int seq = 0;      // input index
  int kv_head = 0;  // of this shard
  int first = 0;    // into Workspace::tile_queries
  int count = 0;
};

// Scratch buffers of one step, grown on demand and then reused.
class Workspace {
 public:
  void ensure(const ModelConfig& c, const ShardDims& d, int tokens, int outputs, int threads);

  std::vector<float> x, xb, qkv, att, hb, tmp, final_in, logits;
  std::vector<float> row_in;  // normed rows of inputs that want all their logits
  std::vector<float> pieces;  // a tensor rank's row-parallel pieces, apart
  // Per thread: a tile's scores (kTileQueries rows of max_seq_len), then
  // the kernel's scratch.
  std::vector<std::vector<float>> scores;
  std::vector<int> pos, seq_of;
  std::vector<AttentionTile> tiles;               // the step's, the same in every layer
  std::vector<std::pair<int, int>> tile_queries;  // (token, local head)
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  PackedMatrix wqkv;                  // [q_dim + 2 kv_dim, dim]
  PackedMatrix wo;                    // [dim, q_dim]
  PackedMatrix gate_up;               // [2 hidden, dim]
  PackedMatrix down;                  // [dim, hidden]
  std::vector<float> qkv_bias;        // [q_dim + 2 kv_dim] of this shard's heads; empty: none
  std::vector<float> q_norm, k_norm;  // [head_dim]; empty: none
  std::vector<float> post_attn_norm, post_ffn_norm;  // [dim]; empty: none
};

// What a shard exchanges with its peers in one step.
struct ShardIo {
  Communicator* tp = nullptr;       // the tensor-parallel group; null when tp_size == 1
  const float* x_in = nullptr;      // not first stage: [tokens, dim] from the previous stage
  float* x_out = nullptr;           // not last stage: [tokens, dim] for the next stage
  float* logits = nullptr;          // last stage: one row of vocab_stride per input (this
                                    // shard's vocabulary slice at its start)
  float* row_logits = nullptr;      // last stage: one row of vocab_stride per token of the
                                    // inputs with all_logits, in input order
  double* layer_seconds = nullptr;  // when set: wall time added per layer of this shard
                                    // (the classifier counts on the last one)
};

class Model {
 public:
  // Packs the checkpoint's weights in `weight_dtype` (f32, f16 or bf16); a
  // shard packs only its slices.
  Model(const Checkpoint& ckpt, DType weight_dtype, ShardSpec shard = {});
  // Loads and packs; throws CheckpointError.
  static std::shared_ptr<const Model> load(const std::filesystem::path& path, DType weight_dtype);

  const ModelConfig& config() const { return config_; }
  const ShardDims& dims() const { return dims_; }
  // A KV cache laid out for this shard (its layers and kv heads), of
  // elements `kv_dtype`.
  KvCache make_cache(int block_tokens, int blocks, DType kv_dtype = DType::F32) const;
  DType weight_dtype() const { return weight_dtype_; }
  const std::filesystem::path& tokenizer_path() const { return tokenizer_path_; }
  const std::filesystem::path& source() const { return source_; }
  // Bytes of all weights held in memory.
  size_t weight_bytes() const;
  // Bytes of weights one decode step streams (everything but the embedding).
  size_t weight_bytes_per_step() const;

  // Runs one step. Checks every id, position and block table first
  // (std::invalid_argument naming the problem, nothing changed), then writes
  // each input's keys and values into its blocks and advances its length.
  // `logits` has one row of vocab_size per input; rows of inputs that do not
  // want logits are left untouched.
  // Whole model only (one shard holding everything).
  void forward(std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool, Workspace& ws,
               float* logits, float* row_logits = nullptr) const;
  // This shard's part of a step; every shard of a tensor-parallel group calls
  // it at the same time with the same inputs.
  void forward_shard(std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool,
                     Workspace& ws, const ShardIo& io) const;

 private:
  void validate(std::span<const StepInput> inputs) const;
  void embed(int token, float* out) const;
  void plan_attention(std::span<const StepInput> inputs, Workspace& ws) const;
  void attention(int layer, std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool,
                 Workspace& ws) const;

  ModelConfig config_;
  ShardDims dims_;
  DType weight_dtype_;
  std::filesystem::path tokenizer_path_, source_;
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;
  PackedMatrix classifier_;
  // [vocab slice, dim] in weight dtype, or the checkpoint's quantized
  // blocks; empty when tied to the classifier.
  Tensor embedding_;
  kernels::RopeTable rope_;
  kernels::RopeTable rope_sliding_;  // sliding-window layers' (empty when none)
};

}  // namespace troupe
