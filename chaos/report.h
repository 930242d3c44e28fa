#pragma once
// A chaos run's report (chaos/checker.h) for people and for programs.
#include <nlohmann/json.hpp>
#include <string>

#include "chaos/checker.h"

namespace troupe::chaos {

// Compact text: the outcome counts, the first fatal examples, latency by
// phase, throughput against the baseline, each fault and each kind, the
// processes' resources and the verdict (PASS, or FAIL with the reasons).
std::string render_text(const ChaosReport& report);

// The same content as JSON: every count, every quantile in seconds (null
// when there were no samples), every fault, the throughput bins, resources,
// "verdict" ("PASS"/"FAIL"), "ok" and "failures". Times that never happened
// (-1 in the records) are null.
nlohmann::json render_json(const ChaosReport& report);

}  // namespace troupe::chaos
