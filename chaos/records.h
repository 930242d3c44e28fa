#pragma once
// What a chaos run observed, as plain data: each request as the client saw
// it, each fault as the harness injected and confirmed it, the deployment's
// capacity over time and each process's resources. The checker
// (chaos/checker.h) turns them into the report.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::chaos {

// Times are seconds since the run started (negative: never).

// How a request's exchange ended, as the client saw it.
enum class Transport {
  Complete,       // a whole response (any status)
  NoResponse,     // nothing (no status line) by the deadline, or the connection failed first
  Stalled,        // a stream started and stopped producing before its end, by the deadline
  Broken,         // the server closed the connection in the middle of a response
  CancelledByUs,  // the client went away on purpose (a deliberate cancel, or an injected
                  // disconnect)
};

struct RequestRecord {
  size_t index = 0;  // in the workload (the expected outputs are indexed alike)
  bool stream = false;
  bool sampled = false;   // seeded sampling (else greedy)
  int cancel_after = -1;  // >= 0: the client goes away after this many tokens, on purpose
  bool injected_disconnect = false;  // an HTTP fault made the client go away mid-stream
  bool injected_slow = false;        // an HTTP fault made the client read slowly
  double sent_s = -1;
  double first_token_s = -1;
  double end_s = -1;
  std::vector<double> token_times;  // arrival of each token (streams; one entry at end otherwise)
  std::vector<int> tokens;          // the ids received
  std::string finish_reason;        // "stop", "length", ... when the response said
  int status = 0;                   // HTTP status; 0: none came
  std::string error;                // the server's error message, or the transport's
  Transport transport = Transport::Complete;
};

// What the fault-free pass produced for the same request.
struct Expected {
  std::vector<int> tokens;
  std::string finish_reason;
};

struct FaultRecord {
  std::string kind;        // process_kill, link_cut, kill, slow, client_disconnect, ...
  std::string target;      // "node-1", "replica 0 worker", "3 clients", ...
  double planned_s = -1;   // when the plan (or the random draw) timed it
  double injected_s = -1;  // -1: never played (see not_played)
  // Why a planned fault was never played ("the load ended at 8.6 s"); empty
  // when it was.
  std::string not_played;
  double duration_s = 0;     // lasting faults
  double confirmed_s = -1;   // when its effect was observed
  std::string confirmation;  // the effect, in words ("pid 123 exited by SIGKILL", ...)
  std::string error;         // why it was not confirmed, or could not be injected
  double detected_s = -1;    // the deployment noticed (a node or replica declared dead)
  double recovered_s = -1;   // capacity back to what it was before
  // For each request the fault orphaned (its replica died), when its next
  // token came, as the coordinator saw it; empty when unknown.
  std::vector<double> resumed_s;
};

// Sampled every few hundred milliseconds during the load.
struct CapacitySample {
  double t = 0;
  int live_replicas = 0;
  int replicas = 0;  // configured
};

struct ResourceSample {
  std::string process;  // "coordinator", "node-1", ...
  int pid = 0;
  double rss_mib = 0;
  int open_fds = 0;
  int threads = 0;
  int kv_blocks_used = -1;  // from the coordinator's metrics; -1: unknown
};

struct RunRecords {
  std::vector<RequestRecord> requests;
  std::vector<Expected> expected;  // by RequestRecord::index
  std::vector<FaultRecord> faults;
  std::vector<CapacitySample> capacity;
  std::vector<ResourceSample> resources_start, resources_end;
  double duration_s = 0;   // the whole run, the waits for late confirmations included
  double load_end_s = -1;  // when the load's last request ended (-1: unknown)
  double deadline_s = 0;   // each request's deadline after it was sent
  // What the load would get without faults: a closed loop's fault-free
  // pass; for an open loop, the offered load (rate x mean expected tokens)
  // when the fault-free pass showed the deployment can carry it.
  double baseline_tokens_per_s = 0;
  std::string baseline_basis = "closed loop";  // or "offered load"
  // Capacity at the run's end, after a wait for it to come back: replicas
  // not ready that supervision had not given up on, those it had, and
  // whether every node the plan stopped was started again (else a replica
  // may rightly have nowhere to run).
  std::vector<int> down_at_end, given_up_at_end;
  bool every_node_back = true;
};

}  // namespace troupe::chaos
