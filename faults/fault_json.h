#pragma once
// Faults as JSON: the body of POST /admin/faults and each entry of GET
// /admin/faults (and of `troupe chaos --json`).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "faults/fault_book.h"

namespace troupe {

struct FaultRequest {
  FaultOrder order;
  double at_s = 0;        // start this long after it is received
  double duration_s = 0;  // lasting kinds (slow, kv_alloc_fail) only, and required there
};

// {"kind": "kill", "role": "worker", "replica": 0, "device": 1, "factor": 4,
//  "at_s": 0, "duration_s": 5}; unknown keys and values out of range are
// refused with a message naming the key. `replicas` bounds "replica", and
// `devices` (a replica's, pipeline x tensor; 0: not known) "device".
std::variant<FaultRequest, std::string> parse_fault_request(std::string_view body, int replicas,
                                                            int devices = 0);
nlohmann::json fault_request_json(const FaultRequest& r);

nlohmann::json fault_entry_json(const FaultEntry& e);

}  // namespace troupe
