#include "chaos/attribution.h"

namespace troupe::chaos {

int owner_of_node_effect(const std::vector<FaultWindow>& faults, double t,
                         const std::set<std::string>& died) {
  for (const bool by_node : {true, false}) {
    int owner = -1;
    for (size_t i = 0; i < faults.size(); ++i) {
      const FaultWindow& f = faults[i];
      if (!f.on_node || f.injected_s < 0 || f.injected_s > t || t > f.end_s) continue;
      if (by_node && !died.count(f.node)) continue;
      if (owner < 0 || f.injected_s > faults[size_t(owner)].injected_s) owner = int(i);
    }
    if (owner >= 0) return owner;
  }
  return -1;
}

int owner_of_resume(const std::vector<FaultWindow>& faults, double down, double seen_within) {
  int seen = -1, latest = -1;
  for (size_t i = 0; i < faults.size(); ++i) {
    const FaultWindow& f = faults[i];
    if (f.seen_s >= 0 && f.seen_s >= down - 0.01 && f.seen_s <= down + seen_within &&
        (seen < 0 || f.seen_s < faults[size_t(seen)].seen_s))
      seen = int(i);
    if (f.injected_s < 0 || f.injected_s > down + 0.01 || down > f.end_s) continue;
    if (latest < 0 || f.injected_s > faults[size_t(latest)].injected_s) latest = int(i);
  }
  return seen >= 0 ? seen : latest;
}

}  // namespace troupe::chaos
