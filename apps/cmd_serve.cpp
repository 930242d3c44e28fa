// `troupe serve`: the OpenAI-compatible HTTP API over the actor runtime.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "actors/runtime.h"
#include "apps/commands.h"
#include "deploy/config.h"
#include "net/chat_template.h"
#include "net/http_server.h"
#include "text/tokenizer.h"
#include "util/gguf_file.h"

namespace troupe::app {

namespace {

struct ServeOptions {
  ConfigFlags config;
  std::string model;  // model.path
  std::string name;   // model.name
  std::string listen;
  std::string chat_template_file;  // server.chat_template_file
  std::string reasoning_parser;    // server.reasoning_parser
  std::string host;  // with `port`: server.listen in parts, as vLLM's --host and --port
  int port = -1;
  bool print_config = false;
};

// SIGTERM or SIGINT: nothing accepted ends in silence, and the exit is
// bounded. New requests get 503 at once; those in flight get `grace_s` to
// finish (a second SIGTERM or SIGINT stops the wait); then the router ends
// whatever is still open with 503 (a stream: an SSE error event and
// [DONE]), the server writes those last bytes and closes, and the runtime
// stops.
void shut_down(HttpServer& server, ActorRuntime& runtime, double grace_s, int sig,
               const sigset_t& signals) {
  server.begin_shutdown();
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(grace_s));
  if (server.in_flight() > 0 && grace_s > 0)
    spdlog::info("signal {}: shutting down; {} request(s) in flight get up to {} s to finish", sig,
                 server.in_flight(), schema::format_number(grace_s));
  else
    spdlog::info("signal {}: shutting down", sig);
  while (server.in_flight() > 0 && Clock::now() < deadline) {
    const timespec pause{0, 50'000'000};
    const int again = sigtimedwait(&signals, nullptr, &pause);
    if (again == SIGINT || again == SIGTERM) {
      spdlog::warn("signal {}: not waiting for the requests in flight", again);
      break;
    }
  }
  if (const size_t open = server.in_flight(); open > 0)
    spdlog::warn("{} request(s) still open: ending them with 503", open);
  runtime.shutdown();
  server.stop();
  spdlog::info("troupe serve: stopped");
  // What is left (the runtime's actors, a step in progress) stops as the
  // caller unwinds; bounded whatever it waits for.
  exit_if_stuck(std::chrono::seconds(10), 0, "serve");
}

// Today as Llama 3.2's template writes it (strftime "%d %b %Y").
std::string today_for_templates() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

// The text of a special token in tokenizer_config.json: a string, or an
// AddedToken object's "content"; "" when absent.
std::string special_token_text(const nlohmann::json& config, const char* key) {
  const auto t = config.is_object() ? config.find(key) : config.end();
  if (t == config.end()) return {};
  if (t->is_string()) return t->get<std::string>();
  if (t->is_object() && t->contains("content") && (*t)["content"].is_string())
    return (*t)["content"].get<std::string>();
  return {};
}

// What a model directory says about chats, from one reading of its
// tokenizer_config.json: the Jinja template ("chat_template", a text or the
// one named "default", else chat_template.jinja, where newer transformers
// save it; "" for none) and the BOS and EOS text transformers renders it with.
struct ModelChat {
  std::string jinja, bos_token, eos_token;
};

// A GGUF file's own: tokenizer.chat_template, and its BOS and EOS tokens'
// spellings.
ModelChat read_gguf_chat(const std::filesystem::path& file) {
  ModelChat chat;
  try {
    const GgufFile f = GgufFile::open(file);
    chat.jinja = f.text("tokenizer.chat_template").value_or("");
    const auto* tokens = f.texts("tokenizer.ggml.tokens");
    // A SentencePiece-style vocabulary's BOS and EOS are ids 1 and 2 unless
    // it says otherwise, as llama.cpp reads it.
    const bool spm = f.text("tokenizer.ggml.model").value_or("") == "llama";
    auto spelling = [&](const char* key, int64_t spm_default) -> std::string {
      const auto id = f.integer(key).value_or(spm ? spm_default : -1);
      return tokens && id >= 0 && size_t(id) < tokens->size() ? (*tokens)[size_t(id)] : "";
    };
    chat.bos_token = spelling("tokenizer.ggml.bos_token_id", 1);
    chat.eos_token = spelling("tokenizer.ggml.eos_token_id", 2);
  } catch (const GgufError& e) {
    spdlog::warn("the model's chat template cannot be read ({})", e.what());
  }
  return chat;
}

ModelChat read_model_chat(const std::filesystem::path& dir) {
  ModelChat chat;
  if (std::ifstream in(dir / "tokenizer_config.json"); in) {
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    const auto t = j.is_object() ? j.find("chat_template") : j.end();
    if (t != j.end() && t->is_string()) chat.jinja = t->get<std::string>();
    if (t != j.end() && t->is_array())  // named templates: the "default" one
      for (const nlohmann::json& e : *t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          chat.jinja = e["template"].get<std::string>();
    chat.bos_token = special_token_text(j, "bos_token");
    chat.eos_token = special_token_text(j, "eos_token");
  }
  if (chat.jinja.empty())
    if (std::ifstream in(dir / "chat_template.jinja"); in)
      chat.jinja.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return chat;
}

// server.chat_template_file, else server.chat_template; auto: the model's own
// Jinja template (beside a Hugging Face checkpoint), interpreted; one it
// cannot interpret is rendered by the built-in template it is recognised as,
// else plain; said in the log either way.
ChatFormat resolve_chat_template(const ServerSection& server, const std::string& model_path) {
  if (server.chat_template_file.empty() && server.chat_template != ChatTemplate::Auto)
    return server.chat_template;
  std::filesystem::path dir(model_path);
  const bool gguf = !std::filesystem::is_directory(dir) && GgufFile::has_magic(dir);
  if (!std::filesystem::is_directory(dir) && !gguf) dir = dir.parent_path();
  const ModelChat model = gguf ? read_gguf_chat(dir) : read_model_chat(dir);
  if (!server.chat_template_file.empty()) {
    std::ifstream in(server.chat_template_file);
    if (!in)
      throw ConfigError("server.chat_template_file: cannot read " + server.chat_template_file, "",
                        "server.chat_template_file");
    const std::string source(std::istreambuf_iterator<char>(in), {});
    try {
      ChatFormat f = openai::jinja_chat_format(source, model.bos_token, model.eos_token);
      spdlog::info("chat template: {} (Jinja)", server.chat_template_file);
      return f;
    } catch (const openai::ChatTemplateError& e) {
      throw ConfigError("server.chat_template_file " + server.chat_template_file + ": " + e.what(),
                        "", "server.chat_template_file");
    }
  }
  const std::string& jinja = model.jinja;
  if (!jinja.empty()) {
    try {
      ChatFormat f = openai::jinja_chat_format(jinja, model.bos_token, model.eos_token);
      spdlog::info("chat template: the model's own (Jinja, from {})", dir.string());
      return f;
    } catch (const openai::ChatTemplateError& e) {
      spdlog::warn("the model's chat template cannot be interpreted here ({})", e.what());
    }
  }
  if (const auto known = openai::recognize_chat_template(jinja, today_for_templates())) {
    for (const auto& [name, tmpl] : kChatTemplates)
      if (tmpl == known->kind)
        spdlog::info("chat template: {} (recognised in the model's, from {}){}{}", name,
                     dir.string(),
                     known->default_system.empty() ? "" : "; default system message: ",
                     known->default_system);
    return *known;
  }
  spdlog::info("chat template: plain ({})", jinja.empty()
                                                ? "the model has none"
                                                : "the model's own is not one this server "
                                                  "renders; set server.chat_template");
  return ChatTemplate::Plain;
}

// Whether this process's engines may run on CUDA (kind cuda, or auto where
// a GPU answers), which classify only the sampled rows: prompt
// log-probabilities are then refused at the door rather than answered with
// nulls. (Replicas on nodes are not known here; a node's CUDA replica
// leaves them null.)
bool devices_may_be_cuda(const Config& cfg) {
  for (const DeviceSpec& d : cfg.devices) {
    if (d.kind == DeviceKind::Cuda) return true;
    if (d.kind == DeviceKind::Auto && EngineBuilder::cuda_available(nullptr)) return true;
  }
  return false;
}

void run_serve(const ServeOptions& so) {
  std::vector<std::pair<std::string, std::string>> flags;
  if (!so.model.empty()) flags.emplace_back("model.path", so.model);
  if (!so.name.empty()) flags.emplace_back("model.name", so.name);
  if (!so.listen.empty()) flags.emplace_back("server.listen", so.listen);
  if (!so.chat_template_file.empty())
    flags.emplace_back("server.chat_template_file", so.chat_template_file);
  if (!so.reasoning_parser.empty())
    flags.emplace_back("server.reasoning_parser", so.reasoning_parser);
  Config cfg = command_config(so.config, flags);
  if (!so.host.empty() || so.port >= 0) {
    if (!so.listen.empty())
      throw UsageError("--host and --port replace --listen: give one or the other");
    auto [host, port] = parse_listen(cfg.server.listen);
    if (!so.host.empty()) host = so.host;
    if (so.port >= 0) port = uint16_t(so.port);
    const bool v6 = host.find(':') != std::string::npos;
    apply_overrides(
        cfg, {{"server.listen", (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port)}},
        "--host/--port");
  }
  if (so.print_config) {
    std::cout << to_yaml(cfg);
    return;
  }
  spdlog::set_level(cfg.logging.level);
  // Block the shutdown and fault-injection signals before any thread starts
  // (the runtime's threads, and the ones it starts later, inherit the mask),
  // so that sigwait below is the only one to receive them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto ckpt = configured_checkpoint(load_checkpoint(cfg.model.path), cfg.model);
  const ModelConfig mc = ckpt->config;
  std::optional<Tokenizer> tokenizer;
  const std::filesystem::path tok_path = tokenizer_path(cfg, ckpt->tokenizer_path);
  if (!tok_path.empty())
    tokenizer = load_tokenizer(tok_path, mc.vocab_size);
  else
    spdlog::warn("no tokenizer for {}: only token-id prompts are accepted", cfg.model.path);

  Metrics metrics;
  metrics.export_vllm_names(served_model_name(cfg));
  auto engines = std::make_shared<EngineBuilder>(ckpt, cfg.model.dtype);
  if (tokenizer) engines->set_vocabulary(vocabulary_source(*tokenizer));
  ActorRuntime runtime(cfg, engines, &metrics);
  const auto [host, port] = parse_listen(cfg.server.listen);
  HttpServer::Options ho;
  ho.host = host;
  ho.port = port;
  ho.max_body_bytes = size_t(cfg.server.max_body_bytes);
  ho.request_timeout_s = cfg.server.request_timeout_s;
  ho.io_threads = cfg.server.io_threads;
  ho.chat_template = resolve_chat_template(cfg.server, cfg.model.path);
  ho.chat_template.reasoning = cfg.server.reasoning_parser;
  ho.allowed_origins = cfg.server.allowed_origins;
  ho.access_log = cfg.server.access_log;
  ho.api_key = cfg.server.api_key;
  ho.api_key = api_key_or_env(ho.api_key);
  if (!ho.api_key.empty())
    spdlog::info("the model's endpoints need \"Authorization: Bearer <the API key>\"");
  if (cfg.admin.faults) {
    ho.faults = &runtime;
    ho.admin_token = cfg.admin.token;
    spdlog::warn(
        "fault injection is on: POST /admin/faults takes faults from holders of the token");
  }
  openai::ModelLimits limits;
  limits.name = served_model_name(cfg);
  limits.context_length = mc.max_seq_len;
  limits.vocab_size = mc.vocab_size;
  limits.max_tokens_cap = cfg.server.max_tokens_limit;
  limits.priority_levels = cfg.admission.priority_levels;
  limits.prompt_logprobs = !devices_may_be_cuda(cfg);
  if (!tokenizer)
    limits.structured_output_refusal = "the model has no tokenizer, so no text to shape";
  else if (devices_may_be_cuda(cfg))
    limits.structured_output_refusal =
        "this server's CUDA devices sample on the device, and "
        "structured output is computed on the CPU";
  HttpServer server(ho, runtime, tokenizer, limits, metrics);
  server.start();
  if (runtime.nodes_port() != 0)
    std::fprintf(stderr, "troupe serve: nodes join on %s:%u\n",
                 parse_listen(cfg.nodes.listen).first.c_str(), unsigned(runtime.nodes_port()));
  std::fprintf(
      stderr,
      "troupe serve: model %s (%s%s), %d replica(s) x %d stage(s) x %d shard(s), listening on "
      "http://%s:%u\n",
      limits.name.c_str(), dtype_name(cfg.model.dtype),
      cfg.model.quantized_products == QuantProducts::Int8 ? ", int8 products" : "",
      cfg.parallel.replicas, cfg.parallel.pipeline, cfg.parallel.tensor, host.c_str(),
      unsigned(server.port()));
  std::fflush(stderr);
  // Fault-injection hooks for tests and chaos runs: SIGUSR1 crashes replica
  // 0, SIGUSR2 the last replica: its worker, or with a multi-device layout
  // its last shard, mid-step.
  const int devices = cfg.parallel.pipeline * cfg.parallel.tensor;
  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      const int replica = sig == SIGUSR1 ? 0 : cfg.parallel.replicas - 1;
      if (devices > 1) {
        spdlog::warn("signal {}: killing shard {} of replica {}", sig, devices - 1, replica);
        runtime.inject_shard_crash(replica, devices - 1);
      } else {
        spdlog::warn("signal {}: injecting a crash into replica {}", sig, replica);
        runtime.inject_crash(replica);
      }
      continue;
    }
    break;
  }
  shut_down(server, runtime, cfg.server.shutdown_grace_s, sig, signals);
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve the OpenAI-compatible HTTP API (POST /v1/completions, ...)");
  add_config_flags(cmd, o->config);
  cmd->add_option(
      "--model,-m", o->model,
      "Override model.path: a llama2.c .bin file, a GGUF file or a Hugging Face directory");
  cmd->add_option("--served-model-name", o->name,
                  "Override model.name: the name clients ask for (default: from the path)");
  cmd->add_option("--listen", o->listen,
                  "Override server.listen (host:port; port 0 = any free port)");
  cmd->add_option("--host", o->host, "Override server.listen's host (e.g. 0.0.0.0)");
  cmd->add_option("--port", o->port, "Override server.listen's port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--chat-template", o->chat_template_file,
                  "Override server.chat_template_file: a Jinja chat template file to render "
                  "chats with");
  cmd->add_option("--reasoning-parser", o->reasoning_parser,
                  "Override server.reasoning_parser: none | deepseek_r1 | qwen3 (a chat answer's "
                  "<think>...</think> as message.reasoning_content)");
  cmd->add_flag("--print-config", o->print_config, "Print the effective configuration and exit");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace troupe::app
