#pragma once
// A checkpoint as it lies on disk: config plus row-major tensor views in the
// file's dtype ([out, in] for matrices, as Hugging Face and llama2.c store
// them). The compute model packs these into its own layout.
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/model_config.h"
#include "gpu/tensor.h"

namespace troupe {

// Any problem with a checkpoint file: missing, truncated, corrupt, wrong shape.
// The message names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LayerTensors {
  Tensor attn_norm;       // [dim]
  Tensor wq;              // [n_heads*head_dim, dim]
  Tensor wk;              // [n_kv_heads*head_dim, dim]
  Tensor wv;              // [n_kv_heads*head_dim, dim]
  Tensor wo;              // [dim, n_heads*head_dim]
  Tensor ffn_norm;        // [dim]
  Tensor w_gate;          // [hidden, dim]
  Tensor w_up;            // [hidden, dim]
  Tensor w_down;          // [dim, hidden]
  Tensor bq, bk, bv;      // [n_heads*head_dim], [kv], [kv] when config.qkv_bias; else empty
  Tensor q_norm, k_norm;  // [head_dim] each when config.qk_norm; else empty
  // [dim] each when config.post_norms: of the attention's output and the
  // FFN's, before each joins the residual; else empty
  Tensor post_attn_norm, post_ffn_norm;
};

struct Checkpoint {
  ModelConfig config;
  std::filesystem::path source;  // what was loaded
  Tensor tok_embedding;          // [vocab, dim]
  std::vector<LayerTensors> layers;
  Tensor final_norm;  // [dim]
  Tensor classifier;  // [vocab, dim]; same memory as tok_embedding when tied
  // tokenizer.model beside the weights, if present; a GGUF file itself
  std::filesystem::path tokenizer_path;
  // How CPU devices multiply its block-quantized tensors: not in the file,
  // the deployment's choice (model.quantized_products), carried with the
  // weights so that every engine built from them computes alike.
  QuantProducts quant_products = QuantProducts::Exact;
};

// Loads a llama2.c `.bin` (legacy version-0) file, a llama.cpp GGUF file
// or a Hugging Face directory (config.json + model.safetensors or a sharded
// index).
// Files are memory-mapped; the returned tensors keep the mappings alive.
// Throws CheckpointError.
Checkpoint load_checkpoint(const std::filesystem::path& path);

Checkpoint load_llama2c(const std::filesystem::path& file);
Checkpoint load_hf_dir(const std::filesystem::path& dir);
Checkpoint load_gguf(const std::filesystem::path& file);

}  // namespace troupe
