// `troupe node`: a worker process that offers its devices to a coordinator
// (`troupe serve` with nodes.listen) and runs the replicas placed on them.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "actors/node_agent.h"
#include "actors/runtime.h"
#include "apps/commands.h"
#include "deploy/engine_builder.h"

namespace troupe::app {

namespace {

struct NodeOptions {
  ConfigFlags config;
  std::string join;
  std::string name;
  std::string token;
  int devices = 0;
  const CLI::Option* devices_given = nullptr;
};

std::string default_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "node");
  return std::string(host) + "-" + std::to_string(getpid());
}

// The node's devices (deploy/config.h's node_devices): --devices N of
// them, or one per devices entry.
std::vector<DeviceSpec> offered_devices(const Config& c, int count) {
  try {
    return node_devices(c, count);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--devices: ") + e.what());
  }
}

// What a node's config sets of the coordinator's sections has no effect:
// the coordinator's config sets them for every replica it places. Said, so
// that a KV cache or batch size set here is not believed in force.
void warn_coordinator_sections(const Config& cfg) {
  const Config defaults = default_config();
  std::string ignored;
  const auto check = [&](bool differs, const char* name) {
    if (!differs) return;
    if (!ignored.empty()) ignored += ", ";
    ignored += name;
  };
  check(cfg.server != defaults.server, "server");
  check(cfg.batching != defaults.batching, "batching");
  check(cfg.kv_cache != defaults.kv_cache, "kv_cache");
  check(cfg.routing != defaults.routing, "routing");
  check(cfg.admission != defaults.admission, "admission");
  check(cfg.supervision != defaults.supervision, "supervision");
  check(cfg.placement != defaults.placement, "placement");
  if (!ignored.empty())
    spdlog::warn(
        "troupe node: {} set in this config have no effect on a node: the coordinator's config "
        "sets them for the replicas it places here",
        ignored);
}

void run_node(const NodeOptions& o) {
  if (o.join.empty())
    throw UsageError("--join HOST:PORT is required (the coordinator's nodes.listen)");
  std::pair<std::string, uint16_t> where;
  try {
    where = parse_listen(o.join);
  } catch (const std::invalid_argument&) {
    // parse_listen speaks of a port to listen on ("0 = any free port").
    throw UsageError("--join " + o.join + ": expected the coordinator's HOST:PORT (port 1-65535)");
  }
  const auto& [host, port] = where;
  if (port == 0) throw UsageError("--join: the coordinator's port cannot be 0");
  if (o.devices < 0 || (o.devices == 0 && o.devices_given && o.devices_given->count() > 0))
    throw UsageError("--devices must be at least 1");
  std::vector<std::pair<std::string, std::string>> flags;
  if (!o.name.empty()) flags.emplace_back("nodes.name", o.name);
  if (!o.token.empty()) flags.emplace_back("nodes.token", o.token);
  const Config cfg = command_config(o.config, flags, 0, ConfigRole::Node);
  if (const std::string problem = node_name_problem(cfg.nodes.name);
      !cfg.nodes.name.empty() && !problem.empty())
    throw UsageError("--name (nodes.name) '" + cfg.nodes.name + "': " + problem);
  spdlog::set_level(cfg.logging.level);
  warn_coordinator_sections(cfg);
  // The signals are for sigwait below alone: blocked before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // troupe serve's fault hooks; a node has no replica of its own to crash,
  // and their default action would end it without a word.
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto ckpt = configured_checkpoint(load_checkpoint(cfg.model.path), cfg.model);
  auto engines = std::make_shared<EngineBuilder>(ckpt, cfg.model.dtype);
  const ModelConfig& model = ckpt->config;
  // The coordinator's front end takes grammars only when it has the
  // tokenizer; the same config finds it here.
  if (const auto tok = tokenizer_path(cfg, ckpt->tokenizer_path); !tok.empty())
    engines->set_vocabulary(vocabulary_source(tok, model.vocab_size));
  NodeAgentOptions no;
  no.devices = offered_devices(cfg, o.devices);
  no.join = {cfg.nodes.name.empty() ? default_name() : cfg.nodes.name,
             cfg.nodes.token,
             kWireProtocol,
             kTroupeVersion,
             engines->fingerprint(),
             int(no.devices.size()),
             cfg.nodes.address};
  no.engines = engines_from(engines, cfg.cuda);
  no.stop = StopRule{model.eos_ids, model.max_seq_len};
  no.bos = model.bos_id;
  no.vocab_size = model.vocab_size;
  no.heartbeat_timeout_s = cfg.nodes.heartbeat_timeout_s;
  no.coordinator_host = host;
  no.coordinator_port = port;
  std::mutex mu;
  std::condition_variable cv;
  std::string refused;
  bool stop = false;
  no.on_refused = [&](const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    refused = why.empty() ? "refused" : why;
    cv.notify_all();
  };
  const std::string name = no.join.name;
  const size_t devices = no.devices.size();

  caf::actor_system_config ac;
  ac.set("scheduler.max-threads", 2);
  configure_distribution(ac, cfg.nodes.heartbeat_timeout_s);
  caf::actor_system system{ac};
  auto agent = system.spawn<caf::detached>(node_agent, std::move(no), CoordinatorActor{});
  std::fprintf(stderr, "troupe node: %s (model %s, %s) offering %zu device(s) to %s:%u\n",
               name.c_str(), cfg.model.path.c_str(), dtype_name(cfg.model.dtype), devices,
               host.c_str(), unsigned(port));
  std::fflush(stderr);
  std::thread waiter([&] {
    int sig = 0;
    for (sigwait(&signals, &sig); sig == SIGUSR1 || sig == SIGUSR2; sigwait(&signals, &sig))
      spdlog::warn(
          "troupe node: signal {} ignored (SIGUSR1/SIGUSR2 crash replicas on the coordinator: "
          "send them to troupe serve, or POST /admin/faults)",
          sig);
    std::lock_guard<std::mutex> l(mu);
    stop = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return stop || !refused.empty(); });
  }
  // Bounded: a node refused after it had run replicas and lost its first
  // connection was seen to wait for ever in CAF's teardown.
  exit_if_stuck(std::chrono::seconds(10), refused.empty() ? 0 : 1, "node " + name);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  if (!refused.empty()) {
    // The waiter sleeps in sigwait: wake it, so that it can be joined.
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    throw std::runtime_error("the coordinator refused node " + name + ": " + refused);
  }
  waiter.join();
  spdlog::info("node {}: shutting down", name);
  {
    // It stops its replicas and quits once they are gone (bounded).
    caf::scoped_actor self{system};
    self->wait_for(agent);
  }
  // Everything of this node has stopped. CAF 0.17's actor system teardown
  // can still wait for ever on a part of a replica spanning nodes, held by
  // a message to a connection it no longer serves (a known CAF bug, fixed
  // in 0.18): seen in 1 exit of 14 even after the agent's drain. So the
  // process ends here, its logs flushed.
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(0);
}

}  // namespace

void register_node(CLI::App& app) {
  auto o = std::make_shared<NodeOptions>();
  auto* cmd = app.add_subcommand(
      "node", "Offer this machine's devices to a coordinator (troupe serve with nodes.listen)");
  cmd->add_option("--join", o->join, "The coordinator's nodes.listen address, HOST:PORT")
      ->required();
  cmd->add_option("--name", o->name, "This node's name (default: host-pid)");
  cmd->add_option("--token", o->token, "The coordinator's nodes.token, if it has one");
  o->devices_given =
      cmd->add_option("--devices", o->devices,
                      "Devices to offer (default: one per devices entry of the config, or as many "
                      "as its layout has when it lists one)");
  add_config_flags(cmd, o->config);
  cmd->callback([o] { run_node(*o); });
}

}  // namespace troupe::app
