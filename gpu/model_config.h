#pragma once
// Hyper-parameters of a LLaMA-family decoder, as read from a checkpoint.
#include <cstddef>
#include <string>
#include <vector>

#include "gpu/dtype.h"

namespace troupe {

// How RoPE pairs the elements of a head: llama2.c rotates adjacent pairs
// (2i, 2i+1); Hugging Face Llama rotates (i, i + head_dim/2).
enum class RopeLayout { Interleaved, RotateHalf };

// The FFN gate's activation: SiLU (Llama), or GELU's tanh form (Gemma).
enum class FfnActivation { Silu, GeluTanh };

// KV-cache bytes per token for `layers` layers of `kv_dim` keys and values
// stored as `kv`: the one formula for the model, a shard's cache and the
// partitioner.
inline size_t kv_bytes_per_token(int layers, int kv_dim, DType kv = DType::F32) {
  return size_t(layers) * 2 * size_t(kv_dim) * dtype_size(kv);
}

// RoPE stretched for a longer context than the model was trained on
// (config.json's rope_scaling), as transformers computes it.
struct RopeScaling {
  // Factors: frequency i divided by freq_factors[i] (a GGUF's rope_freqs
  // tensor: llama.cpp's converter stores Llama 3.1's scaling so).
  enum class Kind { None, Linear, Llama3, Factors };
  Kind kind = Kind::None;
  float factor = 1;  // Linear: positions / factor; Llama3: low frequencies / factor
  // Llama3: wavelengths over original_max_position / low_freq_factor are
  // scaled, under original_max_position / high_freq_factor kept, and those
  // between blended.
  float low_freq_factor = 1, high_freq_factor = 4;
  int original_max_position = 8192;
  std::vector<float> freq_factors;  // Factors: one per frequency (head_dim / 2)
  bool operator==(const RopeScaling&) const = default;
};

// RoPE's head_dim / 2 rotation frequencies: theta^(-2i / head_dim), scaled.
std::vector<float> rope_frequencies(int head_dim, float theta, const RopeScaling& scaling = {});

struct ModelConfig {
  int dim = 0;         // hidden size
  int hidden_dim = 0;  // FFN intermediate size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_seq_len = 0;  // context length
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;
  bool tied_classifier = true;
  // Qwen2: the q, k and v projections add a bias (o, the FFN: none).
  bool qkv_bias = false;
  // Qwen3: each query and key head is RMS-normalised (one weight vector of
  // head_dim for all heads) before RoPE.
  bool qk_norm = false;
  RopeLayout rope = RopeLayout::Interleaved;
  // Gemma 3: GELU gates; embeddings scaled (by sqrt(dim)); scores scaled by
  // attn_scale (0: 1/sqrt(head_dim)); every RMS norm's scale is
  // norm_offset + w (a Hugging Face checkpoint stores w - 1, llama.cpp's
  // converter adds the 1 back); each attention and FFN output normed again
  // before it joins the residual (post_norms).
  FfnActivation activation = FfnActivation::Silu;
  float embed_scale = 1;
  float attn_scale = 0;
  float norm_offset = 0;
  bool post_norms = false;
  // Layers marked in sliding_layers (one flag per layer, or none) attend to
  // their last sliding_window positions only, their own included, and
  // rotate by rope_theta_sliding, unscaled; the others see every position.
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  float rope_theta_sliding = 10000.0f;
  int bos_id = 1;
  std::vector<int> eos_ids{2};

  int q_dim() const { return n_heads * head_dim; }
  bool is_sliding(int layer) const {
    return size_t(layer) < sliding_layers.size() && sliding_layers[size_t(layer)];
  }
  // True for a model with any of Gemma's parts above.
  bool gemma_parts() const;
  int kv_dim() const { return n_kv_heads * head_dim; }
  // KV-cache bytes one token takes on a device holding every layer.
  size_t kv_bytes_per_token(DType kv = DType::F32) const;
  // Throws std::invalid_argument naming `source` and the inconsistent fields.
  void validate(const std::string& source) const;
  bool is_eos(int id) const;
};

// Gemma 3's computation on top of Llama's, as both checkpoint formats have
// it: GELU gates, embeddings scaled by sqrt(dim), q/k norms, and norms of
// the attention's and the FFN's outputs.
void use_gemma3_layers(ModelConfig& c);
// Gemma 3's sliding-window pattern: every `every`-th layer sees every
// position, the others the window (every 0: all of them the window).
// Throws std::invalid_argument for every < 0.
std::vector<bool> sliding_every_but_nth(int layers, int every);

// Sliding-window attention (Mistral's, Phi-3's) sees only the last `window`
// positions; the full attention computed here gives the same answers only
// while the context fits in the window, so the context is cut to it (said in
// the log, naming `source`). Throws std::invalid_argument for window <= 0.
void limit_to_sliding_window(ModelConfig& c, int window, const std::string& source);

inline size_t ModelConfig::kv_bytes_per_token(DType kv) const {
  return troupe::kv_bytes_per_token(n_layers, kv_dim(), kv);
}

}  // namespace troupe
