#pragma once
// One place that turns the configuration into engines: `troupe serve`,
// `generate` and `bench` all describe a replica's engine as an EngineSpec
// (from the config, plus their own flags) and build it here, so that a
// layout means the same thing in every command.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "deploy/config.h"
#include "gpu/checkpoint.h"
#include "gpu/device_queue.h"
#include "gpu/engine.h"
#include "gpu/layer_profile.h"
#include "gpu/parallel_engine.h"

namespace troupe {

// One replica's engine.
struct EngineSpec {
  int pipeline = 1;
  int tensor = 1;
  std::vector<int> threads{1};        // per device of the replica (stage-major), or one for all
  std::vector<int64_t> memory_bytes;  // per device, as threads; 0 or empty: no cap
  int block_tokens = 16;
  int blocks = 4096;            // KV blocks per device
  DType kv_dtype = DType::F32;  // a CPU device's KV cache elements
  // [begin, end) layers per stage; empty with pipeline > 1: balanced by
  // resolve() on measured per-layer decode times within the memory caps.
  std::vector<std::pair<int, int>> stage_layers;
  int microbatches = 0;  // pipelines: per step (0: one per stage)
  int credits = 2;       // pipelines: micro-batches a stage may run ahead
  // A replica spanning processes: which devices run here, and how this
  // part reaches the others (gpu/parallel_engine.h). Empty: all here.
  ProcessPlacement placement;
  // What the replica's devices are: all CPU or all CUDA (`auto` is settled
  // by resolve()), and for CUDA each device's index (stage-major; -1 where
  // the device runs in another process).
  DeviceKind kind = DeviceKind::Cpu;
  std::vector<int> cuda_devices{0};
  // The largest step the replica takes (a CUDA engine sizes its pool by it).
  int max_batch_tokens = 2048;
  int max_batch_sequences = 32;
  CudaSection cuda;  // a CUDA engine's modes

  int devices() const { return pipeline * tensor; }
  int threads_of(int device) const;
  int64_t memory_of(int device) const;
};

// Replica `replica` of the config: its devices' threads and memory caps, the
// KV cache (kv_cache.blocks, or kv_cache.bytes over the model's KV size).
EngineSpec engine_spec(const Config& config, const ModelConfig& model, int replica);

// What a stage may hold: a cap per stage (bytes of weights and KV cache;
// max for none) and the KV bytes each layer adds. Empty caps: no limit.
struct StageMemory {
  uint64_t kv_bytes_per_layer = 0;
  std::vector<uint64_t> stage_cap_bytes;
};
// A stage's cap from its shards' caps: T times the smallest (0 is no cap).
StageMemory stage_memory(const ModelConfig& model, const EngineSpec& spec);

// Contiguous layer ranges for `stages` pipeline stages, balanced by the
// partitioner on measured per-layer decode times within the memory caps;
// logs the ranges and their costs. Empty for one stage. Throws
// std::invalid_argument when no split fits the caps.
std::vector<std::pair<int, int>> balanced_stages(const LayerProfile& profile, int stages,
                                                 const StageMemory& memory = {});

// Builds a replica's engine on the thread that will use it; a multi-device
// engine starts its devices' runners with the launcher (empty: threads).
using EngineFactory = std::function<std::unique_ptr<StepEngine>(const DeviceLauncher& launcher)>;

class EngineBuilder : public std::enable_shared_from_this<EngineBuilder> {
 public:
  EngineBuilder(std::shared_ptr<const Checkpoint> checkpoint, DType dtype);
  // Whether this build serves on CUDA and a device answers; `why` gets the
  // device found or the reason there is none.
  static bool cuda_available(std::string* why = nullptr);
  // CUDA devices that answer (0 without the CUDA engine in this build).
  static int cuda_devices();

  const ModelConfig& model() const { return checkpoint_->config; }
  // The model's identity across processes (deploy/fingerprint.h: model_identity).
  const std::string& fingerprint();
  // Checks the layout against the model (std::invalid_argument naming the
  // problem) and fills in what the spec leaves open: a pipeline's stages
  // from measured layer times (measured once per thread count; CUDA layouts
  // split layers evenly), and `auto` devices: CUDA when a device answers,
  // else CPU. A CUDA spec needs a device that answers (std::runtime_error
  // saying why not). Logs.
  EngineSpec resolve(EngineSpec spec);
  // The measured per-layer times resolve() used, if it measured any.
  const LayerProfile* profile() const;
  // Builds a resolved spec. One-device engines share one copy of the
  // weights, packed by the first build (resolve never packs); a layout
  // packs each device's slice. Thread-safe.
  std::unique_ptr<StepEngine> build(const EngineSpec& spec, const DeviceLauncher& launcher = {});
  // Whether the one-device engines' shared weights are packed yet.
  bool whole_model_packed();
  // resolve() now, build() later on the worker's thread; the factory keeps
  // the builder alive (so make it with std::make_shared).
  EngineFactory factory(EngineSpec spec);
  // The model's tokens as text, given to every engine built from now on
  // (structured output); the source is shared, so it should build its
  // vocabulary once for all of them.
  void set_vocabulary(VocabularySource source);

 private:
  std::shared_ptr<const Model> whole_model();
  std::unique_ptr<StepEngine> build_engine(const EngineSpec& spec, const DeviceLauncher& launcher);

  std::shared_ptr<const Checkpoint> checkpoint_;
  DType dtype_;
  std::mutex mu_;
  VocabularySource vocabulary_;  // under mu_
  // Apart from mu_: packing takes seconds, which fingerprint() and the
  // stage profiles need not wait for.
  std::mutex whole_mu_;
  std::shared_ptr<const Model> whole_;
  std::map<int, LayerProfile> profiles_;  // by threads
  std::string fingerprint_;
  const LayerProfile* last_profile_ = nullptr;
};

}  // namespace troupe
