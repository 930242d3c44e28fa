#pragma once
// `troupe serve` and `troupe node` as child processes on 127.0.0.1 with the
// bundled model, and what tests read from them: completions, SSE text,
// Prometheus samples.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/process_support.h"

namespace troupe::test {

using json = nlohmann::json;

class Server {
 public:
  // `sets` are --set KEY=VALUE overrides on configs/default.yaml; the HTTP
  // port is chosen by the server. Waits until it listens and, unless
  // wait_ready is false, until a replica is ready. $TROUPE_TEST_SERVE_SET
  // (KEY=VALUE;KEY=VALUE) is applied after `sets`: the same tests on other
  // devices, e.g. 'devices=[{kind: cuda}]'.
  explicit Server(std::vector<std::string> sets, bool wait_ready = true);
  int port() const { return port_; }
  // The port nodes join on (nodes.listen set), else 0.
  int nodes_port() const { return nodes_port_; }
  ChildProcess& process() { return *proc_; }
  HttpResponse complete(const json& body, double timeout_s = 120);
  std::string metrics();
  // Polls /metrics until `series` has `value`; false on timeout.
  bool wait_metric(const std::string& series, const std::string& value, double timeout_s);
  // Waits until replicas 0..n-1 have each been ready once (the server
  // answers when one is: the router sends nothing to the others before
  // theirs, which a loaded machine can delay by seconds); false on timeout.
  bool wait_replicas_ready(int n, double timeout_s = 60);

 private:
  std::unique_ptr<ChildProcess> proc_;
  int port_ = 0;
  int nodes_port_ = 0;
};

// `troupe serve` with `sets` that it must refuse: runs it to its exit
// (bounded) and gives the exit code and what it wrote to stderr.
struct Refusal {
  int exit_code = -1;
  std::string stderr_text;
};
Refusal serve_until_exit(std::vector<std::string> sets, double timeout_s = 60);

// `troupe node --join 127.0.0.1:PORT --name NAME` with the bundled model and
// one single-thread device, plus `sets`.
std::unique_ptr<ChildProcess> start_node(int join_port, const std::string& name,
                                         std::vector<std::string> sets = {});

// Whether $TROUPE_TEST_SERVE_SET puts the test servers on CUDA devices.
bool serving_on_cuda();

// `troupe generate`'s text of the bundled model: greedy, or as `sampling`
// (its flags, e.g. {"--temperature", "0.8", "--seed", "15"}) says; on the
// device that $TROUPE_TEST_SERVE_SET gives the test servers, if it does.
std::string generate_text(const std::string& prompt, int max_tokens,
                          const std::vector<std::string>& sampling = {"--temperature", "0"});

// The text of an SSE completion stream, checking its shape on the way (one
// finish_reason, data: [DONE] last).
std::string sse_text(const std::string& body, std::string* finish = nullptr);

// A port nobody listens on now (bound and released).
int free_port();

// Connects to 127.0.0.1:port, writes `bytes`, waits briefly for the peer to
// answer or close, and closes.
void send_raw(int port, const std::string& bytes);

}  // namespace troupe::test
