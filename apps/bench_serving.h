#pragma once
// Serving-mode benchmark: a load generator against an OpenAI-compatible
// /v1/completions endpoint (ours or anyone's), so that serving figures and
// engine figures come from the same command.
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "util/rng.h"

namespace troupe::app::serving_bench {

using Clock = std::chrono::steady_clock;

// ---- URL ----

struct HttpUrl {
  std::string host;       // without brackets for IPv6 literals
  std::string port;       // "80" when the URL names none
  std::string base_path;  // "" or "/prefix" (never a trailing '/')
  // host:port as the Host header wants it (brackets back on IPv6).
  std::string authority() const;
};

// Accepts http://HOST[:PORT][/PATH]. Throws std::invalid_argument saying what
// is wrong; https is refused rather than silently spoken in plain text.
HttpUrl parse_http_url(const std::string& url, const std::string& flag = "--url");

// The OpenAI API root ("/v1", "/prefix/v1"): a URL may name the server or
// already end in /v1, as OpenAI clients' base URLs do.
std::string api_root(const HttpUrl& u);

// ---- statistics ----

// Nearest-rank percentile of ascending `sorted`: the smallest sample with at
// least p% of the samples at or below it. p in (0, 100]; throws
// std::invalid_argument on an empty input or a p outside that range.
double percentile_nearest_rank(const std::vector<double>& sorted, double p);

struct Distribution {
  size_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;  // meaningful only when count > 0
  // {p50, p90, p99, mean, count}; the statistics are null without samples,
  // because a 0 would read as "instant".
  nlohmann::json to_json() const;
};
Distribution summarize(std::vector<double> samples);

// ---- arrivals ----

// The project's portable generator (util/rng.h): a seed replays the same
// arrival schedule on any standard library.
using troupe::Xoshiro256;

// Inter-arrival gaps of a Poisson process with `rate` arrivals per second.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate_per_s, uint64_t seed);
  double next_gap_s();  // exponential with mean 1/rate, always > 0

 private:
  double rate_;
  Xoshiro256 rng_;
};

// ---- the benchmark ----

struct ServingBenchOptions {
  std::string url;
  int concurrency = 0;  // > 0: closed loop
  double rate = 0;      // > 0: open loop, requests per second
  int requests = 100;
  int max_inflight = 1024;
  int prompt_len = 256;
  // Tokens every prompt starts with, before its own prompt_len (vLLM's
  // benchmark's random prefix): what a prefix cache can reuse.
  int prefix_len = 0;
  int output_len = 128;
  // false: plain JSON responses, measured by latency only (no TTFT or TPOT).
  bool stream = true;
  int vocab = 2000;  // used when GET /v1/models does not say
  double timeout_s = 300;
  uint64_t seed = 0;
  std::string model;    // the request's "model"; default: the first of /v1/models
  std::string api_key;  // sent as "Authorization: Bearer <api_key>" when not empty
};

// Throws std::invalid_argument naming the offending option.
void validate(const ServingBenchOptions& o);

// Token ids for request `index`: prompt_len ids in [3, vocab), varied per
// request so that no two prompts share a prefix a cache could reuse.
std::vector<int> prompt_ids(int prompt_len, int vocab, uint64_t seed, int index);
// Request `index`'s whole prompt: the shared prefix_len ids, then its own.
std::vector<int> request_prompt(const ServingBenchOptions& o, int vocab, int index);

struct RequestResult {
  bool ok = false;
  std::string error;   // "" when ok; else an HTTP status ("429") or a transport word
  std::string detail;  // why, in the server's or the OS's words (for the report)
  int status = 0;      // HTTP status, 0 when none arrived
  double ttft_s = -1;  // < 0 when no token arrived
  double tpot_s = -1;  // < 0 with fewer than two output tokens
  double latency_s = 0;
  int output_tokens = 0;
  int cached_tokens = 0;  // of its prompt, found in the server's prefix cache (its usage)
};

struct ServingBenchResult {
  ServingBenchOptions options;
  std::string model;         // what was sent as "model" ("" = none)
  int vocab = 0;             // the vocabulary the prompts were drawn from
  std::string vocab_source;  // "server" or "option"
  int max_model_len = 0;     // the server's context from /v1/models; 0 = not said
  int completed = 0;
  std::map<std::string, int> errors;
  std::map<std::string, std::string> error_examples;  // one detail per error kind
  double duration_s = 0;
  long long output_tokens = 0;
  long long prompt_tokens = 0, cached_tokens = 0;  // of the completed requests
  int delayed_arrivals = 0;  // open loop: arrivals held back by --max-inflight
  Distribution ttft_s, tpot_s, latency_s;
  std::vector<RequestResult> requests;  // by request index

  double requests_per_s() const { return duration_s > 0 ? completed / duration_s : 0; }
  double output_tokens_per_s() const {
    return duration_s > 0 ? double(output_tokens) / duration_s : 0;
  }
  nlohmann::json to_json() const;
  std::string table() const;
};

// Runs the load. Throws std::invalid_argument for bad options (including a
// prompt plus output longer than the context the server advertises) and
// std::runtime_error when the server cannot be reached at all.
ServingBenchResult run_serving_bench(const ServingBenchOptions& opts);

}  // namespace troupe::app::serving_bench
