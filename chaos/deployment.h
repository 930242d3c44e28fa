#pragma once
// The deployment a chaos run starts on 127.0.0.1: a coordinator (`troupe
// serve`, fault injection on with a fresh token) and node processes (`troupe
// node`), each joining through a link proxy of its own so that the link
// between it and the coordinator can be delayed, cut or made to lose
// messages. Processes it started can be killed, stopped and started again.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chaos/child_process.h"
#include "chaos/plan.h"
#include "chaos/records.h"
#include "net/link_proxy.h"

namespace troupe::chaos {

struct NodeProcess {
  std::string name;
  std::unique_ptr<ChildProcess> process;  // null while it is down
  std::unique_ptr<LinkProxy> link;        // stays across restarts
  int starts = 0;
};

class Deployment {
 public:
  // Starts everything and waits until the coordinator serves with every
  // replica ready. Throws std::runtime_error naming what did not come up,
  // with the end of its log. Logs go to run_dir/<process>.log.
  Deployment(const ChaosPlan& plan, std::filesystem::path exe, std::filesystem::path run_dir);
  ~Deployment();

  uint16_t http_port() const { return http_port_; }
  const std::string& admin_token() const { return token_; }
  int replicas() const { return replicas_; }
  ChildProcess& coordinator() { return *coordinator_; }
  std::vector<std::string> node_names() const;
  NodeProcess& node(const std::string& name);
  // Starts (again) a node whose process is down.
  void start_node(NodeProcess& n);
  // Resources of every process now (the coordinator's KV blocks from its
  // metrics when given).
  std::vector<ResourceSample> resources(int kv_blocks_used = -1);

 private:
  std::filesystem::path exe_, run_dir_, config_;
  DeploymentPlan plan_;
  std::string token_;
  std::unique_ptr<ChildProcess> coordinator_;
  uint16_t http_port_ = 0, nodes_port_ = 0;
  int replicas_ = 0;
  std::vector<NodeProcess> nodes_;
};

// RSS, threads and open files of a live process from /proc (zeros if gone).
ResourceSample process_resources(const std::string& name, int pid);
// /proc/PID/stat's state letter ('R', 'S', 'T', ...), or 0 when it is gone.
char process_state(int pid);

}  // namespace troupe::chaos
