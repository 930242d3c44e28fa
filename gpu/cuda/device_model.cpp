#include "gpu/cuda/device_model.h"

#include <algorithm>
#include <cstring>

#include "gpu/cuda/cuda_check.h"

namespace troupe::cu {

namespace {

// Copies row-major tensors, stacked in order, to `dst` in `to`, converting
// through f32 a slice at a time when their dtype differs.
void upload_stacked(const std::vector<Tensor>& parts, DType to, char* dst) {
  std::vector<float> f32;
  std::vector<char> staged;
  for (const Tensor& t : parts) {
    if (t.dtype() == to) {
      check(cudaMemcpy(dst, t.raw(), t.nbytes(), cudaMemcpyHostToDevice), "upload weights");
      dst += t.nbytes();
      continue;
    }
    constexpr size_t kSlice = size_t(1) << 22;  // elements per conversion
    const size_t n = size_t(t.numel());
    const char* src = static_cast<const char*>(t.raw());
    for (size_t at = 0; at < n; at += kSlice) {
      const size_t len = std::min(kSlice, n - at);
      f32.resize(len);
      staged.resize(len * dtype_size(to));
      convert_to_f32(src + at * dtype_size(t.dtype()), t.dtype(), f32.data(), len);
      convert_from_f32(f32.data(), to, staged.data(), len);
      check(cudaMemcpy(dst, staged.data(), staged.size(), cudaMemcpyHostToDevice),
            "upload weights");
      dst += staged.size();
    }
  }
}

}  // namespace

WeightPlan::WeightPlan(PoolPlan& plan, const ModelConfig& m, DType dtype)
    : dtype_(dtype), tied_(m.tied_classifier) {
  const size_t e = dtype_size(dtype), f = sizeof(float);
  const size_t dim = size_t(m.dim), q = size_t(m.q_dim()), kv = size_t(m.kv_dim());
  const size_t hidden = size_t(m.hidden_dim), vocab = size_t(m.vocab_size);
  const size_t start = plan.total();
  for (int l = 0; l < m.n_layers; ++l) {
    LayerOffsets o;
    o.wqkv = plan.add("weights", (q + 2 * kv) * dim * e);
    o.wo = plan.add("weights", dim * q * e);
    o.gate_up = plan.add("weights", 2 * hidden * dim * e);
    o.down = plan.add("weights", dim * hidden * e);
    o.attn_norm = plan.add("weights", dim * f);
    o.ffn_norm = plan.add("weights", dim * f);
    layers_.push_back(o);
  }
  final_norm_ = plan.add("weights", dim * f);
  classifier_ = plan.add("weights", vocab * dim * e);
  const size_t before_embedding = plan.total();
  embedding_ = tied_ ? classifier_ : plan.add("weights", vocab * dim * e);
  bytes_ = plan.total() - start;
  embedding_bytes_ = plan.total() - before_embedding;
}

DeviceWeights WeightPlan::upload(const Checkpoint& ck, char* pool) const {
  DeviceWeights w;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerOffsets& o = layers_[l];
    const LayerTensors& t = ck.layers[l];
    upload_stacked({t.wq, t.wk, t.wv}, dtype_, pool + o.wqkv);
    upload_stacked({t.wo}, dtype_, pool + o.wo);
    upload_stacked({t.w_gate, t.w_up}, dtype_, pool + o.gate_up);
    upload_stacked({t.w_down}, dtype_, pool + o.down);
    upload_stacked({t.attn_norm}, DType::F32, pool + o.attn_norm);
    upload_stacked({t.ffn_norm}, DType::F32, pool + o.ffn_norm);
    w.layers.push_back({pool + o.wqkv, pool + o.wo, pool + o.gate_up, pool + o.down,
                        reinterpret_cast<const float*>(pool + o.attn_norm),
                        reinterpret_cast<const float*>(pool + o.ffn_norm)});
  }
  upload_stacked({ck.final_norm}, DType::F32, pool + final_norm_);
  upload_stacked({ck.classifier}, dtype_, pool + classifier_);
  if (!tied_) upload_stacked({ck.tok_embedding}, dtype_, pool + embedding_);
  w.final_norm = reinterpret_cast<const float*>(pool + final_norm_);
  w.classifier = pool + classifier_;
  w.embedding = pool + embedding_;
  w.bytes = bytes_;
  w.streamed_bytes = bytes_ - embedding_bytes_;
  return w;
}

}  // namespace troupe::cu
