#pragma once
// What a loaded checkpoint must keep, for the checkpoint targets: the shapes
// the model relies on, every byte of every tensor readable, and the model
// built from it (packing reads every weight through the shapes).
#include <string>

#include "fuzz_support.h"
#include "gpu/checkpoint.h"
#include "gpu/model.h"

namespace troupe::fuzz {

inline void check_shape(const Tensor& t, std::vector<int64_t> want, const std::string& name) {
  if (t.empty() || t.shape() != want)
    violated("loaded tensor " + name + " has shape " + t.shape_str() + ", the config says " +
             Tensor::view(nullptr, want, DType::F32).shape_str());
  // Reads every element: a view past its file's mapping faults here.
  volatile float sink = 0;
  for (float v : t.to_f32()) sink = sink + v;
}

inline void check_checkpoint(const Checkpoint& ck) {
  const ModelConfig& c = ck.config;
  try {
    c.validate("loaded checkpoint");
  } catch (const std::invalid_argument& e) {
    violated(std::string("a loaded checkpoint's config does not validate: ") + e.what());
  }
  if (ck.layers.size() != size_t(c.n_layers)) violated("layer count differs from the config");
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hid = c.hidden_dim;
  check_shape(ck.tok_embedding, {c.vocab_size, dim}, "tok_embedding");
  for (const LayerTensors& l : ck.layers) {
    check_shape(l.attn_norm, {dim}, "attn_norm");
    check_shape(l.wq, {q, dim}, "wq");
    check_shape(l.wk, {kv, dim}, "wk");
    check_shape(l.wv, {kv, dim}, "wv");
    check_shape(l.wo, {dim, q}, "wo");
    check_shape(l.ffn_norm, {dim}, "ffn_norm");
    check_shape(l.w_gate, {hid, dim}, "w_gate");
    check_shape(l.w_up, {hid, dim}, "w_up");
    check_shape(l.w_down, {dim, hid}, "w_down");
  }
  check_shape(ck.final_norm, {dim}, "final_norm");
  check_shape(ck.classifier, {c.vocab_size, dim}, "classifier");
  // The model packs every weight; only for the small checkpoints a fuzzer
  // writes (the RoPE table alone grows with max_seq_len).
  if (c.max_seq_len <= 4096) (void)Model(ck, DType::F32);
}

}  // namespace troupe::fuzz
