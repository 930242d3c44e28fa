#pragma once
// `troupe chaos`'s run: start (or attach to) a deployment, compute every
// request's fault-free output, run the load while the plan's faults play,
// confirm each fault by an effect observed, and collect what the checker
// (chaos/checker.h) judges.
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "chaos/plan.h"
#include "chaos/records.h"

namespace troupe {
struct LinkCounters;
}

namespace troupe::chaos {

struct ChaosOptions {
  ChaosPlan plan;
  std::filesystem::path exe;      // the troupe binary that runs the deployment's processes
  std::filesystem::path run_dir;  // logs
  // "http://host:port" of a running deployment (with admin.faults on):
  // then only runtime and HTTP faults can be injected.
  std::string attach;
  std::string admin_token;     // attach: its admin.token
  std::string api_key;         // the server's API key, if it needs one
  double duration_s = 0;       // > 0: load for this long (requests repeat), not a request count
  double sample_every_s = 30;  // resources of every process, this often
  std::function<void(const std::string&)> log;  // progress lines
};

struct ChaosRun {
  RunRecords records;
  // (time, every process) every sample_every_s: a soak's memory drift.
  std::vector<std::pair<double, std::vector<ResourceSample>>> resource_series;
  int client_cancels = 0;  // streams the client went away from on purpose
  int server_cancels = 0;  // the coordinator's 499s over the same time
};

// Throws std::runtime_error when the deployment does not come up or the
// fault-free pass fails (then there is nothing to compare with).
ChaosRun run_chaos(const ChaosOptions& options);

// What a link fault did between two readings of its proxy's counters, as a
// number and its unit in words (`what`: "messages dropped", "ms cut (to
// coordinator 2004 ms, to node 2004 ms)"); 0: no effect. A cut is the wall
// time it lasted, whatever the directions.
uint64_t link_effect(const FaultPlan& fault, const LinkCounters& now, const LinkCounters& before,
                     std::string* what);

}  // namespace troupe::chaos
