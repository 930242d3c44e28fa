#include "chaos/deployment.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "deploy/config.h"
#include "net/admin_client.h"
#include "net/http_client.h"

namespace troupe::chaos {

namespace {

// The port at the end of a line such as "... listening on http://127.0.0.1:8080".
uint16_t port_at_end(const std::string& line) {
  const size_t colon = line.rfind(':');
  if (colon == std::string::npos) return 0;
  return uint16_t(std::atoi(line.c_str() + colon + 1));
}

std::string log_tail(const ChildProcess& p) {
  const std::string err = p.stderr_so_far();
  return err.size() > 2000 ? "..." + err.substr(err.size() - 2000) : err;
}

int live_replicas(uint16_t port) {
  HttpClient::Options o;
  o.port = std::to_string(port);
  o.connect_timeout_s = o.io_timeout_s = 5;
  HttpClient c(o);
  HttpRequest req;
  req.target = "/metrics";
  req.keep_alive = false;
  const HttpResponse r = c.request(req);
  if (r.status != 200) return -1;
  int live = 0;
  std::istringstream in(r.body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("troupe_replica_state{", 0) == 0 && line.size() > 2 &&
        line.substr(line.size() - 2) == " 2")
      ++live;
  return live;
}

}  // namespace

ResourceSample process_resources(const std::string& name, int pid) {
  ResourceSample s;
  s.process = name;
  s.pid = pid;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mib = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++s.open_fds;
  return s;
}

char process_state(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() ? 0 : text[close + 2];
}

Deployment::Deployment(const ChaosPlan& plan, std::filesystem::path exe,
                       std::filesystem::path run_dir)
    : exe_(std::move(exe)),
      run_dir_(std::move(run_dir)),
      plan_(plan.deployment),
      token_(fresh_admin_token()) {
  std::filesystem::create_directories(run_dir_);
  config_ = deployment_config_path(plan);
  const Config cfg = load_config(config_);
  replicas_ = cfg.parallel.replicas;
  coordinator_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{exe_.string(), "serve", "--config", config_.string(), "--set",
                               "server.listen=127.0.0.1:0", "--set", "nodes.listen=127.0.0.1:0",
                               "--set", "admin.faults=true", "--set", "admin.token=" + token_},
      (run_dir_ / "coordinator.log").string());
  const double wait = plan_.ready_timeout_s;
  const std::string joined = coordinator_->wait_for_line("nodes join on", wait);
  const std::string listening = coordinator_->wait_for_line("listening on http://", wait);
  nodes_port_ = port_at_end(joined);
  http_port_ = port_at_end(listening);
  if (nodes_port_ == 0 || http_port_ == 0)
    throw std::runtime_error("the coordinator did not start (" + config_.string() + "):\n" +
                             log_tail(*coordinator_));
  for (int i = 1; i <= plan_.nodes; ++i) {
    NodeProcess n;
    n.name = "node-" + std::to_string(i);
    n.link = std::make_unique<LinkProxy>("127.0.0.1", nodes_port_);
    nodes_.push_back(std::move(n));
  }
  for (NodeProcess& n : nodes_) start_node(n);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait);
  for (;;) {
    if (live_replicas(http_port_) == replicas_) break;
    if (!coordinator_->running())
      throw std::runtime_error("the coordinator exited:\n" + log_tail(*coordinator_));
    // A node refused (or crashed) at start will not be back by itself.
    for (NodeProcess& n : nodes_)
      if (n.process && !n.process->running())
        throw std::runtime_error(n.name + " exited (status " +
                                 std::to_string(n.process->exit_code()) +
                                 ") before every replica was ready:\n" + log_tail(*n.process));
    if (std::chrono::steady_clock::now() > end) {
      std::string logs = "coordinator:\n" + log_tail(*coordinator_);
      for (const NodeProcess& n : nodes_)
        if (n.process) logs += "\n" + n.name + ":\n" + log_tail(*n.process);
      throw std::runtime_error("not every replica was ready after " + std::to_string(int(wait)) +
                               " s (" + std::to_string(replicas_) + " configured); logs:\n" + logs);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Deployment::~Deployment() {
  for (NodeProcess& n : nodes_)
    if (n.process) {
      n.process->signal(SIGCONT);  // a stopped node cannot take SIGTERM
      n.process.reset();
    }
  coordinator_.reset();
}

std::vector<std::string> Deployment::node_names() const {
  std::vector<std::string> names;
  for (const NodeProcess& n : nodes_) names.push_back(n.name);
  return names;
}

NodeProcess& Deployment::node(const std::string& name) {
  for (NodeProcess& n : nodes_)
    if (n.name == name) return n;
  throw std::invalid_argument("no node " + name);
}

void Deployment::start_node(NodeProcess& n) {
  n.process.reset();
  ++n.starts;
  n.process = std::make_unique<ChildProcess>(
      std::vector<std::string>{
          exe_.string(), "node", "--join", "127.0.0.1:" + std::to_string(n.link->port()), "--name",
          n.name, "--devices", std::to_string(plan_.node_devices), "--config", config_.string(),
          "--set", "devices=[{kind: cpu, threads: " + std::to_string(plan_.node_threads) + "}]"},
      (run_dir_ / (n.name + ".log")).string());
}

std::vector<ResourceSample> Deployment::resources(int kv_blocks_used) {
  std::vector<ResourceSample> out;
  out.push_back(process_resources("coordinator", coordinator_->pid()));
  out.back().kv_blocks_used = kv_blocks_used;
  for (NodeProcess& n : nodes_)
    if (n.process && n.process->running())
      out.push_back(process_resources(n.name, n.process->pid()));
  return out;
}

}  // namespace troupe::chaos
