#include "gpu/synth_model.h"

#include <cmath>
#include <stdexcept>

#include "gpu/sampler.h"

namespace troupe {

namespace {

// Uniform in [-a, a] with a = sqrt(3) * stddev, from a portable generator.
Tensor random_tensor(std::vector<int64_t> shape, float stddev, Xoshiro256& rng, DType dtype) {
  Tensor t = Tensor::zeros(std::move(shape), dtype);
  const size_t n = size_t(t.numel());
  const double a = std::sqrt(3.0) * stddev;
  std::vector<float> buf(n);
  for (auto& v : buf) v = float((rng.next_double() * 2.0 - 1.0) * a);
  convert_from_f32(buf.data(), dtype, t.raw_mut(), n);
  return t;
}

Tensor ones_like_norm(int dim, Xoshiro256& rng, DType dtype) {
  Tensor t = Tensor::zeros({dim}, dtype);
  std::vector<float> buf(static_cast<size_t>(dim));
  // Near one, not exactly, so a norm applied to the wrong tensor shows up.
  for (auto& v : buf) v = float(1.0 + (rng.next_double() - 0.5) * 0.2);
  convert_from_f32(buf.data(), dtype, t.raw_mut(), buf.size());
  return t;
}

}  // namespace

ModelConfig synth_preset(const std::string& name) {
  ModelConfig c;
  c.rope = RopeLayout::RotateHalf;
  c.bos_id = 1;
  c.eos_ids = {2};
  c.tied_classifier = false;
  if (name == "tiny") {
    c.dim = 64, c.hidden_dim = 160, c.n_layers = 3, c.n_heads = 8, c.n_kv_heads = 2;
    c.vocab_size = 300, c.max_seq_len = 128;
  } else if (name == "110m") {
    c.dim = 768, c.hidden_dim = 2048, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12;
    c.vocab_size = 32000, c.max_seq_len = 1024;
  } else if (name == "1b") {
    c.dim = 2048, c.hidden_dim = 5632, c.n_layers = 22, c.n_heads = 32, c.n_kv_heads = 4;
    c.vocab_size = 32000, c.max_seq_len = 2048;
  } else {
    throw std::invalid_argument("unknown model preset '" + name + "' (known: tiny, 110m, 1b)");
  }
  c.head_dim = c.dim / c.n_heads;
  return c;
}

Checkpoint synth_checkpoint(const ModelConfig& config, uint64_t seed, DType dtype) {
  config.validate("synthetic model");
  Xoshiro256 rng(seed);
  Checkpoint ck;
  ck.config = config;
  ck.source = "synthetic(seed=" + std::to_string(seed) + ")";
  const int64_t d = config.dim, h = config.hidden_dim, q = config.q_dim(), kv = config.kv_dim();
  const float in_d = 1.0f / std::sqrt(float(d));
  // Residual branches scaled down with depth (GPT-2 style) keep the residual
  // stream's magnitude flat across layers.
  const float out_scale = 1.0f / std::sqrt(2.0f * float(config.n_layers));
  ck.tok_embedding = random_tensor({config.vocab_size, d}, 1.0f, rng, dtype);
  for (int l = 0; l < config.n_layers; ++l) {
    LayerTensors t;
    t.attn_norm = ones_like_norm(config.dim, rng, dtype);
    t.wq = random_tensor({q, d}, in_d, rng, dtype);
    t.wk = random_tensor({kv, d}, in_d, rng, dtype);
    t.wv = random_tensor({kv, d}, in_d, rng, dtype);
    t.wo = random_tensor({d, q}, out_scale / std::sqrt(float(q)), rng, dtype);
    t.ffn_norm = ones_like_norm(config.dim, rng, dtype);
    t.w_gate = random_tensor({h, d}, in_d, rng, dtype);
    t.w_up = random_tensor({h, d}, in_d, rng, dtype);
    t.w_down = random_tensor({d, h}, out_scale / std::sqrt(float(h)), rng, dtype);
    ck.layers.push_back(std::move(t));
  }
  ck.final_norm = ones_like_norm(config.dim, rng, dtype);
  ck.classifier = config.tied_classifier ? ck.tok_embedding
                                         : random_tensor({config.vocab_size, d}, in_d, rng, dtype);
  if (config.qkv_bias) {
    // Drawn last, from a stream of their own, so that a model with biases
    // has the same weights as the one without.
    Xoshiro256 brng(seed ^ 0xb1a5b1a5b1a5b1a5ull);
    for (LayerTensors& t : ck.layers) {
      t.bq = random_tensor({q}, 0.5f, brng, dtype);
      t.bk = random_tensor({kv}, 0.5f, brng, dtype);
      t.bv = random_tensor({kv}, 0.5f, brng, dtype);
    }
  }
  if (config.qk_norm) {
    Xoshiro256 nrng(seed ^ 0x9e3779b97f4a7c15ull);
    for (LayerTensors& t : ck.layers) {
      t.q_norm = ones_like_norm(config.head_dim, nrng, dtype);
      t.k_norm = ones_like_norm(config.head_dim, nrng, dtype);
    }
  }
  return ck;
}

}  // namespace troupe
