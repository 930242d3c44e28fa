#pragma once
// The requests of a chaos run, drawn from the plan's seed: a pool of
// distinct requests (prompt, length, greedy or seeded sampling) whose
// fault-free outputs are computed once, and the run's requests drawn from
// the pool, each streamed or not and some cancelled by the client on purpose.
#include <cstdint>
#include <string>
#include <vector>

#include "chaos/plan.h"

namespace troupe::chaos {

struct DistinctRequest {
  std::string prompt;
  int max_tokens = 16;
  double temperature = 0;  // 0: greedy
  uint64_t seed = 0;
};

struct RequestSpec {
  size_t index = 0;     // in the run
  size_t distinct = 0;  // in the pool: its expected output
  bool stream = false;
  int cancel_after = -1;  // >= 0: the client goes away after this many tokens
};

struct Workload {
  std::vector<DistinctRequest> pool;
  std::vector<RequestSpec> requests;
};

Workload make_workload(const WorkloadPlan& plan, uint64_t seed);

// The /v1/completions body (token ids returned, so that outputs compare
// exactly).
std::string request_body(const DistinctRequest& r, bool stream, const std::string& model);

}  // namespace troupe::chaos
