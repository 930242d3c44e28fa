#pragma once
// Element-wise and per-row kernels of the decoder. Each works on one token's
// row, in a fixed summation order, so a token's result never depends on
// which other tokens share the step.
#include <cstddef>
#include <vector>

#include "gpu/cpu/attention_types.h"
#include "gpu/model_config.h"

namespace troupe::kernels {

// sum_i a[i] * b[i], 8 lanes then a fixed reduction tree.
float dot(const float* a, const float* b, int n);
// y += alpha * x
void axpy(float alpha, const float* x, float* y, int n);

// out = x / sqrt(mean(x^2) + eps) * w   (out may alias x)
void rmsnorm(const float* x, const float* w, float* out, int n, float eps);

// e^x to about 1 ulp, the same value the vector kernels compute.
float exp_approx(float x);

// Softmax in place over n values.
void softmax(float* x, int n);

// out[i] = silu(gate[i]) * up[i]   (out may alias gate)
void silu_mul(const float* gate, const float* up, float* out, int n);
// out[i] = gelu(gate[i]) * up[i], GELU's tanh approximation (out may alias gate)
void gelu_tanh_mul(const float* gate, const float* up, float* out, int n);

// One query head (head_dim values at q) attends to positions [0, n) of the
// kv head at head_off: out = softmax(q.k * scale) . v. `scores` needs n
// floats. Accumulates in registers, in position order per element.
void attend_head(const float* q, int head_dim, float scale, const PagedKv& kv, size_t head_off,
                 int n, float* scores, float* out);

// The same for every query of a tile at once, sharing each key and value
// load; each query's output is bit-identical to attend_head's. `scratch`
// needs tile_scratch_floats(head_dim) floats.
void attend_tile(const HeadTile& tile, int head_dim, float scale, const PagedKv& kv,
                 size_t head_off, float* scratch);

// Rotary embedding tables: cos/sin of pos * theta^(-2i/head_dim) for
// i < head_dim/2, computed in f32 as llama2.c's run.c does.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int max_pos, int head_dim, float theta, const RopeScaling& scaling = {});
  const float* cos(int pos) const { return cos_.data() + size_t(pos) * size_t(half_); }
  const float* sin(int pos) const { return sin_.data() + size_t(pos) * size_t(half_); }
  int half() const { return half_; }

 private:
  int half_ = 0;
  std::vector<float> cos_, sin_;
};

// Rotates n_heads heads of head_dim each, stored contiguously at v.
void rope(float* v, int n_heads, int head_dim, int pos, const RopeTable& table, RopeLayout layout);

}  // namespace troupe::kernels
