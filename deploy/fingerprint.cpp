#include "deploy/fingerprint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace troupe {

namespace {

// FNV-1a, 64 bits: deterministic on every platform, which std::hash is not.
class Fnv {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ull;
  }
  template <class T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

void tensor(Fnv& f, const Tensor& t) {
  for (int64_t d : t.shape()) f.value(d);
  f.value(int(t.dtype()));
  const size_t n = t.nbytes(), edge = std::min<size_t>(n, 4096);
  const auto* p = static_cast<const char*>(t.raw());
  if (p == nullptr || n == 0) return;
  f.bytes(p, edge);
  f.bytes(p + (n - edge), edge);
}

}  // namespace

std::string model_fingerprint(const Checkpoint& ck, DType weight_dtype) {
  Fnv f;
  const ModelConfig& c = ck.config;
  for (int v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size,
                c.max_seq_len, c.bos_id, int(c.rope), int(c.tied_classifier), int(c.qkv_bias),
                int(c.qk_norm)})
    f.value(v);
  f.value(c.rope_theta);
  f.value(int(c.rope_scaling.kind));
  for (float v :
       {c.rope_scaling.factor, c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor})
    f.value(v);
  f.value(c.rope_scaling.original_max_position);
  for (float v : c.rope_scaling.freq_factors) f.value(v);
  f.value(c.norm_eps);
  // Gemma's parts: two processes must compute the same model.
  for (float v : {float(c.activation), c.embed_scale, c.attn_scale, c.norm_offset,
                  float(c.post_norms), float(c.sliding_window), c.rope_theta_sliding})
    f.value(v);
  for (bool s : c.sliding_layers) f.value(int(s));
  for (int e : c.eos_ids) f.value(e);
  f.value(int(weight_dtype));
  f.value(int(ck.quant_products));
  tensor(f, ck.tok_embedding);
  for (const LayerTensors& l : ck.layers)
    for (const Tensor* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down,
          &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm})
      tensor(f, *t);
  tensor(f, ck.final_norm);
  tensor(f, ck.classifier);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(f.digest()));
  return out;
}

std::string model_identity(const Checkpoint& ck, DType weight_dtype) {
  const ModelConfig& c = ck.config;
  const std::string products =
      ck.quant_products == QuantProducts::Int8 ? " with int8 products" : "";
  return model_fingerprint(ck, weight_dtype) + " (" + dtype_name(weight_dtype) + " weights" +
         products + ", dim " + std::to_string(c.dim) + ", " + std::to_string(c.n_layers) +
         " layers, vocabulary " + std::to_string(c.vocab_size) + ", context " +
         std::to_string(c.max_seq_len) + ")";
}

}  // namespace troupe
