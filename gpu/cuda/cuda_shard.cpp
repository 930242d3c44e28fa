// CUDA devices as the shards of a ParallelEngine (make_cuda_parallel_engine
// in cuda_engine.h). A shard runs its micro-batch eagerly on its own stream
// and returns once its output is in host memory, as the engine expects of
// every shard: the next stage's activations, or its logits slice for the
// host's samplers. Between, a tensor-parallel shard all-reduces its output
// and down projections twice per layer, on the device over NCCL when its
// group's ranks are on distinct GPUs, else staged through pinned host memory.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "gpu/comm/in_process_communicator.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_forward.h"
#include "gpu/cuda/nccl_communicator.h"
#include "gpu/shard.h"

namespace troupe {

namespace {

using namespace cu;

class CudaShard final : public Shard {
 public:
  CudaShard(const Checkpoint& ckpt, DType dtype, const ShardSpec& spec, const CudaEngineOptions& o)
      : fwd_(ckpt, dtype, shard_dims(ckpt.config, spec), o) {
    const StepLayout& layout = fwd_.layout();
    try {
      meta_host_ = pinned<std::byte>(layout.bytes, "pinned step metadata");
      exchange_host_ = pinned<float>(size_t(layout.capacity.tokens) * size_t(fwd_.model().dim),
                                     "pinned all-reduce buffer");
      if (dims().last)
        logits_host_ =
            pinned<float>(size_t(layout.capacity.items) * size_t(dims().vocab), "pinned logits");
    } catch (...) {
      free_host();
      throw;
    }
  }
  ~CudaShard() override { free_host(); }

  const ShardDims& dims() const override { return fwd_.dims(); }
  size_t weight_bytes() const override { return fwd_.weight_bytes(); }
  size_t streamed_bytes() const override { return fwd_.streamed_bytes(); }
  void forward(std::span<const StepItem> items, const ShardIo& io) override;

 private:
  void all_reduce(Communicator& tp, float* data, size_t n);
  void free_host() {
    if (cudaSetDevice(fwd_.options().device) != cudaSuccess) return;
    // A forward that threw may have left copies from these buffers queued.
    cudaStreamSynchronize(fwd_.stream());
    if (meta_host_) cudaFreeHost(meta_host_), meta_host_ = nullptr;
    if (exchange_host_) cudaFreeHost(exchange_host_), exchange_host_ = nullptr;
    if (logits_host_) cudaFreeHost(logits_host_), logits_host_ = nullptr;
  }

  DeviceForward fwd_;
  std::byte* meta_host_ = nullptr;
  float* exchange_host_ = nullptr;  // [tokens, dim]: an all-reduce through the host
  float* logits_host_ = nullptr;    // [rows, vocab slice], last stage only
};

void CudaShard::forward(std::span<const StepItem> items, const ShardIo& io) {
  fwd_.use_device();
  const ModelConfig& m = fwd_.model();
  const CudaEngineOptions& o = fwd_.options();
  const StepLayout& layout = fwd_.layout();
  validate_step(items, m, o.block_tokens, o.blocks, layout.capacity);
  // The engine samples on the host from the logits; the device's sampling
  // fields are left greedy and unused.
  const size_t sampled = size_t(
      std::count_if(items.begin(), items.end(), [](const StepItem& it) { return it.sample; }));
  const std::vector<RowSampling> rows(sampled);
  const PackedStep pk = pack_step(items, rows, o.block_tokens, layout, 0,
                                  std::span<std::byte>(meta_host_, layout.bytes));
  const cudaStream_t stream = fwd_.stream();
  check(cudaMemcpyAsync(fwd_.metadata(), meta_host_, layout.bytes, cudaMemcpyHostToDevice, stream),
        "copy step metadata");
  const size_t residual_bytes = size_t(pk.tokens) * size_t(m.dim) * sizeof(float);
  if (!dims().first)
    check(cudaMemcpyAsync(fwd_.x(), io.x_in, residual_bytes, cudaMemcpyHostToDevice, stream),
          "copy the previous stage's activations");
  DeviceReduce reduce;
  if (io.tp) reduce = [this, &io](float* data, size_t n) { all_reduce(*io.tp, data, n); };
  fwd_.forward(fwd_.eager_shape(pk), false, reduce);
  if (!dims().last) {
    check(cudaMemcpyAsync(io.x_out, fwd_.x(), residual_bytes, cudaMemcpyDeviceToHost, stream),
          "copy the activations for the next stage");
    check(cudaStreamSynchronize(stream), "shard step");
    return;
  }
  const size_t vocab = size_t(dims().vocab), stride = size_t(dims().vocab_stride);
  const std::vector<int>& row_item = pk.row_item;
  if (!row_item.empty())
    check(cudaMemcpyAsync(logits_host_, fwd_.logits(), row_item.size() * vocab * sizeof(float),
                          cudaMemcpyDeviceToHost, stream),
          "copy logits");
  check(cudaStreamSynchronize(stream), "shard step");
  for (size_t k = 0; k < row_item.size(); ++k)
    std::copy_n(logits_host_ + k * vocab, vocab, io.logits + size_t(row_item[k]) * stride);
}

void CudaShard::all_reduce(Communicator& tp, float* data, size_t n) {
  const cudaStream_t stream = fwd_.stream();
  if (tp.device_pointers()) {
    // NCCL queues on its own stream: the projection must be done first.
    check(cudaStreamSynchronize(stream), "shard step before an all-reduce");
    tp.all_reduce_sum(data, n);
    return;
  }
  check(cudaMemcpyAsync(exchange_host_, data, n * sizeof(float), cudaMemcpyDeviceToHost, stream),
        "copy partial sums to the host");
  check(cudaStreamSynchronize(stream), "shard step before an all-reduce");
  tp.all_reduce_sum(exchange_host_, n);
  // exchange_host_ is next written after the next synchronisation, by
  // which time this copy is done.
  check(cudaMemcpyAsync(data, exchange_host_, n * sizeof(float), cudaMemcpyHostToDevice, stream),
        "copy summed partials to the device");
}

// NCCL ranks of one group join together: each constructor waits for the
// others.
std::vector<std::unique_ptr<Communicator>> nccl_group(const std::vector<int>& gpus,
                                                      size_t reserve_floats) {
  const NcclUniqueId id = make_nccl_unique_id();
  NcclOptions options;
  options.reserve_floats = reserve_floats;
  const int n = int(gpus.size());
  std::vector<int> ranks(gpus.size());
  for (int r = 0; r < n; ++r) ranks[size_t(r)] = r;
  return join_at_once(ranks, [&](int r) -> std::unique_ptr<Communicator> {
    return std::make_unique<NcclCommunicator>(id, r, n, gpus[size_t(r)], options);
  });
}

// Whether stage `stage`'s tensor group can all-reduce over NCCL: its ranks
// on distinct GPUs (NCCL refuses two ranks on one: "Duplicate GPU
// detected"), none of which holds a rank of another stage's group. Two
// groups on the same GPUs would run their collectives from different
// threads in no fixed order, which NCCL may deadlock on.
bool nccl_fits(const std::vector<int>& cuda_devices, int tensor, int stage) {
  if (tensor < 2) return false;
  const auto first = cuda_devices.begin() + stage * tensor;
  const std::set<int> mine(first, first + tensor);
  if (int(mine.size()) != tensor) return false;
  for (int s = 0; s < int(cuda_devices.size()) / tensor; ++s) {
    if (s == stage) continue;
    for (int t = 0; t < tensor; ++t)
      if (mine.count(cuda_devices[size_t(s * tensor + t)])) return false;
  }
  return true;
}

// reserve_floats: the largest all-reduce of a step (tokens x model width).
LocalGroupFactory cuda_local_groups(std::vector<int> cuda_devices, int tensor,
                                    size_t reserve_floats) {
  return [cuda_devices = std::move(cuda_devices), tensor, reserve_floats](int stage, int ranks) {
    std::vector<int> gpus;
    for (int t = 0; t < ranks; ++t) gpus.push_back(cuda_devices.at(size_t(stage * tensor + t)));
    if (ranks == tensor && nccl_fits(cuda_devices, tensor, stage)) {
      try {
        return nccl_group(gpus, reserve_floats);
      } catch (const std::exception& e) {
        spdlog::warn(
            "stage {}: no NCCL group over its GPUs ({}); its all-reduces go through host "
            "memory",
            stage, e.what());
      }
    }
    return make_in_process_communicators(ranks);
  };
}

}  // namespace

std::unique_ptr<StepEngine> make_cuda_parallel_engine(const Checkpoint& ckpt, DType dtype,
                                                      ParallelEngineOptions layout,
                                                      std::vector<int> cuda_devices,
                                                      CudaEngineOptions options,
                                                      DeviceLauncher launcher) {
  check_options(options);
  const int devices = layout.pipeline * layout.tensor;
  if (cuda_devices.size() == 1) cuda_devices.assign(size_t(std::max(1, devices)), cuda_devices[0]);
  if (int(cuda_devices.size()) != devices)
    throw std::invalid_argument("a layout of " + std::to_string(devices) + " devices was given " +
                                std::to_string(cuda_devices.size()) + " CUDA device indices");
  std::string why;
  if (!cuda_device_available(&why)) throw std::runtime_error(why);
  layout.block_tokens = options.block_tokens;
  layout.blocks = options.blocks;
  layout.shards = [&ckpt, dtype, cuda_devices, options](const ShardSpec& spec, int device) {
    CudaEngineOptions o = options;
    o.device = cuda_devices.at(size_t(device));
    return std::unique_ptr<Shard>(std::make_unique<CudaShard>(ckpt, dtype, spec, o));
  };
  layout.local_group =
      cuda_local_groups(cuda_devices, layout.tensor,
                        size_t(std::max(1, options.max_batch_tokens)) * size_t(ckpt.config.dim));
  return std::make_unique<ParallelEngine>(ckpt, dtype, std::move(layout), std::move(launcher));
}

}  // namespace troupe
