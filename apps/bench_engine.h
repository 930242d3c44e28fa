#pragma once
// Engine-mode benchmark: the batched forward pass alone, no actors or HTTP.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deploy/engine_builder.h"
#include "gpu/model.h"
#include "scheduler/sim/step_profile.h"

namespace troupe::app {

struct EngineBenchOptions {
  // The replica's engine as the config describes it (layout, threads per
  // device, memory caps); the bench sizes its KV cache itself.
  EngineSpec engine;
  std::vector<int> batches{1, 8, 32};
  int prompt_len = 256;
  // Tokens each decoding sequence holds before its timed steps (prefilled,
  // untimed): what attention reads per step grows with it.
  int context = 16;
  int decode_tokens = 32;
  int repeats = 3;
  int microbatches = 0;  // per step; 0: one per stage (one per step with groups)
  // Pipelines: groups of sequences whose steps are in flight at once (each
  // group's next step starts as soon as its last one is sampled); 0: one per
  // stage. 1: whole-batch steps, cut into micro-batches.
  int groups = 0;
};

struct DecodePoint {
  int batch = 0;
  double tokens_per_s = 0;
  double bound_fraction = 0;            // steps/s over the bandwidth bound's steps/s
  std::vector<double> bubble_fraction;  // per stage (layouts only)
  double comm_share = 0;                // time in collectives / busy time
  uint64_t comm_bytes = 0;
};

struct EngineBenchResult {
  std::string model;
  std::string dtype;
  std::string products = "exact";  // model.quantized_products (block-quantized weights)
  std::string kv_dtype = "f32";    // the KV cache's elements
  std::string isa;
  std::string device = "cpu";  // the devices' kind
  int threads = 0;             // per device
  int pipeline = 1, tensor = 1;
  int groups = 1;  // sequence groups in flight (pipelines)
  int microbatches = 0;
  std::vector<size_t> weight_bytes_per_device;
  std::vector<std::pair<int, int>> stage_layers;  // [begin, end) per stage (pipelines)
  std::vector<double> layer_cost_s;               // measured per layer, what they came from
  double bandwidth_gbs = 0;                       // STREAM-like copy, non-temporal stores
  double read_bandwidth_gbs = 0;                  // streaming read only
  size_t weight_bytes_per_step = 0;
  double bound_steps_per_s = 0;  // bandwidth / bytes per step
  // The host's last-level cache (0: unknown). Weights that fit in it need
  // not come from memory each step, so decode can run past the bound.
  size_t last_level_cache_bytes = 0;
  int prompt_len = 0;
  int context = 0;  // decode's starting context
  double prefill_tokens_per_s = 0;
  std::vector<DecodePoint> decode;
  size_t kv_bytes_per_token = 0;
  size_t peak_rss_bytes = 0;

  nlohmann::json to_json() const;
  std::string table() const;
  std::string products_note() const;
};

// Measures memory bandwidth with `threads` threads over `bytes` per array.
void measure_bandwidth(int threads, size_t bytes, double& copy_gbs, double& read_gbs);

EngineBenchResult run_engine_bench(std::shared_ptr<const Checkpoint> ckpt, DType dtype,
                                   const std::string& model_name, const EngineBenchOptions& opts);

size_t peak_rss_bytes();

// The step-time grid behind the simulator's cost model (troupe bench
// --profile): whole engine steps of `decode` sequences at each context
// length plus `prefill` prompt tokens, on the replica layout `engine`
// describes; the median of `repeats` after a warm-up, per pipeline stage.
struct StepProfileOptions {
  EngineSpec engine;
  std::vector<int> batch{0, 1, 2, 4, 8, 16, 32};
  std::vector<int> context;  // empty: 16, 1/8, 1/2 and all of the model's context
  std::vector<int> prefill{0, 32, 128, 512};
  int repeats = 3;
};

// Throws std::invalid_argument for grid values the model cannot hold.
sim::ProfileGrid measure_step_profile(std::shared_ptr<const Checkpoint> ckpt, DType dtype,
                                      const StepProfileOptions& opts);

// The model's part of a profile file.
// The model as a step profile records it, its KV bytes per token those of a
// cache of `kv_dtype` elements.
sim::ProfileModel profile_model(const ModelConfig& c, const std::string& name, DType kv_dtype);

// /proc/cpuinfo's model name ("" when unknown).
std::string cpu_model_name();

}  // namespace troupe::app
