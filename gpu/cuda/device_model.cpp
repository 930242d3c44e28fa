#include "gpu/cuda/device_model.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "gpu/cuda/cuda_check.h"

namespace troupe::cu {

namespace {

// Copies row-major tensors, stacked in order, to `dst` in `to`, converting
// through f32 a slice of whole rows at a time when their dtype differs or
// they are a GGUF's quantized blocks (which never cross a row).
void upload_stacked(const std::vector<Tensor>& parts, DType to, char* dst) {
  std::vector<float> f32;
  std::vector<char> staged;
  for (const Tensor& t : parts) {
    if (t.dtype() == to && !t.is_blocks()) {
      check(cudaMemcpy(dst, t.raw(), t.nbytes(), cudaMemcpyHostToDevice), "upload weights");
      dst += t.nbytes();
      continue;
    }
    constexpr int64_t kSlice = int64_t(1) << 22;  // elements per conversion (at least a row)
    const int64_t rows = t.ndim() ? t.dim(0) : 0, row = rows ? t.numel() / rows : 0;
    const int64_t per = std::max<int64_t>(1, kSlice / std::max<int64_t>(row, 1));
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
      const int64_t r1 = std::min(rows, r0 + per);
      f32.resize(size_t((r1 - r0) * row));
      for (int64_t r = r0; r < r1; ++r) t.row_to_f32(r, f32.data() + (r - r0) * row);
      staged.resize(f32.size() * dtype_size(to));
      convert_from_f32(f32.data(), to, staged.data(), f32.size());
      check(cudaMemcpy(dst, staged.data(), staged.size(), cudaMemcpyHostToDevice),
            "upload weights");
      dst += staged.size();
    }
  }
}

}  // namespace

WeightPlan::WeightPlan(PoolPlan& plan, const ModelConfig& m, const ShardDims& d, DType dtype)
    : dtype_(dtype), dims_(d), head_dim_(m.head_dim) {
  if (m.qkv_bias || m.qk_norm || m.gemma_parts())
    throw std::invalid_argument(
        "the CUDA backend does not compute q/k/v projection biases (Qwen2), q/k norms (Qwen3) "
        "or Gemma's layers yet: run this model on CPU devices");
  const size_t e = dtype_size(dtype), f = sizeof(float);
  const size_t dim = size_t(m.dim), q = size_t(d.heads * m.head_dim);
  const size_t kv = size_t(d.kv_heads * m.head_dim), hidden = size_t(d.hidden);
  const size_t start = plan.total();
  for (int l = d.layer_begin; l < d.layer_end; ++l) {
    LayerOffsets o;
    o.wqkv = plan.add("weights", (q + 2 * kv) * dim * e);
    o.wo = plan.add("weights", dim * q * e);
    o.gate_up = plan.add("weights", 2 * hidden * dim * e);
    o.down = plan.add("weights", dim * hidden * e);
    o.attn_norm = plan.add("weights", dim * f);
    o.ffn_norm = plan.add("weights", dim * f);
    layers_.push_back(o);
  }
  if (d.last) {
    final_norm_ = plan.add("weights", dim * f);
    classifier_ = plan.add("weights", size_t(d.vocab) * dim * e);
  }
  const size_t before_embedding = plan.total();
  tied_ = m.tied_classifier && d.last && d.vocab == m.vocab_size;
  if (d.first)
    embedding_ = tied_ ? classifier_ : plan.add("weights", size_t(m.vocab_size) * dim * e);
  bytes_ = plan.total() - start;
  embedding_bytes_ = plan.total() - before_embedding;
}

DeviceWeights WeightPlan::upload(const Checkpoint& ck, char* pool) const {
  const ShardDims& d = dims_;
  const int64_t hd = head_dim_;
  const int64_t q0 = d.head_begin * hd, q1 = (d.head_begin + d.heads) * hd;
  const int64_t k0 = d.kv_head_begin * hd, k1 = (d.kv_head_begin + d.kv_heads) * hd;
  const int64_t h0 = d.hidden_begin, h1 = d.hidden_begin + d.hidden;
  DeviceWeights w;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerOffsets& o = layers_[l];
    const LayerTensors& t = ck.layers[size_t(d.layer_begin) + l];
    upload_stacked({t.wq.rows(q0, q1), t.wk.rows(k0, k1), t.wv.rows(k0, k1)}, dtype_,
                   pool + o.wqkv);
    upload_stacked({t.wo.cols(q0, q1)}, dtype_, pool + o.wo);
    upload_stacked({t.w_gate.rows(h0, h1), t.w_up.rows(h0, h1)}, dtype_, pool + o.gate_up);
    upload_stacked({t.w_down.cols(h0, h1)}, dtype_, pool + o.down);
    upload_stacked({t.attn_norm}, DType::F32, pool + o.attn_norm);
    upload_stacked({t.ffn_norm}, DType::F32, pool + o.ffn_norm);
    w.layers.push_back({pool + o.wqkv, pool + o.wo, pool + o.gate_up, pool + o.down,
                        reinterpret_cast<const float*>(pool + o.attn_norm),
                        reinterpret_cast<const float*>(pool + o.ffn_norm)});
  }
  if (d.last) {
    upload_stacked({ck.final_norm}, DType::F32, pool + final_norm_);
    upload_stacked({ck.classifier.rows(d.vocab_begin, d.vocab_begin + d.vocab)}, dtype_,
                   pool + classifier_);
    w.final_norm = reinterpret_cast<const float*>(pool + final_norm_);
    w.classifier = pool + classifier_;
  }
  if (d.first) {
    if (!tied_) upload_stacked({ck.tok_embedding}, dtype_, pool + embedding_);
    w.embedding = pool + embedding_;
  }
  w.bytes = bytes_;
  w.streamed_bytes = bytes_ - embedding_bytes_;
  return w;
}

}  // namespace troupe::cu
