// The whole model on one CUDA device behind the StepEngine interface.
//
// A step: validate (nothing touched on error), draw each sampled row's coin
// from the sequence's host-side generator, pack the metadata into pinned
// memory, one async copy to the persistent device buffer, then either the
// captured graph of the padded batch size (decode steps) or the kernels
// launched eagerly, and the sampled ids (one int per row) back. No device
// allocation and no host synchronisation happen inside a step; the host
// waits only in finish() (or when a new step is launched before the last
// one was finished, since both share the pinned buffers).
#include "gpu/cuda/cuda_engine.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "gpu/cpu/kernels.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/decode_split.h"
#include "gpu/cuda/device_model.h"
#include "gpu/cuda/gemm.h"
#include "gpu/cuda/graph_sizes.h"
#include "gpu/cuda/kernels.h"
#include "gpu/cuda/memory_plan.h"
#include "gpu/cuda/step_metadata.h"
#include "gpu/sampler.h"

namespace troupe {

namespace {

using namespace cu;

// Launch shapes of one step; a graph is captured for one of these.
struct ForwardShape {
  int tokens = 0;
  int items = 0;
  int rows = 0;  // logits rows computed and sampled
  int max_item_tokens = 1;
  DecodeSplit split;
};

void check_model_suits_kernels(const ModelConfig& c) {
  const int group = c.n_kv_heads > 0 ? c.n_heads / c.n_kv_heads : 0;
  if (c.head_dim % 8 != 0 || c.head_dim > 256 || c.head_dim < 8 ||
      !(group == 1 || group == 2 || group == 4 || group == 8) || c.n_heads % c.n_kv_heads != 0)
    throw std::invalid_argument(
        "the CUDA backend needs head_dim a multiple of 8 up to 256 and 1, 2, 4 or 8 query heads "
        "per KV head; this model has head_dim " +
        std::to_string(c.head_dim) + ", " + std::to_string(c.n_heads) + " heads and " +
        std::to_string(c.n_kv_heads) + " KV heads");
}

template <class T>
T* pinned(size_t count, const char* what) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocDefault), what);
  return static_cast<T*>(p);
}

class CudaEngine final : public StepEngine {
 public:
  CudaEngine(const Checkpoint& ckpt, DType dtype, CudaEngineOptions o);
  ~CudaEngine() override;

  const ModelConfig& config() const override { return config_; }
  int kv_blocks() const override { return options_.blocks; }
  int block_tokens() const override { return options_.block_tokens; }
  uint64_t launch(std::vector<StepItem> items, std::function<void()> on_done = {}) override;
  std::vector<int> finish(uint64_t ticket) override;
  void release(uint64_t seq) override { samplers_.erase(seq); }
  std::vector<StageSample> last_samples() const override { return last_samples_; }
  EngineStats stats() const override;

 private:
  struct Pending {
    uint64_t ticket = 0;
    std::vector<StepItem> items;
    PackedStep packed;
    std::vector<Xoshiro256> rng_before;  // per row: the generator before its draw
    std::vector<SamplingParams> params;  // per row
    size_t tokens = 0;
    int graph_items = 0;  // the captured size it runs as; 0: eager
  };
  struct Result {
    std::vector<int> ids;
    std::exception_ptr error;
  };

  // Frees what the engine holds on the device and in pinned memory.
  void release_device();
  void use_device() const { check(cudaSetDevice(options_.device), "cudaSetDevice"); }
  std::vector<RowSampling> draw_coins(Pending& p);
  void forward(const ForwardShape& s);
  cudaGraphExec_t graph_for(int padded_items);
  ForwardShape graph_shape(int padded_items) const;
  void settle();
  template <class T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(pool_ + offset);
  }
  void* k_cache(int layer) const { return pool_ + kv_ + size_t(2 * layer) * kv_layer_bytes_; }
  void* v_cache(int layer) const { return pool_ + kv_ + size_t(2 * layer + 1) * kv_layer_bytes_; }

  ModelConfig config_;
  DType dtype_;
  CudaEngineOptions options_;
  int sm_count_ = 1;
  std::string device_name_;
  StepLayout layout_;
  StepBuffers buf_;
  size_t kv_ = 0, kv_layer_bytes_ = 0;
  char* pool_ = nullptr;
  DeviceWeights weights_;
  std::unique_ptr<Gemm> gemm_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, done_ = nullptr;
  std::byte* meta_host_ = nullptr;
  int* ids_host_ = nullptr;
  int* flags_host_ = nullptr;
  std::vector<int> graph_sizes_;
  std::unordered_map<int, cudaGraphExec_t> graphs_;
  std::unordered_map<uint64_t, std::unique_ptr<Sampler>> samplers_;
  std::optional<Pending> pending_;
  std::map<uint64_t, Result> results_;
  uint64_t next_ticket_ = 1;
  uint64_t steps_ = 0;
  double busy_s_ = 0;
  std::vector<StageSample> last_samples_;
};

CudaEngine::CudaEngine(const Checkpoint& ckpt, DType dtype, CudaEngineOptions o)
    : config_(ckpt.config), dtype_(dtype), options_(o) {
  config_.validate(ckpt.source.string());
  check_model_suits_kernels(config_);
  std::string why;
  if (!cuda_device_available(&why)) throw std::runtime_error(why);
  use_device();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
  sm_count_ = prop.multiProcessorCount;
  device_name_ = "CUDA device " + std::to_string(o.device) + " (" + prop.name + ")";

  StepCapacity cap;
  cap.tokens = o.max_batch_tokens;
  cap.items = std::min(o.max_batch_sequences, o.max_batch_tokens);
  cap.blocks_per_seq = (config_.max_seq_len + o.block_tokens - 1) / o.block_tokens;
  layout_ = StepLayout::for_capacity(cap);

  PoolPlan plan;
  const WeightPlan weight_plan(plan, config_, dtype);
  const size_t kv_bytes = kv_cache_bytes(config_, dtype, o.block_tokens, o.blocks);
  kv_layer_bytes_ = kv_bytes / size_t(2 * config_.n_layers);
  kv_ = plan.add("KV cache (" + std::to_string(o.blocks) + " blocks x " +
                     std::to_string(o.block_tokens) + " tokens)",
                 kv_bytes);
  buf_ = plan_step_buffers(plan, config_, dtype, layout_);
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  plan.check_fits(free_bytes, o.reserve_bytes, device_name_);
  if (cudaMalloc(reinterpret_cast<void**>(&pool_), plan.total()) != cudaSuccess) {
    cudaGetLastError();
    throw DeviceMemoryError(device_name_ + ": cudaMalloc of the " + format_bytes(plan.total()) +
                            " pool failed although " + format_bytes(free_bytes) +
                            " was reported free");
  }
  try {
    weights_ = weight_plan.upload(ckpt, pool_);
    const kernels::RopeTable rope(config_.max_seq_len, config_.head_dim, config_.rope_theta);
    const size_t half = size_t(config_.max_seq_len) * size_t(rope.half());
    check(
        cudaMemcpy(at<float>(buf_.rope), rope.cos(0), half * sizeof(float), cudaMemcpyHostToDevice),
        "upload RoPE table");
    check(cudaMemcpy(at<float>(buf_.rope) + half, rope.sin(0), half * sizeof(float),
                     cudaMemcpyHostToDevice),
          "upload RoPE table");
    configure_kernels();
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&done_), "cudaEventCreate");
    meta_host_ = pinned<std::byte>(layout_.bytes, "pinned step metadata");
    ids_host_ = pinned<int>(size_t(cap.items), "pinned sampled ids");
    flags_host_ = pinned<int>(size_t(cap.items), "pinned sample flags");
    gemm_ = std::make_unique<Gemm>(pool_ + buf_.workspace, kGemmWorkspaceBytes, o.deterministic,
                                   cap.tokens);
  } catch (...) {
    release_device();
    throw;
  }
  if (o.graphs) graph_sizes_ = graph_batch_sizes(cap.items);
  spdlog::info("{}: {} weights {}, KV cache {}, pool {} ({} free before), graphs {}, {}",
               device_name_, dtype_name(dtype), format_bytes(weights_.bytes),
               format_bytes(kv_bytes), format_bytes(plan.total()), format_bytes(free_bytes),
               o.graphs ? "on" : "off", o.deterministic ? "deterministic" : "fast");
}

CudaEngine::~CudaEngine() {
  release_device();
}

void CudaEngine::release_device() {
  if (cudaSetDevice(options_.device) != cudaSuccess) return;
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [n, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
  gemm_.reset();
  if (meta_host_) cudaFreeHost(meta_host_), meta_host_ = nullptr;
  if (ids_host_) cudaFreeHost(ids_host_), ids_host_ = nullptr;
  if (flags_host_) cudaFreeHost(flags_host_), flags_host_ = nullptr;
  if (start_) cudaEventDestroy(start_), start_ = nullptr;
  if (done_) cudaEventDestroy(done_), done_ = nullptr;
  if (stream_) cudaStreamDestroy(stream_), stream_ = nullptr;
  if (pool_) cudaFree(pool_), pool_ = nullptr;
}

std::vector<RowSampling> CudaEngine::draw_coins(Pending& p) {
  std::vector<RowSampling> rows;
  for (const StepItem& it : p.items) {
    if (!it.sample) continue;
    auto& s = samplers_[it.seq];
    if (!s) s = Sampler::resumed(it.sampling, uint64_t(it.generated));
    const SamplingParams& sp = s->params();
    RowSampling r{sp.temperature, sp.top_p, sp.top_k, 0.0};
    p.rng_before.push_back(s->rng());
    p.params.push_back(sp);
    if (sp.temperature > 0) {  // greedy draws nothing, as on the CPU
      Xoshiro256 rng = s->rng();
      r.coin = rng.next_double();
      s->set_rng(rng);
    }
    rows.push_back(r);
  }
  return rows;
}

ForwardShape CudaEngine::graph_shape(int n) const {
  ForwardShape s;
  s.tokens = s.items = s.rows = n;
  s.split = plan_decode_split(
      {n, config_.n_kv_heads, config_.max_seq_len, sm_count_, options_.deterministic});
  return s;
}

void CudaEngine::forward(const ForwardShape& s) {
  const ModelConfig& c = config_;
  const StepView v = step_view(pool_ + buf_.metadata, layout_);
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
  embed_tokens(weights_.embedding, dtype_, v.token_ids, T, dim, x, stream_);
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
    add_rmsnorm(x, proj, w.ffn_norm, nullptr, xb, dtype_, T, dim, c.norm_eps, stream_);
    gemm_->run(w.gate_up, xb, at<float>(buf_.gate_up), T, 2 * hidden, dim, dtype_, stream_);
    silu_mul(at<float>(buf_.gate_up), T, hidden, h, dtype_, stream_);
    gemm_->run(w.down, h, proj, T, dim, hidden, dtype_, stream_);
  }
  if (s.rows == 0) return;
  // Only the sampled tokens go through the final norm and the classifier.
  void* final_in = pool_ + buf_.final_in;
  add_rmsnorm(x, proj, weights_.final_norm, v.row_token, final_in, dtype_, s.rows, dim, c.norm_eps,
              stream_);
  gemm_->run(weights_.classifier, final_in, at<float>(buf_.logits), s.rows, c.vocab_size, dim,
             dtype_, stream_);
  sample_rows(at<float>(buf_.logits), s.rows, c.vocab_size, v, at<int>(buf_.sampled),
              at<int>(buf_.flags), stream_);
}

cudaGraphExec_t CudaEngine::graph_for(int n) {
  if (auto it = graphs_.find(n); it != graphs_.end()) return it->second;
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin graph capture");
  cudaGraph_t graph = nullptr;
  try {
    forward(graph_shape(n));
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  check(cudaStreamEndCapture(stream_, &graph), "end graph capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  return graphs_[n] = exec;
}

uint64_t CudaEngine::launch(std::vector<StepItem> items, std::function<void()> on_done) {
  if (items.empty()) throw std::invalid_argument("launch: a step needs at least one item");
  use_device();
  settle();  // the pinned buffers are the last step's until it is collected
  const uint64_t ticket = next_ticket_++;
  Pending p;
  p.ticket = ticket;
  p.items = std::move(items);
  try {
    validate_step(p.items, config_, options_.block_tokens, options_.blocks, layout_.capacity);
    const std::vector<RowSampling> rows = draw_coins(p);
    const int n = int(p.items.size());
    bool decode_only = true;
    for (const auto& it : p.items) {
      decode_only = decode_only && it.tokens.size() == 1;
      p.tokens += it.tokens.size();
    }
    p.graph_items = decode_only ? padded_batch(graph_sizes_, n) : 0;
    p.packed = pack_step(p.items, rows, options_.block_tokens, layout_, p.graph_items,
                         std::span<std::byte>(meta_host_, layout_.bytes));
  } catch (const std::invalid_argument&) {
    results_[ticket].error = std::current_exception();
    if (on_done) on_done();
    return ticket;
  }
  const PackedStep& pk = p.packed;
  check(cudaMemcpyAsync(pool_ + buf_.metadata, meta_host_, layout_.bytes, cudaMemcpyHostToDevice,
                        stream_),
        "copy step metadata");
  check(cudaEventRecord(start_, stream_), "cudaEventRecord");
  if (p.graph_items > 0) {
    check(cudaGraphLaunch(graph_for(p.graph_items), stream_), "cudaGraphLaunch");
  } else {
    ForwardShape s;
    s.tokens = pk.tokens;
    s.items = pk.items;
    s.rows = int(pk.row_item.size());
    s.max_item_tokens = pk.max_item_tokens;
    s.split = plan_decode_split({pk.items, config_.n_kv_heads, std::max(1, pk.max_context),
                                 sm_count_, options_.deterministic});
    forward(s);
  }
  const size_t rows = pk.row_item.size();
  if (rows > 0) {
    check(cudaMemcpyAsync(ids_host_, at<int>(buf_.sampled), rows * sizeof(int),
                          cudaMemcpyDeviceToHost, stream_),
          "copy sampled ids");
    check(cudaMemcpyAsync(flags_host_, at<int>(buf_.flags), rows * sizeof(int),
                          cudaMemcpyDeviceToHost, stream_),
          "copy sample flags");
  }
  check(cudaEventRecord(done_, stream_), "cudaEventRecord");
  if (on_done) {
    // Runs on a CUDA callback thread once the step is over: it must not
    // call into CUDA (nor into this engine, which does).
    auto* fn = new std::function<void()>(std::move(on_done));
    check(cudaLaunchHostFunc(
              stream_,
              [](void* arg) {
                std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(arg));
                (*f)();
              },
              fn),
          "cudaLaunchHostFunc");
  }
  pending_ = std::move(p);
  return ticket;
}

void CudaEngine::settle() {
  if (!pending_) return;
  Pending p = std::move(*pending_);
  pending_.reset();
  check(cudaEventSynchronize(done_), "step");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start_, done_), "cudaEventElapsedTime");
  busy_s_ += double(ms) * 1e-3;
  ++steps_;
  last_samples_ = {StageSample{0, p.tokens, double(ms) * 1e-3}};
  Result& r = results_[p.ticket];
  r.ids.assign(p.items.size(), -1);
  const size_t vocab = size_t(config_.vocab_size);
  const std::vector<int>& row_item = p.packed.row_item;
  if (keep_logits_) {
    last_logits_.resize(row_item.size() * vocab);
    check(cudaMemcpy(last_logits_.data(), at<float>(buf_.logits),
                     last_logits_.size() * sizeof(float), cudaMemcpyDeviceToHost),
          "copy logits");
  }
  std::vector<float> row;
  try {
    for (size_t k = 0; k < row_item.size(); ++k) {
      int id = ids_host_[k];
      if (flags_host_[k]) {
        // Too close to call on the device: the CPU sampler decides, from the
        // same logits and the generator as it was before this row's draw.
        row.resize(vocab);
        check(cudaMemcpy(row.data(), at<float>(buf_.logits) + k * vocab, vocab * sizeof(float),
                         cudaMemcpyDeviceToHost),
              "copy logits row");
        Sampler s(p.params[k]);
        s.set_rng(p.rng_before[k]);
        id = s.sample(row);
      }
      r.ids[size_t(row_item[k])] = id;
    }
  } catch (const std::invalid_argument&) {
    r.error = std::current_exception();
  }
}

std::vector<int> CudaEngine::finish(uint64_t ticket) {
  use_device();
  if (pending_ && pending_->ticket == ticket) settle();
  auto node = results_.extract(ticket);
  if (node.empty()) throw std::invalid_argument("finish: no step in flight with that ticket");
  if (node.mapped().error) std::rethrow_exception(node.mapped().error);
  return std::move(node.mapped().ids);
}

EngineStats CudaEngine::stats() const {
  EngineStats s;
  s.steps = steps_;
  s.wall_s = busy_s_;
  s.stages = {StageStats{busy_s_, 0, 0}};
  s.weight_bytes = {weights_.bytes};
  s.streamed_bytes = {weights_.streamed_bytes};
  return s;
}

}  // namespace

std::unique_ptr<StepEngine> make_cuda_engine(const Checkpoint& checkpoint, DType dtype,
                                             CudaEngineOptions options) {
  if (options.block_tokens < 1 || options.blocks < 1 || options.max_batch_tokens < 1 ||
      options.max_batch_sequences < 1)
    throw std::invalid_argument(
        "CUDA engine options need positive block_tokens, blocks, max_batch_tokens and "
        "max_batch_sequences");
  return std::make_unique<CudaEngine>(checkpoint, dtype, options);
}

}  // namespace troupe
