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

#include <optional>
#include <unordered_map>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/device_forward.h"
#include "gpu/cuda/graph_sizes.h"
#include "gpu/cuda/step_metadata.h"
#include "gpu/sampler.h"

namespace troupe {

namespace {

using namespace cu;

class CudaEngine final : public StepEngine {
 public:
  CudaEngine(const Checkpoint& ckpt, DType dtype, CudaEngineOptions o);
  ~CudaEngine() override;

  const ModelConfig& config() const override { return fwd_->model(); }
  int kv_blocks() const override { return options_.blocks; }
  int block_tokens() const override { return options_.block_tokens; }
  uint64_t launch(std::vector<StepItem> items, std::function<void()> on_done = {}) override;
  std::vector<int> finish(uint64_t ticket) override;
  void release(uint64_t seq) override {
    samplers_.erase(seq);
    penalties_.release(seq);
  }
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
    std::vector<std::optional<TokenLogprobs>> logprobs;
    std::exception_ptr error;
  };

  // Frees what the engine holds besides the device pool: graphs, events,
  // pinned memory.
  void release_host();
  void use_device() const { fwd_->use_device(); }
  std::vector<RowSampling> draw_coins(Pending& p);
  void capture_graphs();
  cudaGraphExec_t graph_for(int padded_items);
  void settle();

  CudaEngineOptions options_;
  std::unique_ptr<DeviceForward> fwd_;
  cudaStream_t stream_ = nullptr;  // fwd_'s
  cudaEvent_t start_ = nullptr, done_ = nullptr;
  std::byte* meta_host_ = nullptr;
  int* ids_host_ = nullptr;
  int* flags_host_ = nullptr;
  std::vector<int> graph_sizes_;
  std::unordered_map<int, cudaGraphExec_t> graphs_;
  std::unordered_map<uint64_t, std::unique_ptr<Sampler>> samplers_;
  SequencePenalties penalties_;  // rows they adjust are sampled on the host
  std::optional<Pending> pending_;
  std::map<uint64_t, Result> results_;
  uint64_t next_ticket_ = 1;
  uint64_t steps_ = 0;
  double busy_s_ = 0;
  std::vector<StageSample> last_samples_;
};

CudaEngine::CudaEngine(const Checkpoint& ckpt, DType dtype, CudaEngineOptions o)
    : options_(o),
      fwd_(std::make_unique<DeviceForward>(ckpt, dtype, shard_dims(ckpt.config, ShardSpec{}), o)),
      stream_(fwd_->stream()) {
  penalties_.set_eos_ids(ckpt.config.eos_ids);
  const StepLayout& layout = fwd_->layout();
  try {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&done_), "cudaEventCreate");
    meta_host_ = pinned<std::byte>(layout.bytes, "pinned step metadata");
    ids_host_ = pinned<int>(size_t(layout.capacity.items), "pinned sampled ids");
    flags_host_ = pinned<int>(size_t(layout.capacity.items), "pinned sample flags");
  } catch (...) {
    release_host();
    throw;
  }
  if (o.graphs) {
    graph_sizes_ = graph_batch_sizes(layout.capacity.items);
    try {
      capture_graphs();
    } catch (...) {
      release_host();
      throw;
    }
  }
  spdlog::info("{}: graphs {} ({} captured), {}", fwd_->name(), o.graphs ? "on" : "off",
               graphs_.size(), o.deterministic ? "deterministic" : "fast");
}

// Every decode graph is captured before the first step, over a step of
// padding items only (no KV slot written, nothing sampled): capturing and
// instantiating allocate device and host memory, which a step must not.
void CudaEngine::capture_graphs() {
  use_device();
  const StepLayout& layout = fwd_->layout();
  for (int n : graph_sizes_) {
    pack_step({}, {}, options_.block_tokens, layout, n,
              std::span<std::byte>(meta_host_, layout.bytes));
    check(cudaMemcpyAsync(fwd_->metadata(), meta_host_, layout.bytes, cudaMemcpyHostToDevice,
                          stream_),
          "copy step metadata");
    graph_for(n);
    // The next size packs into the same pinned buffer.
    check(cudaStreamSynchronize(stream_), "capture decode graphs");
  }
}

CudaEngine::~CudaEngine() {
  release_host();
}

void CudaEngine::release_host() {
  if (cudaSetDevice(options_.device) != cudaSuccess) return;
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [n, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
  if (meta_host_) cudaFreeHost(meta_host_), meta_host_ = nullptr;
  if (ids_host_) cudaFreeHost(ids_host_), ids_host_ = nullptr;
  if (flags_host_) cudaFreeHost(flags_host_), flags_host_ = nullptr;
  if (start_) cudaEventDestroy(start_), start_ = nullptr;
  if (done_) cudaEventDestroy(done_), done_ = nullptr;
}

std::vector<RowSampling> CudaEngine::draw_coins(Pending& p) {
  // Every sampler first (one may refuse its parameters): a step that fails
  // must not have moved the others' generators, or a retry would draw other
  // coins than the CPU engine.
  for (const StepItem& it : p.items) {
    if (!it.sample) continue;
    auto& s = samplers_[it.seq];
    if (!s) s = Sampler::resumed(it.sampling, uint64_t(it.generated));
  }
  std::vector<RowSampling> rows;
  for (const StepItem& it : p.items) {
    if (!it.sample) continue;
    auto& s = samplers_[it.seq];
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

cudaGraphExec_t CudaEngine::graph_for(int n) {
  if (auto it = graphs_.find(n); it != graphs_.end()) return it->second;
  const ForwardShape shape = fwd_->graph_shape(n);
  // The step runs once eagerly before the capture, on its metadata
  // (already queued): that makes the cuBLASLt plans of these row counts
  // (heuristic queries stay out of the capture) and loads every kernel it
  // launches (CUDA loads modules lazily, at first launch, and a module load
  // is not allowed while a stream captures). Running it twice is harmless:
  // the same KV slots get the same values, and the ids and flags are
  // written again by the graph.
  fwd_->forward(shape, true);
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin graph capture");
  cudaGraph_t graph = nullptr;
  try {
    fwd_->forward(shape, true);
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
    const StepLayout& layout = fwd_->layout();
    validate_step(p.items, config(), options_.block_tokens, options_.blocks, layout.capacity);
    const std::vector<RowSampling> rows = draw_coins(p);
    const int n = int(p.items.size());
    bool decode_only = true;
    for (const auto& it : p.items) {
      decode_only = decode_only && it.tokens.size() == 1;
      p.tokens += it.tokens.size();
    }
    p.graph_items = decode_only ? padded_batch(graph_sizes_, n) : 0;
    p.packed = pack_step(p.items, rows, options_.block_tokens, layout, p.graph_items,
                         std::span<std::byte>(meta_host_, layout.bytes));
  } catch (const std::invalid_argument&) {
    results_[ticket].error = std::current_exception();
    if (on_done) on_done();
    return ticket;
  }
  const PackedStep& pk = p.packed;
  try {
    check(cudaMemcpyAsync(fwd_->metadata(), meta_host_, fwd_->layout().bytes,
                          cudaMemcpyHostToDevice, stream_),
          "copy step metadata");
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    if (p.graph_items > 0) {
      check(cudaGraphLaunch(graph_for(p.graph_items), stream_), "cudaGraphLaunch");
    } else {
      fwd_->forward(fwd_->eager_shape(pk), true);
    }
    const size_t rows = pk.row_item.size();
    if (rows > 0) {
      check(cudaMemcpyAsync(ids_host_, fwd_->sampled(), rows * sizeof(int), cudaMemcpyDeviceToHost,
                            stream_),
            "copy sampled ids");
      check(cudaMemcpyAsync(flags_host_, fwd_->flags(), rows * sizeof(int), cudaMemcpyDeviceToHost,
                            stream_),
            "copy sample flags");
    }
    check(cudaEventRecord(done_, stream_), "cudaEventRecord");
  } catch (...) {
    // No step is pending now, so the next launch writes the pinned buffers
    // at once: the copies queued from them must be over first.
    cudaStreamSynchronize(stream_);
    throw;
  }
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
  r.logprobs.assign(p.items.size(), std::nullopt);
  const size_t vocab = size_t(config().vocab_size);
  const std::vector<int>& row_item = p.packed.row_item;
  if (keep_logits_) {
    last_logits_.resize(row_item.size() * vocab);
    check(cudaMemcpy(last_logits_.data(), fwd_->logits(), last_logits_.size() * sizeof(float),
                     cudaMemcpyDeviceToHost),
          "copy logits");
  }
  std::vector<float> row;
  auto copy_row = [&](size_t k) {
    row.resize(vocab);
    check(cudaMemcpy(row.data(), fwd_->logits() + k * vocab, vocab * sizeof(float),
                     cudaMemcpyDeviceToHost),
          "copy logits row");
  };
  try {
    for (size_t k = 0; k < row_item.size(); ++k) {
      int id = ids_host_[k];
      const StepItem& item = p.items[size_t(row_item[k])];
      const bool wants_logprobs = p.params[k].logprobs >= 0;
      // Penalties, bias and min_tokens change the row on the host, where the
      // sequence's tokens are counted; min_p is drawn there too.
      const bool on_host =
          flags_host_[k] || item.sampling.adjusts_logits() || item.sampling.min_p > 0;
      if (on_host || wants_logprobs) copy_row(k);
      if (on_host) {
        // Too close to call on the device, or adjusted: the CPU sampler
        // decides, from the same logits and the generator as it was before
        // this row's draw.
        Sampler s(p.params[k]);
        s.set_rng(p.rng_before[k]);
        id = s.sample(penalties_.adjust(item, row));
        penalties_.record(item.seq, id);
      }
      if (wants_logprobs)
        r.logprobs[size_t(row_item[k])] = token_logprobs(row, id, p.params[k].logprobs);
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
  last_logprobs_ = std::move(node.mapped().logprobs);
  return std::move(node.mapped().ids);
}

EngineStats CudaEngine::stats() const {
  EngineStats s;
  s.steps = steps_;
  s.wall_s = busy_s_;
  s.stages = {StageStats{busy_s_, 0, 0}};
  s.weight_bytes = {fwd_->weight_bytes()};
  s.streamed_bytes = {fwd_->streamed_bytes()};
  return s;
}

}  // namespace

std::unique_ptr<StepEngine> make_cuda_engine(const Checkpoint& checkpoint, DType dtype,
                                             CudaEngineOptions options) {
  check_options(options);
  return std::make_unique<CudaEngine>(checkpoint, dtype, options);
}

}  // namespace troupe
