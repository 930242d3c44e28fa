#pragma once
// One request of a chaos run as a client makes it, over the shared HTTP
// client: every token id with its arrival time, how the exchange ended, and
// the client-side faults (going away mid-stream, reading slowly).
#include <chrono>
#include <string>

#include "chaos/records.h"
#include "chaos/workload.h"
#include "net/http_client.h"

namespace troupe::chaos {

using Clock = std::chrono::steady_clock;

struct ClientFaults {
  bool disconnect = false;      // go away after the first token (an HTTP fault)
  double slow_bytes_per_s = 0;  // > 0: read the response this slowly (an HTTP fault)
};

// Sends `body` and records the exchange; times are seconds since `t0`. The
// request has `deadline_s` to complete. The client is closed after anything
// but a complete response, so the next request starts on a fresh connection.
RequestRecord run_request(HttpClient& client, const std::string& body, const RequestSpec& spec,
                          const ClientFaults& faults, double deadline_s, Clock::time_point t0);

}  // namespace troupe::chaos
