#pragma once
// A decoder layer's tensors as one checkpoint format names them, and the
// one reading of them that every loader shares: each tensor checked against
// the shape the config gives it ([out, in] for matrices).
#include <string>

#include "gpu/checkpoint.h"

namespace troupe {

struct LayerNames {
  std::string attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  std::string bq, bk, bv;      // read when config.qkv_bias
  std::string q_norm, k_norm;  // read when config.qk_norm
  // Phi-3's fused projections, read instead of wq, wk, wv (q, k and v rows
  // stacked) and w_gate, w_up (gate rows, then up) where named.
  std::string wqkv, w_gate_up;
  std::string post_attn_norm, post_ffn_norm;  // read when config.post_norms
};

// `get(name, shape)` returns the named tensor after checking its shape.
template <class Get>
LayerTensors read_layer(Get&& get, const ModelConfig& c, const LayerNames& n) {
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim;
  LayerTensors l;
  l.attn_norm = get(n.attn_norm, {dim});
  if (!n.wqkv.empty()) {
    const Tensor qkv = get(n.wqkv, {q + 2 * kv, dim});
    l.wq = qkv.rows(0, q);
    l.wk = qkv.rows(q, q + kv);
    l.wv = qkv.rows(q + kv, q + 2 * kv);
  } else {
    l.wq = get(n.wq, {q, dim});
    l.wk = get(n.wk, {kv, dim});
    l.wv = get(n.wv, {kv, dim});
  }
  l.wo = get(n.wo, {dim, q});
  l.ffn_norm = get(n.ffn_norm, {dim});
  if (!n.w_gate_up.empty()) {
    const Tensor gate_up = get(n.w_gate_up, {2 * hidden, dim});
    l.w_gate = gate_up.rows(0, hidden);
    l.w_up = gate_up.rows(hidden, 2 * hidden);
  } else {
    l.w_gate = get(n.w_gate, {hidden, dim});
    l.w_up = get(n.w_up, {hidden, dim});
  }
  l.w_down = get(n.w_down, {dim, hidden});
  if (c.qkv_bias) {
    l.bq = get(n.bq, {q});
    l.bk = get(n.bk, {kv});
    l.bv = get(n.bv, {kv});
  }
  if (c.qk_norm) {
    l.q_norm = get(n.q_norm, {c.head_dim});
    l.k_norm = get(n.k_norm, {c.head_dim});
  }
  if (c.post_norms) {
    l.post_attn_norm = get(n.post_attn_norm, {dim});
    l.post_ffn_norm = get(n.post_ffn_norm, {dim});
  }
  return l;
}

}  // namespace troupe
