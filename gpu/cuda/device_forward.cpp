#include "gpu/cuda/device_forward.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "gpu/cpu/kernels.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/kernels.h"

namespace troupe::cu {

namespace {

void check_slice_suits_kernels(const ModelConfig& local, const ShardDims& d, int tensor) {
  const int group = local.n_kv_heads > 0 ? local.n_heads / local.n_kv_heads : 0;
  if (local.head_dim % 8 == 0 && local.head_dim <= 256 && local.head_dim >= 8 && group >= 1 &&
      group <= 8 && local.n_heads % local.n_kv_heads == 0)
    return;
  const std::string whose = tensor > 1 ? "this tensor-parallel shard (rank " +
                                             std::to_string(d.head_begin / d.heads) + " of " +
                                             std::to_string(tensor) + ") has"
                                       : "this model has";
  throw std::invalid_argument(
      "the CUDA backend needs head_dim a multiple of 8 up to 256 and 1 to 8 query heads per KV "
      "head; " +
      whose + " head_dim " + std::to_string(local.head_dim) + ", " + std::to_string(local.n_heads) +
      " heads and " + std::to_string(local.n_kv_heads) + " KV heads");
}

}  // namespace

void check_options(const CudaEngineOptions& o) {
  if (o.block_tokens < 1 || o.blocks < 1 || o.max_batch_tokens < 1 || o.max_batch_sequences < 1)
    throw std::invalid_argument(
        "CUDA engine options need positive block_tokens, blocks, max_batch_tokens and "
        "max_batch_sequences");
}

ModelConfig shard_config(const ModelConfig& model, const ShardDims& d) {
  ModelConfig c = model;
  c.n_layers = d.layers();
  c.n_heads = d.heads;
  c.n_kv_heads = d.kv_heads;
  c.hidden_dim = d.hidden;
  c.vocab_size = d.vocab;
  return c;
}

DeviceForward::DeviceForward(const Checkpoint& ckpt, DType dtype, const ShardDims& dims,
                             const CudaEngineOptions& o)
    : model_(ckpt.config),
      local_(shard_config(ckpt.config, dims)),
      dims_(dims),
      dtype_(dtype),
      options_(o) {
  model_.validate(ckpt.source.string());
  check_slice_suits_kernels(local_, dims, model_.n_heads / std::max(1, dims.heads));
  std::string why;
  if (!cuda_device_available(&why)) throw std::runtime_error(why);
  use_device();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
  sm_count_ = prop.multiProcessorCount;
  name_ = "CUDA device " + std::to_string(o.device) + " (" + prop.name + ")";

  StepCapacity cap;
  cap.tokens = o.max_batch_tokens;
  cap.items = std::min(o.max_batch_sequences, o.max_batch_tokens);
  cap.blocks_per_seq = (model_.max_seq_len + o.block_tokens - 1) / o.block_tokens;
  layout_ = StepLayout::for_capacity(cap);

  PoolPlan plan;
  const WeightPlan weight_plan(plan, model_, dims, dtype);
  const size_t kv_bytes = kv_cache_bytes(local_, dtype, o.block_tokens, o.blocks);
  kv_layer_bytes_ = kv_bytes / size_t(2 * local_.n_layers);
  kv_ = plan.add("KV cache (" + std::to_string(o.blocks) + " blocks x " +
                     std::to_string(o.block_tokens) + " tokens)",
                 kv_bytes);
  buf_ = plan_step_buffers(plan, local_, dtype, layout_);
  pool_bytes_ = plan.total();
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  plan.check_fits(free_bytes, o.reserve_bytes, name_);
  if (cudaMalloc(reinterpret_cast<void**>(&pool_), plan.total()) != cudaSuccess) {
    cudaGetLastError();
    pool_ = nullptr;
    throw DeviceMemoryError(name_ + ": cudaMalloc of the " + format_bytes(plan.total()) +
                            " pool failed although " + format_bytes(free_bytes) +
                            " was reported free");
  }
  try {
    weights_ = weight_plan.upload(ckpt, pool_);
    const kernels::RopeTable rope(model_.max_seq_len, model_.head_dim, model_.rope_theta,
                                  model_.rope_scaling);
    const size_t half = size_t(model_.max_seq_len) * size_t(rope.half());
    check(
        cudaMemcpy(at<float>(buf_.rope), rope.cos(0), half * sizeof(float), cudaMemcpyHostToDevice),
        "upload RoPE table");
    check(cudaMemcpy(at<float>(buf_.rope) + half, rope.sin(0), half * sizeof(float),
                     cudaMemcpyHostToDevice),
          "upload RoPE table");
    configure_kernels();
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    gemm_ = std::make_unique<Gemm>(pool_ + buf_.workspace, kGemmWorkspaceBytes, o.deterministic,
                                   cap.tokens);
  } catch (...) {
    release();
    throw;
  }
  const bool whole = dims.first && dims.last && dims.heads == model_.n_heads;
  spdlog::info("{}: {}{} weights {}, KV cache {}, pool {} ({} free before)", name_,
               whole ? ""
                     : fmt::format("layers [{}, {}), heads [{}, {}): ", dims.layer_begin,
                                   dims.layer_end, dims.head_begin, dims.head_begin + dims.heads),
               dtype_name(dtype), format_bytes(weights_.bytes), format_bytes(kv_bytes),
               format_bytes(plan.total()), format_bytes(free_bytes));
}

DeviceForward::~DeviceForward() {
  release();
}

void DeviceForward::use_device() const {
  check(cudaSetDevice(options_.device), "cudaSetDevice");
}

void DeviceForward::release() {
  if (cudaSetDevice(options_.device) != cudaSuccess) return;
  if (stream_) cudaStreamSynchronize(stream_);
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_), stream_ = nullptr;
  if (pool_) cudaFree(pool_), pool_ = nullptr;
}

ForwardShape DeviceForward::eager_shape(const PackedStep& pk) const {
  ForwardShape s;
  s.tokens = pk.tokens;
  s.items = pk.items;
  s.rows = int(pk.row_item.size());
  s.max_item_tokens = pk.max_item_tokens;
  s.split = plan_decode_split({pk.items, local_.n_kv_heads, std::max(1, pk.max_context), sm_count_,
                               options_.deterministic});
  return s;
}

ForwardShape DeviceForward::graph_shape(int n) const {
  ForwardShape s;
  s.tokens = s.items = s.rows = n;
  s.split = plan_decode_split(
      {n, local_.n_kv_heads, model_.max_seq_len, sm_count_, options_.deterministic});
  return s;
}

void DeviceForward::forward(const ForwardShape& s, bool sample, const DeviceReduce& reduce) {
  const ModelConfig& c = local_;
  const StepView v = step_view(metadata(), layout_);
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hidden = c.hidden_dim;
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, options_.block_tokens,
                             1.0f / std::sqrt(float(c.head_dim))};
  const DecodePartials partials{at<float>(buf_.partial_acc), at<float>(buf_.partial_max),
                                at<float>(buf_.partial_sum)};
  float* x = at<float>(buf_.x);
  float* proj = at<float>(buf_.proj);
  void* xb = pool_ + buf_.xb;
  void* att = pool_ + buf_.att;
  void* h = pool_ + buf_.h;
  const int T = s.tokens;
  const size_t residual = size_t(T) * size_t(dim);
  if (dims_.first) embed_tokens(weights_.embedding, dtype_, v.token_ids, T, dim, x, stream_);
  for (int l = 0; l < c.n_layers; ++l) {
    const DeviceLayer& w = weights_.layers[size_t(l)];
    // The previous layer's down projection joins the residual here.
    add_rmsnorm(x, l ? proj : nullptr, w.attn_norm, nullptr, xb, dtype_, T, dim, c.norm_eps,
                stream_);
    gemm_->run(w.wqkv, xb, at<float>(buf_.qkv), T, qd + 2 * kvd, dim, dtype_, stream_);
    rope_write_kv(at<float>(buf_.qkv), v, T, at<float>(buf_.rope), c.max_seq_len, shape, c.rope,
                  at<float>(buf_.q), k_cache(l), v_cache(l), dtype_, stream_);
    decode_attention(v, s.items, at<float>(buf_.q), k_cache(l), v_cache(l), dtype_, shape, s.split,
                     partials, att, stream_);
    if (s.max_item_tokens > 1)
      prefill_attention(v, s.items, s.max_item_tokens, at<float>(buf_.q), k_cache(l), v_cache(l),
                        dtype_, shape, att, stream_);
    gemm_->run(w.wo, att, proj, T, dim, qd, dtype_, stream_);
    if (reduce) reduce(proj, residual);
    add_rmsnorm(x, proj, w.ffn_norm, nullptr, xb, dtype_, T, dim, c.norm_eps, stream_);
    gemm_->run(w.gate_up, xb, at<float>(buf_.gate_up), T, 2 * hidden, dim, dtype_, stream_);
    silu_mul(at<float>(buf_.gate_up), T, hidden, h, dtype_, stream_);
    gemm_->run(w.down, h, proj, T, dim, hidden, dtype_, stream_);
    if (reduce) reduce(proj, residual);
  }
  if (!dims_.last) {
    add_into(x, proj, residual, stream_);
    return;
  }
  if (s.rows == 0) return;
  // Only the sampled tokens go through the final norm and the classifier.
  void* final_in = pool_ + buf_.final_in;
  add_rmsnorm(x, proj, weights_.final_norm, v.row_token, final_in, dtype_, s.rows, dim, c.norm_eps,
              stream_);
  gemm_->run(weights_.classifier, final_in, logits(), s.rows, c.vocab_size, dim, dtype_, stream_);
  if (sample) sample_rows(logits(), s.rows, c.vocab_size, v, sampled(), flags(), stream_);
}

}  // namespace troupe::cu
