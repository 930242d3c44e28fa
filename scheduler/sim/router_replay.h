#pragma once
// Replays a router log (scheduler/router_log.h) into a fresh request table
// with the same options and a fresh policy of the same name and seed, and
// compares every decision it makes with the recorded one. Identical
// decisions show that the policy object behaves the same whoever drives it:
// the router actor in a real server, or the simulator.
#include <cstddef>
#include <filesystem>
#include <string>

namespace troupe::sim {

struct ReplayResult {
  size_t calls = 0;     // table calls replayed
  size_t recorded = 0;  // decisions in the log (placements and stops)
  size_t replayed = 0;  // decisions the replay made
  size_t mismatches = 0;
  std::string policy;
  std::string first_mismatch;  // "line N: ..." when there is one
  bool identical() const { return mismatches == 0 && recorded == replayed; }
};

// Throws std::invalid_argument naming the file and line of a malformed entry.
ReplayResult replay_router_log(const std::filesystem::path& file);

}  // namespace troupe::sim
