// `troupe chaos` as a user runs it (a coordinator and node processes on
// 127.0.0.1 behind link proxies), and the admin endpoint it drives, over
// real HTTP.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "support/serving_support.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct ChaosResult {
  int exit_code = -1;
  json report;
  std::string stderr_text;
  std::string stdout_text;
};

// Runs `troupe chaos PLAN ARGS...` from the source directory (the plans'
// model paths are relative to it) and reads its JSON report.
ChaosResult run_chaos(const fs::path& plan, std::vector<std::string> args = {}) {
  const test::TempDir tmp;  // the report and the run's logs, gone with the test
  const fs::path& dir = tmp.path();
  // stdout (the text report) through a shell-free redirect: a file.
  const fs::path out = dir / "report.txt";
  std::vector<std::string> argv{"/bin/sh",
                                "-c",
                                "exec \"$0\" \"$@\" > " + out.string(),
                                test::troupe_binary(),
                                "chaos",
                                plan.string(),
                                "--json",
                                (dir / "report.json").string(),
                                "--run-dir",
                                (dir / "logs").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess p(argv, "", test::source_dir().string());
  ChaosResult r;
  r.exit_code = p.wait_exit(240);
  r.stderr_text = p.stderr_so_far();
  std::ifstream in(dir / "report.json");
  if (in) r.report = json::parse(in, nullptr, false);
  std::ifstream text(out);
  r.stdout_text.assign(std::istreambuf_iterator<char>(text), {});
  return r;
}

// A plan written for one test, in the temp directory, beside a copy of the
// deployment it names from tests/data/chaos.
fs::path write_plan(const std::string& name, const std::string& yaml) {
  static const test::TempDir plans;  // removed when the test process ends
  const fs::path& dir = plans.path();
  fs::copy_file(test::data_path("chaos") / "one-node.yaml", dir / "one-node.yaml",
                fs::copy_options::overwrite_existing);
  fs::copy_file(test::source_dir() / "configs" / "chaos" / "deployment.yaml",
                dir / "deployment.yaml", fs::copy_options::overwrite_existing);
  std::ofstream(dir / name) << yaml;
  return dir / name;
}

void expect_nothing_lost(const json& report) {
  const json& c = report["counts"];
  EXPECT_EQ(c["lost"], 0);
  EXPECT_EQ(c["hung"], 0);
  EXPECT_EQ(c["broken"], 0);
  EXPECT_EQ(c["duplicated"], 0);
  EXPECT_EQ(c["wrong"], 0);
  EXPECT_EQ(c["failed_with_status"], 0);
  EXPECT_EQ(c["correct"].get<int>() + c["cancelled_as_asked"].get<int>(), c["requests"].get<int>());
}

std::set<std::string> confirmed_kinds(const json& report) {
  std::set<std::string> kinds;
  for (const json& f : report["faults"]) {
    EXPECT_TRUE(f["confirmed"].get<bool>()) << f.dump();
    EXPECT_FALSE(f["confirmation"].get<std::string>().empty()) << f.dump();
    if (f["confirmed"].get<bool>()) kinds.insert(f["kind"].get<std::string>());
  }
  return kinds;
}

// The shipped quick schedule, as its comment prints it: every family of
// fault (node SIGKILL and SIGSTOP, a partition, runtime and HTTP faults).
TEST(Chaos, TheQuickScheduleLosesNothingAndConfirmsEveryFault) {
  const ChaosResult r = run_chaos("configs/chaos/quick.yaml");
  ASSERT_TRUE(r.report.is_object()) << r.stderr_text;
  EXPECT_EQ(r.exit_code, 0) << r.report["failures"].dump() << "\n" << r.stderr_text;
  EXPECT_EQ(r.report["verdict"], "PASS");
  EXPECT_EQ(r.report["counts"]["requests"], 900);
  expect_nothing_lost(r.report);
  const auto kinds = confirmed_kinds(r.report);
  for (const char* k : {"process_kill", "process_stop", "link_delay", "link_cut", "kill", "slow",
                        "kv_alloc_fail", "step_error", "client_disconnect", "client_slow"})
    EXPECT_TRUE(kinds.count(k)) << k;
  // The node killed was detected and its requests resumed elsewhere.
  for (const json& f : r.report["faults"])
    if (f["kind"] == "process_kill") {
      EXPECT_FALSE(f["detected_s"].is_null()) << f.dump();
      EXPECT_FALSE(f["recovered_s"].is_null()) << f.dump();
    }
  // Cancellations on purpose reached the server as 499s (one that crossed
  // its answer's end on the way is not counted; the two clients that went
  // away as a fault are).
  const int client = r.report["cancellations"]["client"],
            server = r.report["cancellations"]["server_499"];
  EXPECT_GT(client, 0);
  EXPECT_GE(server, client * 8 / 10) << client;
  EXPECT_LE(server, client + 2);
  // Every process was sampled at the start and the end.
  ASSERT_EQ(r.report["resources"].size(), 4u);
  for (const json& p : r.report["resources"]) {
    EXPECT_FALSE(p["start"].is_null()) << p.dump();
    EXPECT_FALSE(p["end"].is_null()) << p.dump();
  }
}

// Messages between the coordinator and its nodes dropped, duplicated,
// reordered, throttled, cut one way and reset, and a node restarted: the
// numbered channel turns each loss into a resumption, never a hang.
TEST(Chaos, TheLinkScheduleLosesNothingAndConfirmsEveryFault) {
  const ChaosResult r = run_chaos("configs/chaos/links.yaml");
  ASSERT_TRUE(r.report.is_object()) << r.stderr_text;
  EXPECT_EQ(r.exit_code, 0) << r.report["failures"].dump() << "\n" << r.stderr_text;
  expect_nothing_lost(r.report);
  const auto kinds = confirmed_kinds(r.report);
  for (const char* k : {"link_drop", "link_duplicate", "link_reorder", "link_bandwidth",
                        "link_reset", "link_cut", "process_restart"})
    EXPECT_TRUE(kinds.count(k)) << k;
}

TEST(Chaos, AFaultThatCannotTakeEffectFailsTheRun) {
  const ChaosResult r = run_chaos(test::data_path("chaos") / "ineffective.yaml");
  ASSERT_TRUE(r.report.is_object()) << r.stderr_text;
  EXPECT_EQ(r.exit_code, 1) << r.stderr_text;
  EXPECT_EQ(r.report["verdict"], "FAIL");
  expect_nothing_lost(r.report);  // it fails for the faults alone
  ASSERT_EQ(r.report["faults"].size(), 2u);
  for (const json& f : r.report["faults"]) {
    EXPECT_FALSE(f["confirmed"].get<bool>()) << f.dump();
    EXPECT_FALSE(f["error"].get<std::string>().empty()) << f.dump();
  }
  EXPECT_NE(r.report["faults"][0]["error"].get<std::string>().find("did not move"),
            std::string::npos)
      << r.report["faults"][0].dump();
  EXPECT_NE(r.stderr_text.find("chaos run failed"), std::string::npos) << r.stderr_text;
}

TEST(Chaos, ABadPlanIsRefusedNamingTheKey) {
  const fs::path plan =
      fs::temp_directory_path() / ("troupe-chaos-bad-" + std::to_string(getpid()) + ".yaml");
  std::ofstream(plan) << "faults:\n  - {at_s: 1, kind: proces_kill}\n";
  const ChaosResult r = run_chaos(plan);
  fs::remove(plan);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("faults[0].kind"), std::string::npos) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("process_kill"), std::string::npos) << r.stderr_text;
}

// Everything knowable from the plan and the flags is refused before anything
// starts, naming the key or the flag (each of these once started the
// deployment, or ran the plan's own request count).
TEST(Chaos, WhatThePlanOrTheFlagsGetWrongIsRefusedBeforeAnythingStarts) {
  const auto refused = [](const fs::path& plan, std::vector<std::string> args,
                          const std::string& needle) {
    const auto t0 = std::chrono::steady_clock::now();
    const ChaosResult r = run_chaos(plan, args);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.exit_code, 0) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(needle), std::string::npos) << r.stderr_text;
    EXPECT_EQ(r.stderr_text.find("terminate called"), std::string::npos) << r.stderr_text;
    EXPECT_EQ(r.stderr_text.find("starting the deployment"), std::string::npos) << r.stderr_text;
    EXPECT_LT(took, 20) << r.stderr_text;
    return r;
  };
  const fs::path quick = test::source_dir() / "configs" / "chaos" / "quick.yaml";
  EXPECT_EQ(refused(quick, {"--requests", "0"}, "--requests must be a positive").exit_code, 2);
  // What the flag parser refuses is a usage error too (it was 104-109).
  EXPECT_EQ(refused(quick, {"--requests", "x"}, "--requests").exit_code, 2);
  EXPECT_EQ(refused(quick, {"--no-such-flag"}, "--no-such-flag").exit_code, 2);
  EXPECT_EQ(refused(quick, {"--attach", "notaurl", "--admin-token", "t"},
                    "--attach 'notaurl': expected http://")
                .exit_code,
            2);
  refused(quick, {"--requests", "-5"}, "--requests must be a positive");
  refused(quick, {"--duration", "-1"}, "--duration must be a positive");
  refused(quick, {"--duration", "0"}, "--duration must be a positive");
  // node-9 of three aborted the harness (rc 134) after the fault-free pass.
  refused(write_plan("node9.yaml",
                     "deployment: {config: deployment.yaml, nodes: 3}\n"
                     "faults: [{at_s: 1, kind: process_kill, node: node-9}]\n"),
          {}, "faults[0].node");
  refused(write_plan("replica99.yaml",
                     "deployment: {config: deployment.yaml, nodes: 3}\n"
                     "faults: [{at_s: 1, kind: kill, replica: 99}]\n"),
          {}, "faults[0].replica");
  // Two nodes cannot hold three replicas: it waited ready_timeout_s (120 s).
  refused(write_plan("two-nodes.yaml",
                     "deployment: {config: deployment.yaml, nodes: 2}\n"
                     "faults: [{at_s: 1, kind: kill, replica: 0}]\n"),
          {}, "deployment.nodes");
  refused(write_plan("every0.yaml",
                     "deployment: {config: deployment.yaml, nodes: 3}\n"
                     "random: {every_s: 0, kinds: [process_kill]}\n"),
          {}, "random.every_s");
}

// A fault the load never reached is in the report as not played, and the
// run is INCOMPLETE (exit status 3), not a clean PASS.
TEST(Chaos, AFaultTheLoadNeverReachedMakesTheRunIncomplete) {
  const ChaosResult r = run_chaos(test::data_path("chaos") / "unplayed.yaml");
  ASSERT_TRUE(r.report.is_object()) << r.stderr_text;
  EXPECT_EQ(r.exit_code, 3) << r.stderr_text;
  EXPECT_EQ(r.report["verdict"], "INCOMPLETE") << r.report["failures"].dump();
  expect_nothing_lost(r.report);
  EXPECT_EQ(r.report["faults_planned"], 2);
  EXPECT_EQ(r.report["faults_played"], 1);
  ASSERT_EQ(r.report["faults"].size(), 2u);
  EXPECT_EQ(r.report["faults"][0]["played"], true);
  const json& later = r.report["faults"][1];
  EXPECT_EQ(later["played"], false) << later.dump();
  EXPECT_EQ(later["kind"], "step_error");
  EXPECT_NE(later["not_played"].get<std::string>().find("the load ended at"), std::string::npos)
      << later.dump();
  // The windows stay within the load.
  const double load = r.report["load_s"];
  EXPECT_LE(r.report["faults"][0]["window_end_s"].get<double>(), load + 1e-9);
  EXPECT_NE(r.stdout_text.find("verdict: INCOMPLETE"), std::string::npos) << r.stdout_text;
  EXPECT_NE(r.stdout_text.find("not played"), std::string::npos) << r.stdout_text;
  // Said before the run, too.
  EXPECT_NE(r.stderr_text.find("warning: the load should end near"), std::string::npos)
      << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("chaos run incomplete"), std::string::npos) << r.stderr_text;
}

// The pids whose parent is `pid`, from /proc.
std::vector<int> children_of(int pid) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text;
    std::getline(stat, text);
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

// Gone, or a zombie nobody reaped yet: not running, not stopped.
bool dead(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() &&
         (text[close + 2] == 'Z' || text[close + 2] == 'X');
}

// kill -9 of troupe chaos while it holds a node stopped: the node (and the
// coordinator) die with it instead of living on, stopped, as orphans.
TEST(Chaos, ItsProcessesDieWithTheHarnessEvenAStoppedNode) {
  const test::TempDir tmp;
  const fs::path dir = tmp / "run";
  ChildProcess p(
      {test::troupe_binary(), "chaos", (test::data_path("chaos") / "stopped-node.yaml").string(),
       "--duration", "60", "--run-dir", dir.string()},
      "", test::source_dir().string());
  ASSERT_NE(p.wait_for_line("fault 0: process_stop node-1", 120), "") << p.stderr_so_far();
  const std::vector<int> kids = children_of(p.pid());
  ASSERT_EQ(kids.size(), 2u) << p.stderr_so_far();  // the coordinator and node-1
  bool stopped = false;
  for (int i = 0; i < 100 && !stopped; ++i) {
    for (int k : kids) {
      std::ifstream stat("/proc/" + std::to_string(k) + "/stat");
      std::string text;
      std::getline(stat, text);
      const size_t close = text.rfind(')');
      stopped = stopped || (close != std::string::npos && text[close + 2] == 'T');
    }
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(stopped) << "no child was stopped";
  p.signal(SIGKILL);
  EXPECT_EQ(p.wait_exit(10), 128 + SIGKILL);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int k : kids) {
    while (!dead(k) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(dead(k)) << "pid " << k << " outlived the harness";
    if (!dead(k)) ::kill(k, SIGKILL);
  }
}

// The same for any ChildProcess, when the thread that started it has
// ended (a node restarted by the fault thread): the child lives on while
// its parent does, and dies with it, stopped or not.
TEST(ChildProcess, DiesWithItsParentNotWithTheThreadThatStartedIt) {
  // Orphans come to this process, which can then see how they ended.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    close(fds[0]);
    int pid = -1;
    std::unique_ptr<ChildProcess> child;
    std::thread([&] {
      child = std::make_unique<ChildProcess>(std::vector<std::string>{"/bin/sleep", "300"});
      pid = child->pid();
    }).join();
    // The thread that started it is gone; it still runs.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (!child->running()) pid = -2;
    child->signal(SIGSTOP);
    if (write(fds[1], &pid, sizeof pid) != sizeof pid) _exit(3);
    for (;;) pause();
  }
  close(fds[1]);
  int pid = 0;
  ASSERT_EQ(read(fds[0], &pid, sizeof pid), ssize_t(sizeof pid));
  close(fds[0]);
  ASSERT_GT(pid, 0) << (pid == -2 ? "the child died with the thread that started it" : "");
  ::kill(parent, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(parent, &status, 0), parent);
  bool reaped = false;
  for (int i = 0; i < 200 && !reaped; ++i) {
    reaped = waitpid(pid, &status, WNOHANG) == pid;
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (!reaped) {
    ::kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(reaped) << "the stopped child outlived its parent";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

// ---- the admin endpoint over real HTTP ----

TEST(AdminOverHttp, AbsentByDefault) {
  test::Server s({});
  EXPECT_EQ(test::http_request(s.port(), "GET", "/admin/faults").status, 404);
  EXPECT_EQ(test::http_request(s.port(), "POST", "/admin/faults",
                               R"({"kind":"slow","replica":0,"factor":2,"duration_s":1})", 10,
                               {{"Authorization", "Bearer anything"}})
                .status,
            404);
}

TEST(AdminOverHttp, RefusedWithoutTheTokenAndTakesFaultsWithIt) {
  test::Server s({"admin.faults=true", "admin.token=s3cret",
                  R"(server.allowed_origins=["http://ui.example"])"});
  const std::string body = R"({"kind":"slow","replica":0,"factor":3,"duration_s":1})";
  // Pages may call the API (the configured origin is echoed) but never the
  // admin endpoints: their answers carry no CORS header, preflight included.
  const HttpHeaders page{{"Origin", "http://ui.example"},
                         {"Access-Control-Request-Method", "POST"}};
  EXPECT_EQ(test::http_request(s.port(), "GET", "/v1/models", "", 10, page)
                .header("Access-Control-Allow-Origin"),
            "http://ui.example");
  EXPECT_EQ(test::http_request(s.port(), "GET", "/v1/models", "", 10,
                               {{"Origin", "http://other.example"}})
                .header("Access-Control-Allow-Origin"),
            "");
  const HttpResponse admin_preflight =
      test::http_request(s.port(), "OPTIONS", "/admin/faults", "", 10, page);
  EXPECT_EQ(admin_preflight.status, 204);
  EXPECT_EQ(admin_preflight.header("Allow"), "GET, HEAD, POST");
  EXPECT_EQ(admin_preflight.header("Access-Control-Allow-Origin"), "");
  EXPECT_EQ(test::http_request(s.port(), "GET", "/admin/faults", "", 10, page)
                .header("Access-Control-Allow-Origin"),
            "");
  EXPECT_EQ(test::http_request(s.port(), "GET", "/admin/faults").status, 401);
  EXPECT_EQ(test::http_request(s.port(), "POST", "/admin/faults", body).status, 401);
  EXPECT_EQ(test::http_request(s.port(), "POST", "/admin/faults", body, 10,
                               {{"Authorization", "Bearer s3crex"}})
                .status,
            401);
  const HttpHeaders auth{{"Authorization", "Bearer s3cret"}};
  EXPECT_EQ(test::http_request(s.port(), "POST", "/admin/faults", "{not json", 10, auth).status,
            400);
  const HttpResponse added = test::http_request(s.port(), "POST", "/admin/faults", body, 10, auth);
  ASSERT_EQ(added.status, 201) << added.body;
  const json fault = json::parse(added.body);
  // Slowed steps show once requests run; the listing has it.
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(s.complete({{"prompt", "Love is"}, {"max_tokens", 8}, {"temperature", 0}}).status,
              200);
  const HttpResponse listed = test::http_request(s.port(), "GET", "/admin/faults", "", 10, auth);
  ASSERT_EQ(listed.status, 200) << listed.body;
  const json j = json::parse(listed.body);
  ASSERT_TRUE(j["faults"].is_array());
  bool found = false;
  for (const json& f : j["faults"]) found = found || f["id"] == fault["id"];
  EXPECT_TRUE(found) << listed.body;
}

// Attached with the wrong token (or to a server with fault injection off),
// a plan of runtime faults is refused before its load, not after it.
TEST(AdminOverHttp, AttachingWithAWrongTokenIsRefusedBeforeTheLoad) {
  test::Server on({"admin.faults=true", "admin.token=s3cret"});
  test::Server off({});
  const fs::path plan = write_plan("attach.yaml",
                                   "workload: {requests: 2000, distinct: 10, max_tokens: 8}\n"
                                   "faults: [{at_s: 1, kind: slow, replica: 0, factor: 2, "
                                   "duration_s: 1}]\n");
  const auto attach = [&](int port, const std::string& token) {
    const auto t0 = std::chrono::steady_clock::now();
    const ChaosResult r = run_chaos(
        plan, {"--attach", "http://127.0.0.1:" + std::to_string(port), "--admin-token", token});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20)
        << "the load ran first: " << r.stderr_text;
    EXPECT_EQ(r.exit_code, 1) << r.stderr_text;
    EXPECT_EQ(r.stderr_text.find("fault-free pass"), std::string::npos) << r.stderr_text;
    EXPECT_EQ(r.stderr_text.find("logs in"), std::string::npos)
        << "attached, the harness has no logs of its own: " << r.stderr_text;
    return r.stderr_text;
  };
  EXPECT_NE(attach(on.port(), "wrong").find("refused the admin token"), std::string::npos);
  EXPECT_NE(attach(off.port(), "s3cret").find("fault injection off"), std::string::npos);
}

// A running deployment that needs an API key: attached with it (and the
// admin token), the fault-free pass, the load and the fault all go through.
TEST(AdminOverHttp, AttachingToADeploymentWithAnApiKey) {
  test::Server s({"admin.faults=true", "admin.token=s3cret", "server.api_key=k-42"});
  const fs::path plan = write_plan("attach-key.yaml",
                                   "workload: {requests: 24, distinct: 6, max_tokens: 8}\n"
                                   "faults: [{at_s: 0.2, kind: slow, replica: 0, factor: 2, "
                                   "duration_s: 1}]\n");
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port());
  const ChaosResult r = run_chaos(
      plan, {"--attach", url, "--admin-token", "s3cret", "--api-key", "k-42", "--duration", "2"});
  ASSERT_TRUE(r.report.is_object()) << r.stderr_text;
  EXPECT_EQ(r.exit_code, 0) << r.report["failures"].dump() << "\n" << r.stderr_text;
  EXPECT_GT(r.report["counts"]["requests"].get<int>(), 0);
  const ChaosResult refused = run_chaos(plan, {"--attach", url, "--admin-token", "s3cret"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.stderr_text.find("401"), std::string::npos) << refused.stderr_text;
}

TEST(AdminOverHttp, FaultsWithoutATokenAreRefusedAtStart) {
  const test::Refusal r = test::serve_until_exit({"admin.faults=true"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("admin.token"), std::string::npos) << r.stderr_text;
}

}  // namespace
}  // namespace troupe
