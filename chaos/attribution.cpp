#include "chaos/attribution.h"

namespace troupe::chaos {

namespace {

bool holds(const FaultWindow& f, double t) {
  return f.injected_s >= 0 && f.injected_s <= t && t <= f.end_s;
}

// The latest fault in window at `t` that `pick` accepts; -1: none.
template <class Pick>
int latest(const std::vector<FaultWindow>& faults, double t, Pick pick) {
  int owner = -1;
  for (size_t i = 0; i < faults.size(); ++i)
    if (holds(faults[i], t) && pick(faults[i]) &&
        (owner < 0 || faults[i].injected_s > faults[size_t(owner)].injected_s))
      owner = int(i);
  return owner;
}

}  // namespace

std::vector<int> owners_of_node_effect(const std::vector<FaultWindow>& faults, double t,
                                       const std::set<std::string>& died) {
  using Aim = FaultWindow::Aim;
  std::vector<int> owners;
  for (const std::string& node : died)
    if (const int i = latest(
            faults, t, [&](const FaultWindow& f) { return f.aim == Aim::Node && f.node == node; });
        i >= 0)
      owners.push_back(i);
  if (!owners.empty() || !died.empty()) return owners;
  if (latest(faults, t, [](const FaultWindow& f) { return f.aim == Aim::Runtime; }) >= 0)
    return owners;
  if (const int i = latest(faults, t, [](const FaultWindow& f) { return f.aim == Aim::Node; });
      i >= 0)
    owners.push_back(i);
  return owners;
}

int owner_of_resume(const std::vector<FaultWindow>& faults, double down, double seen_within) {
  int seen = -1, last = -1;
  for (size_t i = 0; i < faults.size(); ++i) {
    const FaultWindow& f = faults[i];
    if (f.seen_s >= 0 && f.seen_s >= down - 0.01 && f.seen_s <= down + seen_within &&
        (seen < 0 || f.seen_s < faults[size_t(seen)].seen_s))
      seen = int(i);
    if (f.injected_s < 0 || f.injected_s > down + 0.01 || down > f.end_s) continue;
    if (last < 0 || f.injected_s > faults[size_t(last)].injected_s) last = int(i);
  }
  return seen >= 0 ? seen : last;
}

}  // namespace troupe::chaos
