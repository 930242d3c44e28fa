#pragma once
// What the simulator is asked to serve: requests arriving over time, read one
// at a time so that a trace of millions of rows costs the memory of one.
// Sources: the Azure LLM inference trace (CSV TIMESTAMP,ContextTokens,
// GeneratedTokens), Mooncake-style JSONL (timestamp in ms, input_length,
// output_length), synthetic open-loop arrivals (constant, Poisson, bursty
// gamma) with length distributions, and closed-loop clients.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/rng.h"

namespace troupe::sim {

struct Arrival {
  double time_s = 0;
  int prompt_tokens = 1;
  int output_tokens = 1;
  int priority = 0;
  double cancel_after_s = -1;  // >= 0: the client goes away this long after arriving
  int client = -1;             // closed loop: who sent it (and sends the next)
  // The first prefix_tokens of the prompt are those of every request of
  // its prefix group (SharedPrefixWorkload); the rest are its own.
  int prefix_group = -1;
  int prefix_tokens = 0;
  // Then, block by block of block_id_tokens, tokens named by an id: two
  // prompts hold the same tokens where they have the same ids in the same
  // places (a Mooncake trace's hash_ids, blocks of 512 tokens).
  std::vector<uint64_t> block_ids{};
  int block_id_tokens = 0;
};

class Workload {
 public:
  virtual ~Workload() = default;
  // The next arrival known now, in time order; nullopt when none is (a
  // closed loop then waits for its requests to end).
  virtual std::optional<Arrival> next() = 0;
  // A request of `client` ended at `now_s`: a closed loop answers with that
  // client's next request.
  virtual std::optional<Arrival> on_end(int /*client*/, double /*now_s*/) { return std::nullopt; }
};

// A length distribution, from a spec: "N" (fixed), "uniform:A:B",
// "exp:MEAN" (exponential, rounded, at least 1) or "lognormal:MEDIAN:SIGMA".
class LengthDist {
 public:
  // Throws std::invalid_argument quoting the spec.
  static LengthDist parse(const std::string& spec);
  int sample(Xoshiro256& rng) const;
  double mean() const;
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { Fixed, Uniform, Exp, LogNormal } kind_ = Kind::Fixed;
  double a_ = 1, b_ = 1;
  std::string spec_;
};

// Inter-arrival gaps: "constant", "poisson", or "gamma:CV" (CV > 1 is
// burstier than Poisson, CV = 1 is Poisson).
class ArrivalProcess {
 public:
  static ArrivalProcess parse(const std::string& spec, double rate_per_s);
  double next_gap_s(Xoshiro256& rng) const;
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { Constant, Poisson, Gamma } kind_ = Kind::Poisson;
  double rate_ = 1;
  double shape_ = 1;  // gamma
  std::string spec_;
};

// Standard normal, exponential and gamma draws on the project's portable
// generator, so a seed gives the same workload everywhere.
double normal01(Xoshiro256& rng);
double exponential(Xoshiro256& rng, double mean);
double gamma_draw(Xoshiro256& rng, double shape, double scale);

struct SyntheticOptions {
  size_t requests = 1000;
  double rate_per_s = 10;
  std::string process = "poisson";
  std::string prompt = "128";
  std::string output = "128";
  double cancel_fraction = 0;         // share of clients that go away early
  double cancel_after_s = 1;          // mean time until they do (exponential)
  double high_priority_fraction = 0;  // share sent with priority 1
  uint64_t seed = 1;
};

class SyntheticWorkload : public Workload {
 public:
  explicit SyntheticWorkload(SyntheticOptions options);
  std::optional<Arrival> next() override;

 private:
  SyntheticOptions o_;
  LengthDist prompt_, output_;
  ArrivalProcess process_;
  Xoshiro256 rng_;
  size_t sent_ = 0;
  double t_ = 0;
};

// `clients` clients, each sending its next request `think_s` after its
// previous one ended, `requests` in all.
struct ClosedLoopOptions {
  int clients = 8;
  size_t requests = 1000;
  double think_s = 0;
  std::string prompt = "128";
  std::string output = "128";
  uint64_t seed = 1;
};

class ClosedLoopWorkload : public Workload {
 public:
  explicit ClosedLoopWorkload(ClosedLoopOptions options);
  std::optional<Arrival> next() override;
  std::optional<Arrival> on_end(int client, double now_s) override;

 private:
  Arrival make(int client, double at);
  ClosedLoopOptions o_;
  LengthDist prompt_, output_;
  Xoshiro256 rng_;
  size_t sent_ = 0;
  int started_ = 0;
};

// What to do with a trace's rows on the way in.
struct TraceOptions {
  double time_scale = 1;    // arrival times are divided by this (2: twice the rate)
  double length_scale = 1;  // prompt and output lengths are multiplied by this
  // > 0: lengths are cut so that prompt + output fits (prompt first keeps at
  // least one token, output at least one).
  int max_context = 0;
  size_t limit = 0;  // > 0: at most this many rows
};

// Rows cut to fit the model's context, and the tokens the rows asked for
// (after length_scale) against those kept: a trace from a long-context
// service replayed on a small model may keep a small part of its work.
struct TraceCuts {
  int context = 0;  // what rows were cut to fit
  size_t rows = 0, cut = 0;
  double asked_prompt = 0, asked_output = 0;
  double kept_prompt = 0, kept_output = 0;
  // The --length-scale that would make the mean row fit (0: none cut).
  double scale_to_fit() const;
};

enum class TraceFormat { Azure, Mooncake };
// Tokens per hash id in Mooncake's traces.
inline constexpr int kMooncakeBlockTokens = 512;
// By extension: .csv is Azure, .jsonl / .json Mooncake. Throws otherwise.
TraceFormat trace_format_of(const std::filesystem::path& file);

class TraceWorkload : public Workload {
 public:
  // Throws std::invalid_argument naming the file and what is wrong (no such
  // file, missing columns); a bad row later throws naming its line.
  TraceWorkload(const std::filesystem::path& file, TraceOptions options);
  std::optional<Arrival> next() override;
  // What max_context did to the rows read so far.
  const TraceCuts& cuts() const { return cuts_; }

 private:
  std::optional<Arrival> read_row();
  std::filesystem::path file_;
  TraceFormat format_;
  TraceOptions o_;
  std::ifstream in_;
  size_t line_ = 0;
  int col_time_ = -1, col_prompt_ = -1, col_output_ = -1, columns_ = 0;
  std::optional<double> t0_;
  double last_ = 0;
  size_t rows_ = 0;
  TraceCuts cuts_;
  std::vector<uint64_t> block_ids_;  // the row's hash_ids (Mooncake)
};

// Count, span and mean lengths of a trace in one pass (for --rate), over
// its first `limit` rows (0: all), the rows a replay of that many reads.
struct TraceStats {
  size_t rows = 0;
  double span_s = 0;
  double mean_prompt = 0, mean_output = 0;
  double rate_per_s() const { return span_s > 0 ? double(rows - 1) / span_s : 0; }
};
TraceStats trace_stats(const std::filesystem::path& file, size_t limit = 0);

// Seconds since the epoch of an Azure TIMESTAMP ("2023-11-16 18:15:46.6805900"),
// or the number itself when the column holds plain seconds.
double parse_trace_time(const std::string& text);

// Another workload's requests, each with a shared prefix put before its
// prompt: `len` tokens of one of `groups` prefixes (uniformly; the same
// prefix for every request of a group), as troupe bench --prefix-len sends
// and a prefix cache reuses. Throws std::invalid_argument for len < 1 or
// groups < 1.
class SharedPrefixWorkload : public Workload {
 public:
  SharedPrefixWorkload(std::unique_ptr<Workload> inner, int len, int groups, uint64_t seed);
  std::optional<Arrival> next() override;
  std::optional<Arrival> on_end(int client, double now_s) override;
  const Workload& inner() const { return *inner_; }

 private:
  std::optional<Arrival> with_prefix(std::optional<Arrival> a);
  std::unique_ptr<Workload> inner_;
  int len_, groups_;
  Xoshiro256 rng_;
};

// Writes `count` arrivals of `w` as a trace (for samples and other tools).
void write_trace(Workload& w, size_t count, const std::filesystem::path& file);

}  // namespace troupe::sim
