#pragma once
// A chaos run's report (chaos/checker.h) for people and for programs.
#include <nlohmann/json.hpp>
#include <string>

#include "chaos/checker.h"

namespace troupe::chaos {

// Compact text: the outcome counts, the first fatal examples, latency by
// phase (and what each phase means), throughput against the baseline, each
// planned fault (played or not) and each kind, the processes' resources and
// the verdict (PASS; FAIL with the reasons; INCOMPLETE when nothing failed
// but faults of the plan were never played).
std::string render_text(const ChaosReport& report);

// The same content as JSON: every count, every quantile in seconds (null
// when there were no samples), every fault, the throughput bins, resources,
// "verdict" ("PASS"/"FAIL"/"INCOMPLETE"), "ok", "failures" and
// "not_played". Times that never happened
// (-1 in the records) are null.
nlohmann::json render_json(const ChaosReport& report);

}  // namespace troupe::chaos
