#include "gpu/model_config.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace troupe {

std::vector<float> rope_frequencies(int head_dim, float theta, const RopeScaling& s) {
  std::vector<float> freq(size_t(head_dim / 2));
  // In float, the order transformers uses, so the rotations are its own.
  constexpr float kTwoPi = 6.283185307179586f;
  for (size_t i = 0; i < freq.size(); ++i) {
    float f = 1.0f / std::pow(theta, float(2 * i) / float(head_dim));
    if (s.kind == RopeScaling::Kind::Linear) f /= s.factor;
    if (s.kind == RopeScaling::Kind::Factors) f /= s.freq_factors[i];
    if (s.kind == RopeScaling::Kind::Llama3) {
      const float old_len = float(s.original_max_position);
      const float wavelen = kTwoPi / f;
      if (wavelen > old_len / s.low_freq_factor) {
        f /= s.factor;
      } else if (!(wavelen < old_len / s.high_freq_factor)) {
        const float smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    freq[i] = f;
  }
  return freq;
}

void ModelConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(source + ": " + what); };
  auto positive = [&](const char* name, int v) {
    if (v <= 0) fail(std::string(name) + " must be positive, got " + std::to_string(v));
  };
  positive("dim", dim);
  positive("hidden_dim", hidden_dim);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  if (dim % n_heads != 0)
    fail("hidden size " + std::to_string(dim) + " is not divisible by the number of heads " +
         std::to_string(n_heads));
  if (n_heads % n_kv_heads != 0)
    fail("the number of kv heads " + std::to_string(n_kv_heads) +
         " does not divide the number of heads " + std::to_string(n_heads));
  if (head_dim % 2 != 0) fail("head_dim " + std::to_string(head_dim) + " must be even for RoPE");
  if (!(rope_theta > 0)) fail("rope_theta must be positive");
  if (rope_scaling.kind != RopeScaling::Kind::None && !(rope_scaling.factor >= 1))
    fail("rope_scaling.factor must be at least 1");
  if (rope_scaling.kind == RopeScaling::Kind::Factors &&
      (rope_scaling.freq_factors.size() != size_t(head_dim / 2) ||
       !std::all_of(rope_scaling.freq_factors.begin(), rope_scaling.freq_factors.end(),
                    [](float f) { return f > 0 && std::isfinite(f); })))
    fail("RoPE frequency factors must be " + std::to_string(head_dim / 2) +
         " positive numbers (one per frequency)");
  if (rope_scaling.kind == RopeScaling::Kind::Llama3 &&
      !(rope_scaling.low_freq_factor > 0 &&
        rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
        rope_scaling.original_max_position > 0))
    fail(
        "rope_scaling (llama3) needs 0 < low_freq_factor < high_freq_factor and a positive "
        "original_max_position_embeddings");
  if (!(norm_eps > 0)) fail("rms_norm_eps must be positive");
  if (!sliding_layers.empty() && sliding_layers.size() != size_t(n_layers))
    fail("the sliding-window pattern names " + std::to_string(sliding_layers.size()) +
         " layers of " + std::to_string(n_layers));
  if (std::find(sliding_layers.begin(), sliding_layers.end(), true) != sliding_layers.end() &&
      (sliding_window <= 0 || !(rope_theta_sliding > 0)))
    fail("sliding-window layers need a positive window and RoPE theta");
  if (!(embed_scale > 0) || !std::isfinite(embed_scale) || !(attn_scale >= 0) ||
      !std::isfinite(attn_scale))
    fail("embedding and attention scales must be positive and finite");
  // Guard against absurd sizes that would overflow index arithmetic. In
  // double: q_dim() is an int product that absurd head counts overflow, and
  // it (with kv_dim() <= it) must fit in an int for everything after this.
  const double big = 1ull << 40;
  const double q = double(n_heads) * head_dim;
  if (double(vocab_size) * dim > big || double(hidden_dim) * dim > big || q * dim > big ||
      q > std::numeric_limits<int>::max())
    fail("tensor sizes are absurdly large");
  if (bos_id < 0 || bos_id >= vocab_size)
    fail("bos_token_id " + std::to_string(bos_id) + " is outside the vocabulary");
  for (int e : eos_ids)
    if (e < 0 || e >= vocab_size)
      fail("eos_token_id " + std::to_string(e) + " is outside the vocabulary");
}

void limit_to_sliding_window(ModelConfig& c, int window, const std::string& source) {
  if (window <= 0)
    throw std::invalid_argument(source + ": the sliding window must be positive, got " +
                                std::to_string(window));
  if (window >= c.max_seq_len) return;
  spdlog::warn(
      "{}: the sliding window {} is below the context {}; serving a context of {} "
      "(sliding-window attention is not implemented)",
      source, window, c.max_seq_len, window);
  c.max_seq_len = window;
}

void use_gemma3_layers(ModelConfig& c) {
  c.activation = FfnActivation::GeluTanh;
  c.embed_scale = std::sqrt(float(c.dim));
  c.qk_norm = true;
  c.post_norms = true;
}

std::vector<bool> sliding_every_but_nth(int layers, int every) {
  if (every < 0)
    throw std::invalid_argument("the sliding-window pattern must not be negative, got " +
                                std::to_string(every));
  std::vector<bool> sliding(size_t(std::max(layers, 0)), true);
  for (int l = every - 1; every > 0 && l < layers; l += every) sliding[size_t(l)] = false;
  return sliding;
}

bool ModelConfig::gemma_parts() const {
  return activation != FfnActivation::Silu || embed_scale != 1 || attn_scale != 0 ||
         norm_offset != 0 || post_norms ||
         std::find(sliding_layers.begin(), sliding_layers.end(), true) != sliding_layers.end();
}

bool ModelConfig::is_eos(int id) const {
  return std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
}

}  // namespace troupe
