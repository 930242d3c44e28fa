#pragma once
// Measured step times (written by `troupe bench --profile`, read by `troupe
// simulate`): for each replica layout, the seconds one engine step takes over
// a grid of (decode sequences, their context length, prompt tokens prefilled
// in the same step), per pipeline stage. The simulator's cost model is an
// interpolation in this table and nothing else: no per-operator guesses, so
// what it predicts is what this machine measured.
//
// File format (JSON, "format": "troupe-step-profile/1"):
//   {"format": ..., "model": {"name", "max_seq_len", "vocab_size",
//    "kv_bytes_per_token", "bos", "eos": [...]}, "dtype", "kv_dtype", "isa", "cpu",
//    "layouts": [{"pipeline", "tensor", "threads", "block_tokens",
//                 "batch": [...], "context": [...], "prefill": [...],
//                 "stage_seconds": [[...], ...],
//                 "overhead_s", "overhead_per_seq_s", "request_overhead_s"}]}
// kv_bytes_per_token is for the KV cache's elements the steps were measured
// with, kv_dtype (f32 where absent).
// The overheads are 0 until `troupe simulate --calibrate` measures them.
// stage_seconds[s] is stage s's time for a whole step (one micro-batch)
// at every grid point, batch-major: index (b * |context| + c) * |prefill| + p.
// A layout without pipeline stages has one entry: the whole step.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::sim {

struct ProfileModel {
  std::string name;
  int max_seq_len = 0;
  int vocab_size = 0;
  long long kv_bytes_per_token = 0;
  int bos = 1;
  std::vector<int> eos;
};

struct ProfileGrid {
  int pipeline = 1;
  int tensor = 1;
  int threads = 1;  // per device
  int block_tokens = 16;
  std::vector<int> batch;    // decode sequences in the step, ascending (0 allowed)
  std::vector<int> context;  // KV length of each decode sequence, ascending
  std::vector<int> prefill;  // prompt tokens in the step, ascending (0 allowed)
  std::vector<std::vector<double>> stage_seconds;  // [stage][grid point]
  // What serving adds per step beyond the engine (messages between the
  // actors, competition for the cores): overhead_s + overhead_per_seq_s * n
  // for a step of n sequences.
  double overhead_s = 0;
  double overhead_per_seq_s = 0;
  // Seconds from a client's request to the runtime seeing it (HTTP and the
  // front end), which TTFT includes.
  double request_overhead_s = 0;

  int stages() const { return int(stage_seconds.size()); }
  size_t points() const { return batch.size() * context.size() * prefill.size(); }
  size_t at(size_t b, size_t c, size_t p) const {
    return (b * context.size() + c) * prefill.size() + p;
  }
  // "PxT, N threads", for messages.
  std::string describe() const;
  // Throws std::invalid_argument naming what is inconsistent.
  void validate() const;
};

struct StepProfile {
  ProfileModel model;
  std::string dtype;
  std::string isa;
  std::string cpu;
  std::vector<ProfileGrid> layouts;
  std::string kv_dtype = "f32";  // the KV cache the steps were measured with

  nlohmann::json to_json() const;
  // Throws std::invalid_argument naming `source` and the bad field.
  static StepProfile from_json(const nlohmann::json& j, const std::string& source);
  static StepProfile load(const std::filesystem::path& file);
  void save(const std::filesystem::path& file) const;

  // The layout's grid; among several thread counts the closest to `threads`.
  // Throws std::invalid_argument listing the layouts the profile has.
  const ProfileGrid& find(int pipeline, int tensor, int threads) const;
  // Adds or replaces the grid of the same layout and threads.
  void put(ProfileGrid grid);
};

// What a step (or one micro-batch of it) holds, as the cost model sees it.
struct StepShape {
  int decode = 0;      // sequences feeding one token after their cached context
  double context = 0;  // mean KV length of those sequences
  int prefill = 0;     // tokens of prompt chunks (new or resumed sequences)
  int tokens() const { return decode + prefill; }
};

// Step time by interpolation in one layout's grid: linear in each axis
// between measured points, continued linearly past the last two points
// (decode and prefill costs grow about linearly there), never below zero.
class StepCostModel {
 public:
  explicit StepCostModel(ProfileGrid grid);
  int stages() const { return grid_.stages(); }
  double stage_s(int stage, const StepShape& shape) const;
  // A step on all stages, one after the other (no overlap), without the
  // serving overhead.
  double step_s(const StepShape& shape) const;
  // The serving runtime's own time per step of `sequences` sequences.
  double overhead_s(int sequences) const {
    return grid_.overhead_s + grid_.overhead_per_seq_s * sequences;
  }
  double request_overhead_s() const { return grid_.request_overhead_s; }
  const ProfileGrid& grid() const { return grid_; }

 private:
  ProfileGrid grid_;
};

}  // namespace troupe::sim
