#include "support/serving_support.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "net/sse_parser.h"
#include "support/test_support.h"

namespace troupe::test {

namespace {

// The same tests on other devices: $TROUPE_TEST_SERVE_SET's KEY=VALUE
// overrides (separated by ';') as --set arguments (the GPU check serves on
// kind cuda, and takes its reference answers from the same device).
std::vector<std::string> env_sets() {
  std::vector<std::string> args;
  const char* extra = std::getenv("TROUPE_TEST_SERVE_SET");
  std::string rest = extra ? extra : "";
  while (!rest.empty()) {
    const size_t end = rest.find(';');
    const std::string one = rest.substr(0, end);
    if (!one.empty()) {
      args.push_back("--set");
      args.push_back(one);
    }
    rest = end == std::string::npos ? "" : rest.substr(end + 1);
  }
  return args;
}

// `troupe serve` on configs/default.yaml and the bundled model, port chosen
// by the server, with `sets` as --set overrides (then, for a server meant to
// serve, those of $TROUPE_TEST_SERVE_SET).
std::vector<std::string> serve_argv(const std::vector<std::string>& sets, bool with_env_sets) {
  std::vector<std::string> argv{
      troupe_binary(), "serve",
      "--config",      (source_dir() / "configs" / "default.yaml").string(),
      "--listen",      "127.0.0.1:0",
      "--set",         "model.path=" + model_path("fortune").string()};
  for (const auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  if (with_env_sets) {
    const std::vector<std::string> extra = env_sets();
    argv.insert(argv.end(), extra.begin(), extra.end());
  }
  return argv;
}

}  // namespace

Server::Server(std::vector<std::string> sets, bool wait_ready) {
  proc_ = std::make_unique<ChildProcess>(serve_argv(sets, true));
  const std::string line = proc_->wait_for_line("listening on http://", 60);
  if (line.empty()) throw std::runtime_error("server did not start: " + proc_->stderr_so_far());
  port_ = std::stoi(line.substr(line.rfind(':') + 1));
  const std::string err = proc_->stderr_so_far();
  const auto at = err.find("nodes join on ");
  if (at != std::string::npos) {
    const auto end = err.find('\n', at);
    const std::string l = err.substr(at, end - at);
    nodes_port_ = std::stoi(l.substr(l.rfind(':') + 1));
  }
  // Ready once a replica has completed its probe step.
  for (int i = 0; wait_ready && i < 600 && http_request(port_, "GET", "/ready").status != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

bool Server::wait_replicas_ready(int n, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const std::string err = proc_->stderr_so_far();
    int ready = 0;
    for (int r = 0; r < n; ++r)
      ready += err.find("replica " + std::to_string(r) + " ready") != std::string::npos;
    if (ready == n) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

HttpResponse Server::complete(const json& body, double timeout_s) {
  return http_request(port_, "POST", "/v1/completions", body.dump(), timeout_s);
}

std::string Server::metrics() {
  return http_request(port_, "GET", "/metrics").body;
}

bool Server::wait_metric(const std::string& series, const std::string& value, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (prometheus_sample(metrics(), series) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

Refusal serve_until_exit(std::vector<std::string> sets, double timeout_s) {
  ChildProcess p(serve_argv(sets, false));  // a refusal must stay one
  Refusal r;
  r.exit_code = p.wait_exit(timeout_s);
  r.stderr_text = p.stderr_so_far();
  return r;
}

std::unique_ptr<ChildProcess> start_node(int join_port, const std::string& name,
                                         std::vector<std::string> sets) {
  std::vector<std::string> argv{
      troupe_binary(), "node",
      "--join",        "127.0.0.1:" + std::to_string(join_port),
      "--name",        name,
      "--config",      (source_dir() / "configs" / "default.yaml").string(),
      "--set",         "model.path=" + model_path("fortune").string(),
      "--set",         "devices=[{kind: cpu, threads: 1}]"};
  for (auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  return std::make_unique<ChildProcess>(argv);
}

std::string generate_text(const std::string& prompt, int max_tokens,
                          const std::vector<std::string>& sampling) {
  std::vector<std::string> args{
      troupe_binary(), "generate", "--model",      model_path("fortune").string(),
      "--prompt",      prompt,     "--max-tokens", std::to_string(max_tokens)};
  args.insert(args.end(), sampling.begin(), sampling.end());
  const std::vector<std::string> extra = env_sets();
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_command(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out.substr(0, r.out.size() - 1);  // generate adds a newline
}

std::string sse_text(const std::string& body, std::string* finish) {
  std::string text;
  bool done = false;
  for (const std::string& payload : sse_events(body)) {
    EXPECT_FALSE(done) << "data after [DONE]";
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const auto j = json::parse(payload);
    text += j["choices"][0]["text"].get<std::string>();
    if (finish && !j["choices"][0]["finish_reason"].is_null())
      *finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done) << "no data: [DONE]";
  return text;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("free_port: no port");
  }
  close(fd);
  return ntohs(a.sin_port);
}

void send_raw(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("send_raw: no socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    (void)!write(fd, bytes.data(), bytes.size());
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char buf[256];
      (void)!read(fd, buf, sizeof buf);
    }
  }
  close(fd);
}

bool serving_on_cuda() {
  const char* extra = std::getenv("TROUPE_TEST_SERVE_SET");
  return extra && std::string(extra).find("cuda") != std::string::npos;
}

}  // namespace troupe::test
