#include "gpu/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

#include "gpu/comm/communicator.h"

namespace troupe {

namespace {

// An RMS norm's scale per element: the stored weight, plus the model's
// offset (Gemma's Hugging Face checkpoints store it less 1).
std::vector<float> norm_weights(const Tensor& t, float offset) {
  std::vector<float> w = t.to_f32();
  if (offset != 0)
    for (float& v : w) v += offset;
  return w;
}

// Per-token work: inline for a handful of tokens, where waking the pool
// costs more than the work itself. Otherwise in runs of consecutive tokens,
// about four a thread: a token's row is a few hundred nanoseconds of work,
// about what claiming a task costs when the threads contend for the claim.
template <class Fn>
void for_each_token(ThreadPool& pool, int tokens, Fn&& fn) {
  if (tokens < 4 * pool.size()) {
    for (int t = 0; t < tokens; ++t) fn(t);
    return;
  }
  const int runs = 4 * pool.size(), run = (tokens + runs - 1) / runs;
  pool.parallel_for((tokens + run - 1) / run, [&](int r, int) {
    const int end = std::min(tokens, (r + 1) * run);
    for (int t = r * run; t < end; ++t) fn(t);
  });
}

}  // namespace

namespace {

// The FFN's columns are cut into pieces, one per attention head (one per
// column when there are fewer columns): the down projection sums one chain
// per piece in order, and tensor shards hold whole pieces, as they hold
// whole heads of the output projection. Then the shards' partial products,
// added piece by piece, are the one-device product bit for bit.
int ffn_pieces(const ModelConfig& c) {
  return std::min(c.n_heads, c.hidden_dim);
}

// Where FFN piece p begins (p == ffn_pieces: the width). Boundaries fall on
// multiples of 32 columns when the pieces are wide enough, else of 16, so
// that every tensor shard's slice keeps aligned rows (1024 + 1024 of 2048
// columns over 12 pieces, not 1026 + 1022) and a quantized down projection
// keeps its groups of 32 whole (packed_matrix.h; TinyLlama's 5632 columns
// over 32 pieces: 160 or 192 each, not 176).
int ffn_piece_begin(const ModelConfig& c, int p) {
  const int pieces = ffn_pieces(c);
  if (p >= pieces) return c.hidden_dim;
  const int granule = c.hidden_dim >= 64 * pieces ? 32 : c.hidden_dim >= 32 * pieces ? 16 : 1;
  return int(int64_t(p) * c.hidden_dim / pieces / granule * granule);
}

// Boundaries of pieces [p0, p1) relative to the first, from begin(p).
template <class Begin>
std::vector<int> piece_bounds(int p0, int p1, Begin&& begin) {
  std::vector<int> bounds;
  for (int p = p0; p <= p1; ++p) bounds.push_back(begin(p) - begin(p0));
  return bounds;
}

bool tensor_fits(const ModelConfig& c, int t) {
  const bool kv_ok = c.n_kv_heads % t == 0 || t % c.n_kv_heads == 0;
  return c.n_heads % t == 0 && kv_ok && ffn_pieces(c) % t == 0 && t <= c.vocab_size;
}

}  // namespace

void check_layout_fits(const ModelConfig& c, int pipeline, int t) {
  if (c.n_layers < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.vocab_size < 1 || c.hidden_dim < 1 ||
      c.n_heads % c.n_kv_heads != 0)
    throw std::invalid_argument(
        "impossible model dimensions (layers " + std::to_string(c.n_layers) + ", heads " +
        std::to_string(c.n_heads) + ", kv heads " + std::to_string(c.n_kv_heads) + ", vocab " +
        std::to_string(c.vocab_size) + ", hidden " + std::to_string(c.hidden_dim) + ")");
  using Axis = LayoutMisfit::Axis;
  if (t < 1) throw LayoutMisfit(Axis::Tensor, "parallel.tensor must be at least 1");
  if (pipeline < 1) throw LayoutMisfit(Axis::Pipeline, "parallel.pipeline must be at least 1");
  if (!tensor_fits(c, t)) {
    std::string fits;
    for (int d = 1; d <= c.n_heads; ++d)
      if (tensor_fits(c, d)) fits += (fits.empty() ? "" : ", ") + std::to_string(d);
    const std::string tensor = "parallel.tensor = " + std::to_string(t);
    std::string why;
    if (c.n_heads % t != 0)
      why =
          tensor + " does not divide the model's " + std::to_string(c.n_heads) + " attention heads";
    else if (c.n_kv_heads % t != 0 && t % c.n_kv_heads != 0)
      why = tensor + " can neither split nor evenly replicate the model's " +
            std::to_string(c.n_kv_heads) + " KV heads";
    else if (ffn_pieces(c) % t != 0)
      why = tensor + " does not divide the model's FFN width of " + std::to_string(c.hidden_dim) +
            " (fewer columns than heads)";
    else
      why = tensor + " is more than the model's vocabulary of " + std::to_string(c.vocab_size);
    throw LayoutMisfit(Axis::Tensor, why + "; tensor degrees that fit this model: " + fits);
  }
  if (pipeline > c.n_layers)
    throw LayoutMisfit(Axis::Pipeline, "parallel.pipeline = " + std::to_string(pipeline) +
                                           " is more than the model's " +
                                           std::to_string(c.n_layers) +
                                           " layers: each stage needs at least one");
}

ShardDims shard_dims(const ModelConfig& c, const ShardSpec& spec) {
  ShardDims d;
  const int T = spec.tp_size;
  if (T < 1 || spec.tp_rank < 0 || spec.tp_rank >= T)
    throw std::invalid_argument("tensor-parallel rank " + std::to_string(spec.tp_rank) + " of " +
                                std::to_string(T) + " is out of range");
  check_layout_fits(c, 1, T);
  d.layer_begin = spec.layer_begin;
  d.layer_end = spec.layer_end < 0 ? c.n_layers : spec.layer_end;
  if (d.layer_begin < 0 || d.layer_end > c.n_layers || d.layer_begin >= d.layer_end)
    throw std::invalid_argument("layer range [" + std::to_string(d.layer_begin) + ", " +
                                std::to_string(d.layer_end) + ") does not fit the model's " +
                                std::to_string(c.n_layers) + " layers");
  d.first = d.layer_begin == 0;
  d.last = d.layer_end == c.n_layers;
  d.heads = c.n_heads / T;
  d.head_begin = spec.tp_rank * d.heads;
  if (c.n_kv_heads >= T) {
    d.kv_heads = c.n_kv_heads / T;
    d.kv_head_begin = spec.tp_rank * d.kv_heads;
  } else {
    // Fewer kv heads than shards: each shard keeps the one its queries use
    // (replicated, as vLLM does).
    d.kv_heads = 1;
    d.kv_head_begin = d.head_begin / (c.n_heads / c.n_kv_heads);
  }
  const int per_shard = ffn_pieces(c) / T;
  d.hidden_begin = ffn_piece_begin(c, spec.tp_rank * per_shard);
  d.hidden = ffn_piece_begin(c, (spec.tp_rank + 1) * per_shard) - d.hidden_begin;
  d.vocab_stride = (c.vocab_size + T - 1) / T;
  d.vocab_begin = std::min(c.vocab_size, spec.tp_rank * d.vocab_stride);
  d.vocab = std::min(c.vocab_size, d.vocab_begin + d.vocab_stride) - d.vocab_begin;
  return d;
}

void Workspace::ensure(const ModelConfig& c, const ShardDims& d, int tokens, int outputs,
                       int threads) {
  auto grow = [](std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  const size_t T = size_t(tokens);
  const size_t q = size_t(d.heads * c.head_dim), kv = size_t(d.kv_heads * c.head_dim);
  grow(x, T * size_t(c.dim));
  grow(xb, T * size_t(c.dim));
  grow(tmp, T * size_t(c.dim));
  grow(qkv, T * (q + 2 * kv));
  grow(att, T * q);
  grow(hb, T * size_t(2 * d.hidden));
  grow(final_in, size_t(outputs) * size_t(c.dim));
  grow(logits, size_t(outputs) * size_t(d.vocab_stride));
  if (scores.size() < size_t(threads)) scores.resize(size_t(threads));
  for (auto& s : scores)
    grow(s, size_t(kernels::kTileQueries) * size_t(c.max_seq_len) +
                kernels::tile_scratch_floats(c.head_dim));
  if (pos.size() < T) {
    pos.resize(T);
    seq_of.resize(T);
  }
}

Model::Model(const Checkpoint& ckpt, DType weight_dtype, ShardSpec shard)
    : config_(ckpt.config),
      weight_dtype_(weight_dtype),
      tokenizer_path_(ckpt.tokenizer_path),
      source_(ckpt.source),
      rope_(ckpt.config.max_seq_len, ckpt.config.head_dim, ckpt.config.rope_theta,
            ckpt.config.rope_scaling) {
  config_.validate(ckpt.source.string());
  if (!config_.sliding_layers.empty())
    rope_sliding_ =
        kernels::RopeTable(config_.max_seq_len, config_.head_dim, config_.rope_theta_sliding);
  dims_ = shard_dims(config_, shard);
  const ShardDims& d = dims_;
  const int64_t hd = config_.head_dim;
  const int64_t q0 = d.head_begin * hd, q1 = (d.head_begin + d.heads) * hd;
  const int64_t k0 = d.kv_head_begin * hd, k1 = (d.kv_head_begin + d.kv_heads) * hd;
  const int64_t h0 = d.hidden_begin, h1 = d.hidden_begin + d.hidden;
  layers_.reserve(size_t(d.layers()));
  for (int l = d.layer_begin; l < d.layer_end; ++l) {
    const LayerTensors& t = ckpt.layers[size_t(l)];
    LayerWeights w;
    w.attn_norm = norm_weights(t.attn_norm, config_.norm_offset);
    w.ffn_norm = norm_weights(t.ffn_norm, config_.norm_offset);
    // Columns of the fused projections (by head, by FFN column); rows of the
    // output projections, whose partial sums the group all-reduces.
    w.wqkv = PackedMatrix::pack({t.wq.rows(q0, q1), t.wk.rows(k0, k1), t.wv.rows(k0, k1)},
                                weight_dtype, ckpt.quant_products);
    w.wo = PackedMatrix::pack({t.wo.cols(q0, q1)}, weight_dtype, ckpt.quant_products);
    w.wo.set_pieces(piece_bounds(0, d.heads, [&](int h) { return h * int(hd); }));
    if (config_.qkv_bias)
      for (const auto& [b, lo, hi] :
           {std::tuple{&t.bq, q0, q1}, {&t.bk, k0, k1}, {&t.bv, k0, k1}}) {
        const std::vector<float> part = b->rows(lo, hi).to_f32();
        w.qkv_bias.insert(w.qkv_bias.end(), part.begin(), part.end());
      }
    if (config_.qk_norm) {
      w.q_norm = norm_weights(t.q_norm, config_.norm_offset);
      w.k_norm = norm_weights(t.k_norm, config_.norm_offset);
    }
    if (config_.post_norms) {
      w.post_attn_norm = norm_weights(t.post_attn_norm, config_.norm_offset);
      w.post_ffn_norm = norm_weights(t.post_ffn_norm, config_.norm_offset);
    }
    w.gate_up = PackedMatrix::pack({t.w_gate.rows(h0, h1), t.w_up.rows(h0, h1)}, weight_dtype,
                                   ckpt.quant_products);
    w.down = PackedMatrix::pack({t.w_down.cols(h0, h1)}, weight_dtype, ckpt.quant_products);
    const int per_shard = ffn_pieces(config_) / shard.tp_size;
    w.down.set_pieces(piece_bounds(shard.tp_rank * per_shard, (shard.tp_rank + 1) * per_shard,
                                   [&](int p) { return ffn_piece_begin(config_, p); }));
    layers_.push_back(std::move(w));
  }
  if (d.last) {
    final_norm_ = norm_weights(ckpt.final_norm, config_.norm_offset);
    classifier_ = PackedMatrix::pack({ckpt.classifier.rows(d.vocab_begin, d.vocab_begin + d.vocab)},
                                     weight_dtype, ckpt.quant_products);
  }
  if (d.first && !(config_.tied_classifier && d.last)) {
    const Tensor e = ckpt.tok_embedding.rows(d.vocab_begin, d.vocab_begin + d.vocab);
    if (e.is_blocks()) {
      embedding_ = e;  // rows are dequantized as they are looked up
    } else {
      embedding_ = Tensor::zeros({e.dim(0), e.dim(1)}, weight_dtype);
      std::vector<float> row(static_cast<size_t>(e.dim(1)));
      for (int64_t r = 0; r < e.dim(0); ++r) {
        e.row_to_f32(r, row.data());
        convert_from_f32(row.data(), weight_dtype,
                         static_cast<char*>(embedding_.raw_mut()) +
                             size_t(r * e.dim(1)) * dtype_size(weight_dtype),
                         row.size());
      }
    }
  }
}

KvCache Model::make_cache(int block_tokens, int blocks, DType kv_dtype) const {
  return KvCache(dims_.layers(), dims_.kv_heads, config_.head_dim, block_tokens, blocks, kv_dtype);
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
  const int local = token - dims_.vocab_begin;
  const size_t row = size_t(config_.dim);
  if (local < 0 || local >= dims_.vocab) {
    std::fill(out, out + row, 0.0f);  // another shard's row; the all-reduce adds it
    return;
  }
  if (embedding_.empty()) {
    classifier_.row_to_f32(local, out);
  } else {
    embedding_.row_to_f32(local, out);
  }
  if (config_.embed_scale != 1)
    for (size_t i = 0; i < row; ++i) out[i] *= config_.embed_scale;
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

void Model::plan_attention(std::span<const StepInput> inputs, Workspace& ws) const {
  const int group = config_.n_heads / config_.n_kv_heads;
  ws.tiles.clear();
  ws.tile_queries.clear();
  int t0 = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int t1 = t0 + int(inputs[i].tokens.size());
    for (int kv = 0; kv < dims_.kv_heads; ++kv) {
      // Later tokens see more positions: their tiles come first, so that the
      // pool's threads, which claim tiles in order, finish together.
      AttentionTile tile{int(i), kv, int(ws.tile_queries.size()), 0};
      for (int t = t1 - 1; t >= t0; --t)
        for (int h = 0; h < dims_.heads; ++h) {
          if ((dims_.head_begin + h) / group - dims_.kv_head_begin != kv) continue;
          if (tile.count == kernels::kTileQueries) {
            ws.tiles.push_back(tile);
            tile.first += tile.count;
            tile.count = 0;
          }
          ws.tile_queries.emplace_back(t, h);
          ++tile.count;
        }
      if (tile.count > 0) ws.tiles.push_back(tile);
    }
    t0 = t1;
  }
}

void Model::attention(int layer, std::span<const StepInput> inputs, KvCache& cache,
                      ThreadPool& pool, Workspace& ws) const {
  const int hd = config_.head_dim;
  const int qd = dims_.heads * hd;
  const int qkv_cols = qd + 2 * dims_.kv_heads * hd;
  const float scale = config_.attn_scale > 0 ? config_.attn_scale : 1.0f / std::sqrt(float(hd));
  const size_t rows = size_t(config_.max_seq_len);
  const int window = config_.is_sliding(dims_.layer_begin + layer) ? config_.sliding_window : 0;
  auto task = [&](int tile_id, int thread) {
    const AttentionTile& at = ws.tiles[size_t(tile_id)];
    float* scratch = ws.scores[size_t(thread)].data();
    kernels::HeadTile tile;
    tile.count = at.count;
    for (int i = 0; i < at.count; ++i) {
      const auto [t, h] = ws.tile_queries[size_t(at.first + i)];
      tile.q[i] = ws.qkv.data() + size_t(t) * size_t(qkv_cols) + size_t(h) * size_t(hd);
      tile.n[i] = ws.pos[size_t(t)] + 1;
      tile.from[i] = window > 0 ? std::max(0, tile.n[i] - window) : 0;
      tile.scores[i] = scratch + size_t(i) * rows;
      tile.out[i] = ws.att.data() + size_t(t) * size_t(qd) + size_t(h) * size_t(hd);
    }
    const SequenceCache& seq = *inputs[size_t(at.seq)].cache;
    kernels::attend_tile(tile, hd, scale, cache.paged(layer, seq), cache.head_offset(at.kv_head),
                         scratch + size_t(kernels::kTileQueries) * rows);
  };
  const int n_tasks = int(ws.tiles.size());
  if (pool.size() == 1 || n_tasks < 2) {
    for (int i = 0; i < n_tasks; ++i) task(i, 0);
  } else {
    pool.parallel_for(n_tasks, task);
  }
}

void Model::forward(std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool,
                    Workspace& ws, float* logits, float* row_logits) const {
  if (!dims_.first || !dims_.last || dims_.vocab != config_.vocab_size)
    throw std::logic_error("Model::forward needs the whole model; use forward_shard");
  ShardIo io;
  io.logits = logits;
  io.row_logits = row_logits;
  forward_shard(inputs, cache, pool, ws, io);
}

void Model::forward_shard(std::span<const StepInput> inputs, KvCache& cache, ThreadPool& pool,
                          Workspace& ws, const ShardIo& io) const {
  // Every input is checked before anything is touched, so a bad step leaves
  // the cache and the sequences as they were.
  validate(inputs);
  for (const auto& in : inputs)
    cache.check_covers(*in.cache, in.cache->length + int(in.tokens.size()));

  const ModelConfig& c = config_;
  const ShardDims& d = dims_;
  int T = 0, outputs = 0;
  for (const auto& in : inputs) {
    T += int(in.tokens.size());
    outputs += in.want_logits ? 1 : 0;
  }
  ws.ensure(c, d, T, outputs, pool.size());
  {
    int t = 0;
    for (size_t i = 0; i < inputs.size(); ++i)
      for (size_t j = 0; j < inputs[i].tokens.size(); ++j, ++t) {
        ws.pos[size_t(t)] = inputs[i].cache->length + int(j);
        ws.seq_of[size_t(t)] = int(i);
      }
  }
  plan_attention(inputs, ws);
  auto token_at = [&](int t) {
    const auto& in = inputs[size_t(ws.seq_of[size_t(t)])];
    return in.tokens[size_t(ws.pos[size_t(t)] - in.cache->length)];
  };
  // Embedding slices (one rank's row, zeros elsewhere) add up across the
  // group to the row itself.
  auto reduce = [&](float* data, size_t n) {
    if (io.tp) io.tp->all_reduce_sum(data, n);
  };
  // The output and down projections, whose inputs (heads, FFN columns) the
  // group splits: their pieces are summed in the one-device order. Rank 0
  // sums its own pieces in the product; the others keep theirs apart to add
  // onto the sum of the ranks before them.
  auto row_parallel = [&](const PackedMatrix& m, const float* in, int ldx, float* out) {
    const size_t n = size_t(T) * size_t(c.dim);
    if (!io.tp || io.tp->rank() == 0) {
      matmul(pool, in, T, ldx, m, out, c.dim);
      if (io.tp) io.tp->sum_in_piece_order(out, nullptr, 0, n);
      return;
    }
    if (ws.pieces.size() < size_t(m.pieces()) * n) ws.pieces.resize(size_t(m.pieces()) * n);
    matmul(pool, in, T, ldx, m, ws.pieces.data(), c.dim, n);
    io.tp->sum_in_piece_order(out, ws.pieces.data(), m.pieces(), n);
  };

  const int dim = c.dim, hd = c.head_dim;
  const int qd = d.heads * hd, kvd = d.kv_heads * hd, hidden = d.hidden;
  const int qkv_cols = qd + 2 * kvd;
  float* x = ws.x.data();
  float* xb = ws.xb.data();
  float* tmp = ws.tmp.data();
  auto add_row = [dim](float* xr, const float* delta) {
    for (int i = 0; i < dim; ++i) xr[i] += delta[i];
  };
  if (d.first) {
    for_each_token(pool, T, [&](int t) { embed(token_at(t), x + size_t(t) * size_t(dim)); });
    reduce(x, size_t(T) * size_t(dim));
  } else {
    std::copy(io.x_in, io.x_in + size_t(T) * size_t(dim), x);
  }

  using Clock = std::chrono::steady_clock;
  auto lap = Clock::now();
  auto time_layer = [&](int li) {
    if (!io.layer_seconds) return;
    const auto now = Clock::now();
    io.layer_seconds[li] += std::chrono::duration<double>(now - lap).count();
    lap = now;
  };
  for (int li = 0; li < d.layers(); ++li) {
    const LayerWeights& w = layers_[size_t(li)];
    const kernels::RopeTable& rope = c.is_sliding(d.layer_begin + li) ? rope_sliding_ : rope_;
    // The layer before's down projection joins the residual here, in the
    // same pass as this layer's norm.
    for_each_token(pool, T, [&](int t) {
      float* xr = x + size_t(t) * size_t(dim);
      if (li > 0) add_row(xr, tmp + size_t(t) * size_t(dim));
      kernels::rmsnorm(xr, w.attn_norm.data(), xb + size_t(t) * size_t(dim), dim, c.norm_eps);
    });
    matmul(pool, xb, T, dim, w.wqkv, ws.qkv.data(), qkv_cols);
    for_each_token(pool, T, [&](int t) {
      float* row = ws.qkv.data() + size_t(t) * size_t(qkv_cols);
      if (!w.qkv_bias.empty())
        for (int i = 0; i < qkv_cols; ++i) row[i] += w.qkv_bias[size_t(i)];
      if (!w.q_norm.empty()) {
        for (int h = 0; h < d.heads; ++h)
          kernels::rmsnorm(row + h * hd, w.q_norm.data(), row + h * hd, hd, c.norm_eps);
        for (int h = 0; h < d.kv_heads; ++h)
          kernels::rmsnorm(row + qd + h * hd, w.k_norm.data(), row + qd + h * hd, hd, c.norm_eps);
      }
      const int pos = ws.pos[size_t(t)];
      kernels::rope(row, d.heads, hd, pos, rope, c.rope);
      kernels::rope(row + qd, d.kv_heads, hd, pos, rope, c.rope);
      const SequenceCache& seq = *inputs[size_t(ws.seq_of[size_t(t)])].cache;
      cache.store(li, seq, pos, row + qd, row + qd + kvd);
    });
    attention(li, inputs, cache, pool, ws);
    row_parallel(w.wo, ws.att.data(), qd, tmp);
    for_each_token(pool, T, [&](int t) {
      float* xr = x + size_t(t) * size_t(dim);
      float* out = tmp + size_t(t) * size_t(dim);
      if (!w.post_attn_norm.empty())
        kernels::rmsnorm(out, w.post_attn_norm.data(), out, dim, c.norm_eps);
      add_row(xr, out);
      kernels::rmsnorm(xr, w.ffn_norm.data(), xb + size_t(t) * size_t(dim), dim, c.norm_eps);
    });
    matmul(pool, xb, T, dim, w.gate_up, ws.hb.data(), 2 * hidden);
    for_each_token(pool, T, [&](int t) {
      float* h = ws.hb.data() + size_t(t) * size_t(2 * hidden);
      if (c.activation == FfnActivation::GeluTanh) {
        kernels::gelu_tanh_mul(h, h + hidden, h, hidden);
      } else {
        kernels::silu_mul(h, h + hidden, h, hidden);
      }
    });
    row_parallel(w.down, ws.hb.data(), 2 * hidden, tmp);
    // The FFN's output joins the residual later (the next layer's norm
    // pass, or the end), normed first where the model says so.
    if (!w.post_ffn_norm.empty())
      for_each_token(pool, T, [&](int t) {
        float* out = tmp + size_t(t) * size_t(dim);
        kernels::rmsnorm(out, w.post_ffn_norm.data(), out, dim, c.norm_eps);
      });
    time_layer(li);
  }
  for (auto& in : inputs) in.cache->length += int(in.tokens.size());
  // The last layer's down projection is still apart from the residual: the
  // next stage gets every row, the classifier reads only a sequence's last.
  const bool pending = d.layers() > 0;
  if (!d.last) {
    // x + tmp written straight to the output, one pass instead of an add and
    // a copy.
    for_each_token(pool, T, [&](int t) {
      const size_t r = size_t(t) * size_t(dim);
      if (!pending) {
        std::copy(x + r, x + r + size_t(dim), io.x_out + r);
        return;
      }
      for (int i = 0; i < dim; ++i) io.x_out[r + size_t(i)] = x[r + size_t(i)] + tmp[r + size_t(i)];
    });
    return;
  }

  const size_t stride = size_t(d.vocab_stride);
  // Every row of the inputs that want all their logits: the final residual
  // (x plus the last layer's pending down projection, as below) normed into
  // row_in, then classified in one product. x is left as it is.
  if (io.row_logits) {
    int rows = 0;
    for (const auto& in : inputs) rows += in.all_logits ? int(in.tokens.size()) : 0;
    if (rows > 0) {
      if (ws.row_in.size() < size_t(rows) * size_t(dim))
        ws.row_in.resize(size_t(rows) * size_t(dim));
      std::vector<float> row(static_cast<size_t>(dim));
      int t = 0, r = 0;
      for (const auto& in : inputs) {
        const int n = int(in.tokens.size());
        for (int j = 0; in.all_logits && j < n; ++j, ++r) {
          const size_t at = size_t(t + j) * size_t(dim);
          std::copy(x + at, x + at + size_t(dim), row.begin());
          if (pending) add_row(row.data(), tmp + at);
          kernels::rmsnorm(row.data(), final_norm_.data(),
                           ws.row_in.data() + size_t(r) * size_t(dim), dim, c.norm_eps);
        }
        t += n;
      }
      matmul(pool, ws.row_in.data(), rows, dim, classifier_, io.row_logits, int(stride));
    }
  }

  // Classifier (this shard's vocabulary slice) for the last token of inputs
  // that want logits, written compactly, then moved to each input's row.
  std::vector<int> out_rows;
  out_rows.reserve(size_t(outputs));
  {
    int t = 0, o = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      t += int(inputs[i].tokens.size());
      if (!inputs[i].want_logits) continue;
      if (pending) add_row(x + size_t(t - 1) * size_t(dim), tmp + size_t(t - 1) * size_t(dim));
      kernels::rmsnorm(x + size_t(t - 1) * size_t(dim), final_norm_.data(),
                       ws.final_in.data() + size_t(o) * size_t(dim), dim, c.norm_eps);
      out_rows.push_back(int(i));
      ++o;
    }
  }
  if (outputs == 0) return;
  if (outputs == int(inputs.size())) {
    matmul(pool, ws.final_in.data(), outputs, dim, classifier_, io.logits, int(stride));
  } else {
    matmul(pool, ws.final_in.data(), outputs, dim, classifier_, ws.logits.data(), int(stride));
    for (int o = 0; o < outputs; ++o)
      std::copy(ws.logits.begin() + long(size_t(o) * stride),
                ws.logits.begin() + long(size_t(o) * stride + size_t(d.vocab)),
                io.logits + size_t(out_rows[size_t(o)]) * stride);
  }
  if (d.layers() > 0) time_layer(d.layers() - 1);
}

}  // namespace troupe
