#include "deploy/engine_builder.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "deploy/fingerprint.h"
#if TROUPE_SERVE_CUDA
#include "gpu/cuda/cuda_engine.h"
#endif
#include "gpu/kv_cache.h"
#include "gpu/layer_profile.h"
#include "scheduler/partitioner.h"

namespace troupe {

int EngineSpec::threads_of(int device) const {
  if (threads.empty()) return 1;
  return threads.size() == 1 ? threads[0] : threads.at(size_t(device));
}

int64_t EngineSpec::memory_of(int device) const {
  if (memory_bytes.empty()) return 0;
  return memory_bytes.size() == 1 ? memory_bytes[0] : memory_bytes.at(size_t(device));
}

EngineSpec engine_spec(const Config& c, const ModelConfig& model, int replica) {
  EngineSpec s;
  s.pipeline = c.parallel.pipeline;
  s.tensor = c.parallel.tensor;
  s.threads.clear();
  s.cuda_devices.clear();
  for (int st = 0; st < s.pipeline; ++st)
    for (int t = 0; t < s.tensor; ++t) {
      const int index = device_index(c.parallel, replica, st, t);
      const DeviceSpec& d = device_spec(c, index);
      s.threads.push_back(d.threads);
      s.memory_bytes.push_back(d.memory_bytes);
      s.cuda_devices.push_back(d.index >= 0 ? d.index : index);
    }
  // One kind per replica: its devices compute together.
  const DeviceSpec& first = device_spec(c, device_index(c.parallel, replica, 0, 0));
  for (int d = 0; d < s.devices(); ++d) {
    const DeviceSpec& other =
        device_spec(c, device_index(c.parallel, replica, d / s.tensor, d % s.tensor));
    if (other.kind != first.kind)
      throw std::invalid_argument("devices: replica " + std::to_string(replica) + " mixes kinds " +
                                  device_kind_name(first.kind) + " and " +
                                  device_kind_name(other.kind) +
                                  "; a replica's devices must be of one kind");
  }
  s.kind = first.kind;
  s.max_batch_tokens = c.batching.max_batch_tokens;
  s.max_batch_sequences = c.batching.max_batch_sequences;
  s.cuda = c.cuda;
  s.block_tokens = c.kv_cache.block_tokens;
  s.kv_dtype = c.kv_cache.dtype;
  s.blocks = c.kv_cache.bytes > 0 ? KvCache::blocks_for_bytes(model, c.kv_cache.block_tokens,
                                                              size_t(c.kv_cache.bytes), s.kv_dtype)
                                  : int(c.kv_cache.blocks);
  return s;
}

StageMemory stage_memory(const ModelConfig& c, const EngineSpec& spec) {
  StageMemory m;
  bool any = false;
  for (int d = 0; d < spec.devices(); ++d) any = any || spec.memory_of(d) > 0;
  if (!any) return m;
  // A layer's KV share on one device: the replica's blocks for that layer.
  m.kv_bytes_per_layer = uint64_t(spec.blocks) * uint64_t(spec.block_tokens) *
                         kv_bytes_per_token(1, c.kv_dim(), spec.kv_dtype);
  for (int s = 0; s < spec.pipeline; ++s) {
    // A stage's T shards split its layers: it holds T times its smallest
    // shard's memory (0 is no cap).
    uint64_t cap = std::numeric_limits<uint64_t>::max();
    for (int t = 0; t < spec.tensor; ++t) {
      const int64_t b = spec.memory_of(s * spec.tensor + t);
      if (b > 0) cap = std::min(cap, uint64_t(b) * uint64_t(spec.tensor));
    }
    m.stage_cap_bytes.push_back(cap);
  }
  return m;
}

std::vector<std::pair<int, int>> balanced_stages(const LayerProfile& profile, int stages,
                                                 const StageMemory& memory) {
  if (stages <= 1) return {};
  PartitionRequest req;
  req.stages = stages;
  req.layer_cost_s = profile.seconds;
  if (!memory.stage_cap_bytes.empty()) {
    for (uint64_t w : profile.weight_bytes)
      req.layer_memory_bytes.push_back(w + memory.kv_bytes_per_layer);
    req.stage_memory_cap_bytes = memory.stage_cap_bytes;
  }
  const StagePartition p = partition_layers(req);
  std::vector<std::pair<int, int>> out;
  std::string text;
  for (int s = 0; s < p.stages(); ++s) {
    out.emplace_back(p.begin(s), p.end(s));
    text += fmt::format("{}[{}, {}) {:.3f} ms", s ? ", " : "", p.begin(s), p.end(s),
                        p.stage_cost_s[size_t(s)] * 1e3);
  }
  spdlog::info("pipeline stages from measured layer times: {}", text);
  return out;
}

namespace {

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
}

// A CPU device's share of the model against its memory cap: its stage's
// layers (the embedding and classifier ride on the first and last) and
// their KV blocks, split over the stage's T shards. Pipeline stages placed
// by the partitioner fit by construction; one device, tensor shards and
// stages given by hand are checked only here.
void check_memory_caps(const ModelConfig& c, DType dtype, const EngineSpec& spec) {
  bool any = false;
  for (int d = 0; d < spec.devices(); ++d) any = any || spec.memory_of(d) > 0;
  if (!any) return;
  const std::vector<uint64_t> layer_bytes = layer_weight_bytes(c, dtype);
  const uint64_t kv_per_layer = uint64_t(spec.blocks) * uint64_t(spec.block_tokens) *
                                kv_bytes_per_token(1, c.kv_dim(), spec.kv_dtype);
  std::vector<std::pair<int, int>> stages = spec.stage_layers;
  if (stages.empty()) {
    const StagePartition even = equal_partition(c.n_layers, spec.pipeline);
    for (int s = 0; s < even.stages(); ++s) stages.emplace_back(even.begin(s), even.end(s));
  }
  const uint64_t T = uint64_t(spec.tensor);
  for (int s = 0; s < int(stages.size()); ++s) {
    uint64_t weights = 0;
    for (int l = stages[size_t(s)].first; l < stages[size_t(s)].second; ++l)
      weights += layer_bytes[size_t(l)];
    const uint64_t kv = kv_per_layer * uint64_t(stages[size_t(s)].second - stages[size_t(s)].first);
    const uint64_t w_share = (weights + T - 1) / T, kv_share = (kv + T - 1) / T;
    for (int t = 0; t < spec.tensor; ++t) {
      const int d = s * spec.tensor + t;
      const int64_t cap = spec.memory_of(d);
      if (cap <= 0 || w_share + kv_share <= uint64_t(cap)) continue;
      throw std::invalid_argument(fmt::format(
          "devices: device {} (stage {}, shard {}) has a memory cap of {}, but its share of the "
          "model needs {} ({} of weights, {} of KV cache for {} blocks of {} tokens); raise its "
          "memory, lower kv_cache.blocks (or kv_cache.bytes), or split the model over more "
          "devices",
          d, s, t, mib(uint64_t(cap)), mib(w_share + kv_share), mib(w_share), mib(kv_share),
          spec.blocks, spec.block_tokens));
    }
  }
}

// A CUDA engine keeps its KV cache in the weights' type; a cache type asked
// for CPU devices (anything but the f32 default) must agree with it.
void check_cuda_kv_dtype(DType kv, DType weights) {
  if (kv == DType::F32 || kv == weights) return;
  throw std::invalid_argument(fmt::format(
      "kv_cache.dtype: {} is for CPU devices; a CUDA replica keeps its KV cache in the weights' "
      "type ({}): remove kv_cache.dtype or set it to {}",
      dtype_name(kv), dtype_name(weights), dtype_name(weights)));
}

ParallelEngineOptions parallel_options(const EngineSpec& spec) {
  ParallelEngineOptions o;
  o.pipeline = spec.pipeline;
  o.tensor = spec.tensor;
  o.threads = spec.threads;
  o.stage_layers = spec.stage_layers;
  o.microbatches = spec.microbatches;
  o.credits = spec.credits;
  o.block_tokens = spec.block_tokens;
  o.blocks = spec.blocks;
  o.kv_dtype = spec.kv_dtype;
  o.placement = spec.placement;
  return o;
}

}  // namespace

bool EngineBuilder::cuda_available(std::string* why) {
#if TROUPE_SERVE_CUDA
  return cuda_device_available(why);
#else
  if (why)
    *why = "this build has no CUDA engine (configure with -DTROUPE_SERVE_CUDA=ON where nvcc is)";
  return false;
#endif
}

int EngineBuilder::cuda_devices() {
#if TROUPE_SERVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

EngineBuilder::EngineBuilder(std::shared_ptr<const Checkpoint> checkpoint, DType dtype)
    : checkpoint_(std::move(checkpoint)), dtype_(dtype) {}

EngineSpec EngineBuilder::resolve(EngineSpec spec) {
  check_layout_fits(model(), spec.pipeline, spec.tensor);
  if (spec.threads.size() > 1 && int(spec.threads.size()) != spec.devices())
    throw std::invalid_argument("give one thread count, or one per device");
  if (spec.kind == DeviceKind::Cuda) check_cuda_kv_dtype(spec.kv_dtype, dtype_);
  if (spec.kind != DeviceKind::Cpu) {
    if (int(spec.cuda_devices.size()) != spec.devices() && spec.cuda_devices.size() != 1)
      throw std::invalid_argument("give one CUDA device index, or one per device");
    std::string why;
    bool gpu = cuda_available(&why);
    // Devices of this process (-1: another's) must exist here.
    const int wanted = *std::max_element(spec.cuda_devices.begin(), spec.cuda_devices.end());
    const int present = gpu ? cuda_devices() : 0;
    if (gpu && wanted >= present) {
      gpu = false;
      why = "the layout needs CUDA device " + std::to_string(wanted) + ", but this machine has " +
            std::to_string(present);
      if (spec.kind == DeviceKind::Cuda) throw std::invalid_argument("devices: kind cuda: " + why);
    }
    if (spec.kind == DeviceKind::Cuda && !gpu)
      throw std::runtime_error("devices: kind cuda, but " + why);
    if (spec.kind == DeviceKind::Auto) {
      spec.kind = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
      spdlog::info("devices: auto is {} ({})", device_kind_name(spec.kind), why);
    }
    // The weights go to the devices in build(); a CUDA layout's layers are
    // uniform work, split evenly unless given.
    if (spec.kind == DeviceKind::Cuda) {
      check_cuda_kv_dtype(spec.kv_dtype, dtype_);
      return spec;
    }
  }
  // Stages the partitioner places are checked once placed (below).
  if (spec.pipeline == 1 || !spec.stage_layers.empty()) check_memory_caps(model(), dtype_, spec);
  // One device: nothing to decide. Its weights are packed by the first
  // build(), on the thread that builds (a worker's): packing a large model
  // takes seconds, which a node agent answering starts and sending
  // heartbeats must not spend.
  if (spec.devices() == 1 && spec.placement.host.empty()) return spec;
  if (spec.pipeline > 1 && spec.stage_layers.empty()) {
    // Stages are balanced on layer times measured once, on a device like
    // the first one; replicas differ only in their memory caps.
    const int threads = spec.threads_of(0);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = profiles_.find(threads);
    if (it == profiles_.end()) {
      LayerProfileOptions po;
      po.threads = threads;
      it = profiles_.emplace(threads, profile_layers(*checkpoint_, dtype_, po)).first;
    }
    last_profile_ = &it->second;
    spec.stage_layers = balanced_stages(it->second, spec.pipeline, stage_memory(model(), spec));
    check_memory_caps(model(), dtype_, spec);
  }
  return spec;
}

const std::string& EngineBuilder::fingerprint() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fingerprint_.empty()) fingerprint_ = model_identity(*checkpoint_, dtype_);
  return fingerprint_;
}

const LayerProfile* EngineBuilder::profile() const {
  return last_profile_;
}

bool EngineBuilder::whole_model_packed() {
  std::lock_guard<std::mutex> lock(whole_mu_);
  return whole_ != nullptr;
}

std::shared_ptr<const Model> EngineBuilder::whole_model() {
  std::lock_guard<std::mutex> lock(whole_mu_);
  if (!whole_) whole_ = std::make_shared<const Model>(*checkpoint_, dtype_);
  return whole_;
}

void EngineBuilder::set_vocabulary(VocabularySource source) {
  std::lock_guard<std::mutex> lock(mu_);
  vocabulary_ = std::move(source);
}

std::unique_ptr<StepEngine> EngineBuilder::build(const EngineSpec& spec,
                                                 const DeviceLauncher& launcher) {
  std::unique_ptr<StepEngine> engine = build_engine(spec, launcher);
  std::lock_guard<std::mutex> lock(mu_);
  if (vocabulary_) engine->set_vocabulary(vocabulary_);
  return engine;
}

std::unique_ptr<StepEngine> EngineBuilder::build_engine(const EngineSpec& spec,
                                                        const DeviceLauncher& launcher) {
  if (spec.kind == DeviceKind::Cuda) {
#if TROUPE_SERVE_CUDA
    CudaEngineOptions o;
    o.device = spec.cuda_devices.at(0);
    o.block_tokens = spec.block_tokens;
    o.blocks = spec.blocks;
    o.max_batch_tokens = spec.max_batch_tokens;
    o.max_batch_sequences = spec.max_batch_sequences;
    o.deterministic = spec.cuda.deterministic;
    o.graphs = spec.cuda.graphs;
    o.reserve_bytes = size_t(spec.cuda.reserve_bytes);
    if (spec.devices() == 1 && spec.placement.host.empty())
      return make_cuda_engine(*checkpoint_, dtype_, o);
    return make_cuda_parallel_engine(*checkpoint_, dtype_, parallel_options(spec),
                                     spec.cuda_devices, o, launcher);
#else
    std::string why;
    cuda_available(&why);
    throw std::runtime_error("devices: kind cuda, but " + why);
#endif
  }
  if (spec.kind == DeviceKind::Auto)
    throw std::logic_error("EngineBuilder::build: resolve() the spec first (kind auto)");
  if (spec.devices() == 1 && spec.placement.host.empty())
    return std::make_unique<Engine>(
        whole_model(),
        EngineOptions{spec.threads_of(0), spec.block_tokens, spec.blocks, spec.kv_dtype});
  return std::make_unique<ParallelEngine>(*checkpoint_, dtype_, parallel_options(spec), launcher);
}

EngineFactory EngineBuilder::factory(EngineSpec spec) {
  const EngineSpec resolved = resolve(std::move(spec));
  return [self = shared_from_this(), resolved](const DeviceLauncher& launcher) {
    return self->build(resolved, launcher);
  };
}

}  // namespace troupe
