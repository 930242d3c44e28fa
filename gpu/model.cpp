#include "gpu/model.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

std::vector<float> norm_weights(const Tensor& t) { return t.to_f32(); }

// Per-token work: inline for a handful of tokens, where waking the pool
// costs more than the work itself.
template <class Fn>
void for_each_token(ThreadPool& pool, int tokens, Fn&& fn) {
  if (tokens < 4 * pool.size()) {
    for (int t = 0; t < tokens; ++t) fn(t);
    return;
  }
  pool.parallel_for(tokens, [&](int t, int) { fn(t); });
}

}  // namespace

void Workspace::ensure(const ModelConfig& c, int tokens, int outputs, int threads) {
  auto grow = [](std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  const size_t T = size_t(tokens);
  grow(x, T * size_t(c.dim));
  grow(xb, T * size_t(c.dim));
  grow(tmp, T * size_t(c.dim));
  grow(qkv, T * size_t(c.q_dim() + 2 * c.kv_dim()));
  grow(att, T * size_t(c.q_dim()));
  grow(hb, T * size_t(2 * c.hidden_dim));
  grow(final_in, size_t(outputs) * size_t(c.dim));
  if (scores.size() < size_t(threads)) scores.resize(size_t(threads));
  for (auto& s : scores) grow(s, size_t(c.max_seq_len));
  if (pos.size() < T) {
    pos.resize(T);
    seq_of.resize(T);
  }
}

Model::Model(const Checkpoint& ckpt, DType weight_dtype)
    : config_(ckpt.config),
      weight_dtype_(weight_dtype),
      tokenizer_path_(ckpt.tokenizer_path),
      source_(ckpt.source),
      rope_(ckpt.config.max_seq_len, ckpt.config.head_dim, ckpt.config.rope_theta) {
  config_.validate(ckpt.source.string());
  layers_.reserve(ckpt.layers.size());
  for (const auto& l : ckpt.layers) {
    LayerWeights w;
    w.attn_norm = norm_weights(l.attn_norm);
    w.ffn_norm = norm_weights(l.ffn_norm);
    w.wqkv = PackedMatrix::pack({l.wq, l.wk, l.wv}, weight_dtype);
    w.wo = PackedMatrix::pack({l.wo}, weight_dtype);
    w.gate_up = PackedMatrix::pack({l.w_gate, l.w_up}, weight_dtype);
    w.down = PackedMatrix::pack({l.w_down}, weight_dtype);
    layers_.push_back(std::move(w));
  }
  final_norm_ = norm_weights(ckpt.final_norm);
  classifier_ = PackedMatrix::pack({ckpt.classifier}, weight_dtype);
  if (!config_.tied_classifier) {
    const auto& e = ckpt.tok_embedding;
    embedding_ = Tensor::zeros({e.dim(0), e.dim(1)}, weight_dtype);
    std::vector<float> row(size_t(e.dim(1)));
    for (int64_t r = 0; r < e.dim(0); ++r) {
      convert_to_f32(static_cast<const char*>(e.raw()) + size_t(r * e.dim(1)) * dtype_size(e.dtype()),
                     e.dtype(), row.data(), row.size());
      convert_from_f32(row.data(), weight_dtype,
                       static_cast<char*>(embedding_.raw_mut()) +
                           size_t(r * e.dim(1)) * dtype_size(weight_dtype),
                       row.size());
    }
  }
}

std::shared_ptr<const Model> Model::load(const std::filesystem::path& path, DType weight_dtype) {
  return std::make_shared<const Model>(load_checkpoint(path), weight_dtype);
}

size_t Model::weight_bytes() const {
  return weight_bytes_per_step() + embedding_.nbytes();
}

size_t Model::weight_bytes_per_step() const {
  size_t bytes = classifier_.bytes() + final_norm_.size() * sizeof(float);
  for (const auto& l : layers_)
    bytes += l.wqkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes() +
             (l.attn_norm.size() + l.ffn_norm.size()) * sizeof(float);
  return bytes;
}

void Model::embed(int token, float* out) const {
  if (embedding_.empty()) {
    classifier_.row_to_f32(token, out);
    return;
  }
  const size_t row = size_t(config_.dim);
  convert_to_f32(static_cast<const char*>(embedding_.raw()) +
                     size_t(token) * row * dtype_size(embedding_.dtype()),
                 embedding_.dtype(), out, row);
}

void Model::validate(std::span<const StepInput> inputs) const {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    if (!in.cache) throw std::invalid_argument("step input " + std::to_string(i) + " has no cache");
    if (in.tokens.empty())
      throw std::invalid_argument("step input " + std::to_string(i) + " has no tokens");
    for (int id : in.tokens)
      if (id < 0 || id >= config_.vocab_size)
        throw std::invalid_argument("token id " + std::to_string(id) +
                                    " is outside the vocabulary [0, " +
                                    std::to_string(config_.vocab_size) + ")");
    const size_t end = size_t(in.cache->length) + in.tokens.size();
    if (end > size_t(config_.max_seq_len))
      throw std::invalid_argument("sequence of " + std::to_string(end) +
                                  " tokens exceeds the context length " +
                                  std::to_string(config_.max_seq_len));
  }
}

void Model::attention(int layer, int tokens, std::span<const StepInput> inputs, KvCache& cache,
                      ThreadPool& pool, Workspace& ws) const {
  const int hd = config_.head_dim, nh = config_.n_heads;
  const int group = config_.n_heads / config_.n_kv_heads;
  const int qkv_cols = config_.q_dim() + 2 * config_.kv_dim();
  const float scale = 1.0f / std::sqrt(float(hd));
  auto task = [&](int task_id, int thread) {
    const int t = task_id / nh, h = task_id % nh;
    const SequenceCache& seq = *inputs[size_t(ws.seq_of[size_t(t)])].cache;
    const int pos = ws.pos[size_t(t)];
    const float* q = ws.qkv.data() + size_t(t) * size_t(qkv_cols) + size_t(h) * size_t(hd);
    const size_t kv_off = size_t(h / group) * size_t(hd);
    float* out = ws.att.data() + size_t(t) * size_t(config_.q_dim()) + size_t(h) * size_t(hd);
    kernels::attend_head(q, hd, scale, cache.paged(layer, seq), kv_off, pos + 1,
                         ws.scores[size_t(thread)].data(), out);
  };
  const int n_tasks = tokens * nh;
  if (pool.size() == 1 || n_tasks < 2) {
    for (int i = 0; i < n_tasks; ++i) task(i, 0);
  } else {
    pool.parallel_for(n_tasks, task);
  }
}

void Model::forward(std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool,
                    Workspace& ws, float* logits) const {
  validate(inputs);
  // Reserve every input's blocks before touching anything, so a full cache
  // leaves all sequences as they were.
  int need = 0;
  for (const auto& in : inputs)
    need += cache.blocks_needed(*in.cache, in.cache->length + int(in.tokens.size()));
  if (need > cache.allocator().free_count())
    throw KvCacheFull(need, cache.allocator().free_count(), cache.allocator().total());
  for (const auto& in : inputs) cache.reserve(*in.cache, in.cache->length + int(in.tokens.size()));

  const ModelConfig& c = config_;
  int T = 0, outputs = 0;
  for (const auto& in : inputs) {
    T += int(in.tokens.size());
    outputs += in.want_logits ? 1 : 0;
  }
  ws.ensure(c, T, outputs, pool.size());
  {
    int t = 0;
    for (size_t i = 0; i < inputs.size(); ++i)
      for (size_t j = 0; j < inputs[i].tokens.size(); ++j, ++t) {
        ws.pos[size_t(t)] = inputs[i].cache->length + int(j);
        ws.seq_of[size_t(t)] = int(i);
      }
  }
  auto token_at = [&](int t) {
    const auto& in = inputs[size_t(ws.seq_of[size_t(t)])];
    return in.tokens[size_t(ws.pos[size_t(t)] - in.cache->length)];
  };

  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hidden = c.hidden_dim;
  const int qkv_cols = qd + 2 * kvd;
  float* x = ws.x.data();
  float* xb = ws.xb.data();
  float* tmp = ws.tmp.data();
  for_each_token(pool, T, [&](int t) { embed(token_at(t), x + size_t(t) * size_t(dim)); });

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[size_t(l)];
    for_each_token(pool, T, [&](int t) {
      kernels::rmsnorm(x + size_t(t) * size_t(dim), w.attn_norm.data(), xb + size_t(t) * size_t(dim),
                       dim, c.norm_eps);
    });
    matmul(pool, xb, T, dim, w.wqkv, ws.qkv.data(), qkv_cols);
    for_each_token(pool, T, [&](int t) {
      float* row = ws.qkv.data() + size_t(t) * size_t(qkv_cols);
      const int pos = ws.pos[size_t(t)];
      kernels::rope(row, c.n_heads, c.head_dim, pos, rope_, c.rope);
      kernels::rope(row + qd, c.n_kv_heads, c.head_dim, pos, rope_, c.rope);
      const SequenceCache& seq = *inputs[size_t(ws.seq_of[size_t(t)])].cache;
      std::copy(row + qd, row + qd + kvd, cache.key(l, seq, pos));
      std::copy(row + qd + kvd, row + qd + 2 * kvd, cache.value(l, seq, pos));
    });
    attention(l, T, inputs, cache, pool, ws);
    matmul(pool, ws.att.data(), T, qd, w.wo, tmp, dim);
    for_each_token(pool, T, [&](int t) {
      float* xr = x + size_t(t) * size_t(dim);
      const float* d = tmp + size_t(t) * size_t(dim);
      for (int i = 0; i < dim; ++i) xr[i] += d[i];
      kernels::rmsnorm(xr, w.ffn_norm.data(), xb + size_t(t) * size_t(dim), dim, c.norm_eps);
    });
    matmul(pool, xb, T, dim, w.gate_up, ws.hb.data(), 2 * hidden);
    for_each_token(pool, T, [&](int t) {
      float* h = ws.hb.data() + size_t(t) * size_t(2 * hidden);
      kernels::silu_mul(h, h + hidden, h, hidden);
    });
    matmul(pool, ws.hb.data(), T, 2 * hidden, w.down, tmp, dim);
    for_each_token(pool, T, [&](int t) {
      float* xr = x + size_t(t) * size_t(dim);
      const float* d = tmp + size_t(t) * size_t(dim);
      for (int i = 0; i < dim; ++i) xr[i] += d[i];
    });
  }

  // Classifier only for the last token of inputs that want logits.
  std::vector<int> out_rows;
  out_rows.reserve(size_t(outputs));
  {
    int t = 0, o = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      t += int(inputs[i].tokens.size());
      if (!inputs[i].want_logits) continue;
      kernels::rmsnorm(x + size_t(t - 1) * size_t(dim), final_norm_.data(),
                       ws.final_in.data() + size_t(o) * size_t(dim), dim, c.norm_eps);
      out_rows.push_back(int(i));
      ++o;
    }
  }
  for (auto& in : inputs) in.cache->length += int(in.tokens.size());
  if (outputs == 0) return;
  // Rows are written compactly, then moved to each input's own row.
  const size_t V = size_t(c.vocab_size);
  if (outputs == int(inputs.size())) {
    matmul(pool, ws.final_in.data(), outputs, dim, classifier_, logits, int(V));
    return;
  }
  std::vector<float> compact(size_t(outputs) * V);
  matmul(pool, ws.final_in.data(), outputs, dim, classifier_, compact.data(), int(V));
  for (int o = 0; o < outputs; ++o)
    std::copy(compact.begin() + long(size_t(o) * V), compact.begin() + long(size_t(o + 1) * V),
              logits + size_t(out_rows[size_t(o)]) * V);
}

}  // namespace troupe
