#include "chaos/runner.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "chaos/attribution.h"
#include "chaos/client.h"
#include "chaos/deployment.h"
#include "chaos/workload.h"
#include "net/admin_client.h"
#include "net/http_client.h"

namespace troupe::chaos {

namespace {

using json = nlohmann::json;

// A death or a resume this long after a fault's window is still its doing.
constexpr double kAttributeS = 3;
// Random faults drawn for a random.until_s the load never reached are
// listed as not played, up to this many.
constexpr size_t kMaxUnplayedRandom = 10000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

// The first error of any of the run's threads, to end the run with.
class RunError {
 public:
  // Runs `body`; an exception it throws is kept (the first one) and
  // stops the run instead of leaving the thread (which would terminate the
  // process with its children still running).
  template <class F>
  void guard(const char* where, F&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      keep(std::string(where) + ": " + e.what());
    } catch (...) {
      keep(std::string(where) + ": an unknown exception");
    }
  }
  bool failed() const { return failed_; }
  void rethrow() {
    std::lock_guard<std::mutex> l(mu_);
    if (failed_) throw std::runtime_error(what_);
  }

 private:
  void keep(std::string what) {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_) what_ = std::move(what);
    failed_ = true;
  }
  std::mutex mu_;
  std::string what_;
  std::atomic<bool> failed_{false};
};

// What the harness reads from /metrics.
struct MetricsView {
  bool ok = false;
  int live_replicas = 0;
  std::vector<int> live;      // which replicas are ready
  std::vector<int> given_up;  // which supervision gave up on
  std::set<int> known;        // every replica the coordinator has a state for
  double detections = 0;      // nodes declared dead
  double restarts = 0;        // replicas restarted
  double cancelled = 0;       // requests_total{status="499"}
  int kv_used = 0;
  std::map<std::string, bool> node_live;  // by node name: a member (else declared dead)
};

double sample_value(const std::string& line) {
  const size_t sp = line.rfind(' ');
  return sp == std::string::npos ? 0 : std::atof(line.c_str() + sp + 1);
}

MetricsView read_metrics(const ServerEndpoint& e) {
  MetricsView m;
  const HttpResponse r = e.call("GET", "/metrics", "", 5);
  if (r.status != 200) return m;
  m.ok = true;
  std::istringstream in(r.body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const double v = sample_value(line);
    if (line.rfind("troupe_replica_state{", 0) == 0) {
      const size_t q = line.find("replica=\"");
      const int r = q == std::string::npos ? -1 : std::atoi(line.c_str() + q + 9);
      if (r >= 0) m.known.insert(r);
      if (v == 2) {
        ++m.live_replicas;
        if (r >= 0) m.live.push_back(r);
      }
      if (v == 3 && r >= 0) m.given_up.push_back(r);
    }
    if (line.rfind("troupe_node_detections_total{", 0) == 0) m.detections += v;
    if (constexpr std::string_view live = "troupe_node_live{node=\""; line.rfind(live, 0) == 0) {
      const size_t from = live.size(), to = line.find('"', from);
      if (to != std::string::npos) m.node_live[line.substr(from, to - from)] = v == 1;
    }
    if (line.rfind("troupe_replica_restarts_total{", 0) == 0) m.restarts += v;
    if (line.rfind("troupe_requests_total{status=\"499\"}", 0) == 0) m.cancelled += v;
    if (line.rfind("troupe_kv_blocks{", 0) == 0 && line.find("state=\"used\"") != std::string::npos)
      m.kv_used += int(v);
  }
  return m;
}

std::string served_model(const ServerEndpoint& e) {
  const HttpResponse r = e.call("GET", "/v1/models");
  const json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty())
    throw std::runtime_error("GET /v1/models failed (" + std::to_string(r.status) +
                             "): " + r.body.substr(0, 200));
  return j["data"][0].value("id", "");
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", s);
  return text;
}

// A fault's target as the plan names it (before it is played).
std::string planned_target(const FaultPlan& p) {
  const FaultKindInfo* k = find_fault_kind(p.kind);
  if (!k) return "";
  if (k->family == "process" || k->family == "link") return p.node;
  if (k->family == "http") return std::to_string(p.count) + " streaming client(s)";
  return p.replica >= 0
             ? "replica " + std::to_string(p.replica) + (p.kind == "kill" ? " " + p.role : "")
             : std::string("a replica that is up");
}

// ---- faults as the harness tracks them ----

struct Tracked {
  FaultPlan plan;
  size_t number = 0;       // in the run's order
  FaultRecord rec;         // read and written under the run's lock
  std::string node;        // process and link faults
  int starts = 0;          // the node process it acted on (a restart makes another)
  int link_fault = -1;     // LinkProxy fault id
  LinkCounters before;     // link counters at injection
  uint64_t admin_id = 0;   // runtime faults
  double admin_added = 0;  // its book time at injection
  double end_s = -1;       // lasting faults: when to undo it
  bool ended = false;
  double baseline_cancel = 0;
  bool capacity_dropped = false;
  int claims = 0, claims_done = 0;  // HTTP faults: clients that took it, and finished
};

}  // namespace

uint64_t link_effect(const FaultPlan& p, const LinkCounters& now, const LinkCounters& before,
                     std::string* what) {
  const auto delta = [&](uint64_t LinkDirectionCounters::*f) {
    return (now.to_upstream.*f - before.to_upstream.*f) + (now.to_client.*f - before.to_client.*f);
  };
  uint64_t n = 0;
  if (p.kind == "link_delay")
    n = delta(&LinkDirectionCounters::chunks_delayed), *what = "chunks delayed";
  if (p.kind == "link_drop")
    n = delta(&LinkDirectionCounters::frames_dropped), *what = "messages dropped";
  if (p.kind == "link_duplicate")
    n = delta(&LinkDirectionCounters::frames_duplicated), *what = "messages duplicated";
  if (p.kind == "link_reorder")
    n = delta(&LinkDirectionCounters::frames_reordered), *what = "messages reordered";
  if (p.kind == "link_cut") {
    // Each direction counts the wall time it was cut; a cut of both is one
    // span of time, not the sum of two.
    const uint64_t up = (now.to_upstream.cut_us - before.to_upstream.cut_us) / 1000;
    const uint64_t down = (now.to_client.cut_us - before.to_client.cut_us) / 1000;
    n = std::max(up, down);
    *what = "ms cut";
    if (p.direction == "both")
      *what += " (to coordinator " + std::to_string(up) + " ms, to node " + std::to_string(down) +
               " ms)";
  }
  if (p.kind == "link_bandwidth")
    n = delta(&LinkDirectionCounters::bytes_throttled), *what = "bytes throttled";
  if (p.kind == "link_reset")
    n = now.connections_reset - before.connections_reset, *what = "connections reset";
  return n;
}

namespace {

LinkFault to_link_fault(const FaultPlan& p, uint64_t seed) {
  LinkFault f;
  const std::string& k = p.kind;
  f.kind = k == "link_delay"       ? LinkFault::Kind::Delay
           : k == "link_drop"      ? LinkFault::Kind::Drop
           : k == "link_duplicate" ? LinkFault::Kind::Duplicate
           : k == "link_reorder"   ? LinkFault::Kind::Reorder
           : k == "link_cut"       ? LinkFault::Kind::Cut
                                   : LinkFault::Kind::Bandwidth;
  f.direction = p.direction == "to_coordinator" ? LinkDirection::ToUpstream
                : p.direction == "to_node"      ? LinkDirection::ToClient
                                                : LinkDirection::Both;
  f.delay_s = p.delay_s;
  f.probability = p.probability;
  f.bytes_per_s = p.bytes_per_s;
  f.seed = seed;
  return f;
}

// Draws the random faults' next one from the seed.
class RandomFaultSource {
 public:
  RandomFaultSource(const RandomFaults& r, uint64_t seed) : r_(r), rng_(seed ^ 0xC4A05ull) {
    next_ = r_.from_s;
    advance();
  }
  bool enabled() const { return r_.every_s > 0 && !r_.kinds.empty(); }
  double next_time() const { return next_; }
  FaultPlan take() {
    FaultPlan f;
    f.at_s = next_;
    f.kind = r_.kinds[std::uniform_int_distribution<size_t>(0, r_.kinds.size() - 1)(rng_)];
    const FaultKindInfo* k = find_fault_kind(f.kind);
    if (k && k->lasts) f.duration_s = r_.duration_s;
    static const char* const kRoles[] = {"worker", "batcher"};
    f.role = kRoles[rng_() % 2];
    if (f.kind == "link_drop" || f.kind == "link_duplicate" || f.kind == "link_reorder")
      f.probability = 0.3;
    if (f.kind == "client_disconnect" || f.kind == "client_slow") f.count = 1 + int(rng_() % 3);
    if (f.kind == "client_slow") f.bytes_per_s = 400;
    f.restart_after_s = 1;
    f.replica = -1;
    f.node = "any";
    pick_ = rng_();
    advance();
    return f;
  }
  uint64_t pick() const { return pick_; }  // for targets chosen among what is up

 private:
  // Spread evenly around the mean (half to one and a half times it): faults
  // come steadily, neither in bursts nor with long quiet spells.
  void advance() { next_ += std::uniform_real_distribution<double>(0.5, 1.5)(rng_) * r_.every_s; }
  RandomFaults r_;
  std::mt19937_64 rng_;
  double next_ = 0;
  uint64_t pick_ = 0;
};

// ---- the run ----

class Run {
 public:
  Run(const ChaosOptions& o) : o_(o), plan_(o.plan), rng_(plan_.seed ^ 0x5EEDull) {}

  ChaosRun go();

 private:
  void say(const std::string& s) {
    if (o_.log) o_.log(s);
  }
  double now() const { return seconds_since(t0_); }
  void baseline(const Workload& w);
  void load(const Workload& w);
  void faults(const Workload& w);
  void poll();
  void inject(Tracked& t);
  void undo(Tracked& t);
  void check_admin_faults();
  void check_admin_access();
  void attribute_resumes();
  std::vector<FaultWindow> windows() const;  // the faults as chaos/attribution.h sees them
  MetricsView last_metrics() {
    std::lock_guard<std::mutex> l(mu_);
    return last_metrics_;
  }
  // Replicas ready when the load began, not ready now, that supervision
  // has not given up on (an attached server's replica down from the start
  // is none of the run's doing).
  std::vector<int> down_replicas(const MetricsView& m) const {
    std::vector<int> down;
    for (int r : live_at_start_)
      if (std::find(m.live.begin(), m.live.end(), r) == m.live.end() &&
          std::find(m.given_up.begin(), m.given_up.end(), r) == m.given_up.end())
        down.push_back(r);
    return down;
  }
  // Every node process of the deployment is running (attached: no process
  // faults, so they are as they were). One a fault killed for good keeps its
  // exited process.
  bool every_node_back() {
    if (!deployment_) return true;
    for (const std::string& name : deployment_->node_names()) {
      const auto& process = deployment_->node(name).process;
      if (!process || !process->running()) return false;
    }
    return true;
  }
  // Writes a fault's record (and its admin id) under the lock the poller reads it with.
  void commit(Tracked& t, const std::function<void(FaultRecord&)>& write) {
    std::lock_guard<std::mutex> l(mu_);
    write(t.rec);
  }
  std::string pick_node(const FaultPlan& p, uint64_t pick);
  ClientFaults claim_client_fault(bool stream, Tracked** who);

  const ChaosOptions& o_;
  ChaosPlan plan_;
  std::mt19937_64 rng_;
  std::unique_ptr<Deployment> deployment_;
  ServerEndpoint http_;  // the coordinator over HTTP
  std::string model_;
  int replicas_ = 1;
  // What the poller saw last: detections + restarts, and ready replicas.
  double seen_detect_ = -1;
  int seen_live_ = -1;
  std::map<std::string, bool> seen_nodes_;  // the last poll's node_live
  Clock::time_point t0_;
  ChaosRun out_;
  std::vector<Expected> expected_;

  std::mutex mu_;  // guards what follows
  std::deque<Tracked> tracked_;
  std::vector<Tracked*> http_waiting_;  // HTTP faults with clients still to take them
  std::atomic<bool> load_done_{false};
  RunError error_;
  double load_end_s_ = -1;
  std::vector<FaultPlan> unplayed_;  // due after the load ended (the fault thread's)
  std::atomic<int> client_cancels_{0};
  MetricsView last_metrics_;
  std::vector<int> live_at_start_;  // replicas ready when the load began
  double start_cancelled_ = 0;
  double book_offset_ = 0;
  std::vector<std::pair<double, double>> resumes_;  // (death seen, next token), our clock
};

ChaosRun Run::go() {
  const Workload w = make_workload(plan_.workload, plan_.seed);
  if (o_.attach.empty()) {
    say("starting the deployment (" + std::to_string(plan_.deployment.nodes) + " node processes)");
    deployment_ = std::make_unique<Deployment>(plan_, o_.exe, o_.run_dir);
    http_.port = std::to_string(deployment_->http_port());
    http_.token = deployment_->admin_token();
    http_.api_key = o_.api_key;
    replicas_ = deployment_->replicas();
  } else {
    const std::string a = o_.attach.substr(
        o_.attach.find("://") == std::string::npos ? 0 : o_.attach.find("://") + 3);
    const size_t colon = a.rfind(':');
    http_.host = a.substr(0, colon);
    http_.port = a.substr(colon + 1, a.find('/', colon) - colon - 1);
    http_.token = o_.admin_token;
    http_.api_key = o_.api_key;
    const MetricsView m = read_metrics(http_);
    if (!m.ok)
      throw std::runtime_error("GET " + o_.attach + "/metrics failed: is it a troupe serve?");
    replicas_ = std::max<int>(1, int(m.known.size()));
    // What the plan asks of it, before the fault-free pass.
    check_plan_replicas(plan_, int(m.known.size()), 0, "the deployment at " + o_.attach);
    check_admin_access();
  }
  model_ = served_model(http_);
  say("fault-free pass over " + std::to_string(w.pool.size()) + " distinct requests");
  baseline(w);
  say("baseline " + std::to_string(int(out_.records.baseline_tokens_per_s)) +
      " tok/s; running the load with faults");
  t0_ = Clock::now();
  last_metrics_ = read_metrics(http_);
  live_at_start_ = last_metrics_.live;
  start_cancelled_ = last_metrics_.cancelled;
  out_.records.resources_start =
      deployment_ ? deployment_->resources(last_metrics_.kv_used) : std::vector<ResourceSample>{};
  out_.resource_series.emplace_back(0, out_.records.resources_start);
  std::thread poller([this] {
    error_.guard("the metrics poller", [&] {
      double next_sample = o_.sample_every_s;
      while (!load_done_ && !error_.failed()) {
        poll();
        if (deployment_ && now() >= next_sample) {
          out_.resource_series.emplace_back(now(), deployment_->resources(last_metrics_.kv_used));
          next_sample += o_.sample_every_s;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  });
  std::thread driver([this, &w] { error_.guard("the fault driver", [&] { faults(w); }); });
  error_.guard("the load", [&] { load(w); });
  load_end_s_ = now();
  load_done_ = true;
  driver.join();
  poller.join();
  // The run cannot be judged; the deployment goes with the exception.
  error_.rethrow();
  // Lasting faults are over; give the last ones a moment to show their
  // effect (10 s), and replicas that supervision is still bringing back a
  // moment to come back (20 s: a start the coordinator must ask about
  // again takes seconds).
  const bool nodes_back = every_node_back();
  for (int i = 0; i < 200; ++i) {
    poll();
    check_admin_faults();
    bool pending = false;
    if (i < 100) {
      std::lock_guard<std::mutex> l(mu_);
      for (const Tracked& t : tracked_)
        pending =
            pending || (t.rec.confirmed_s < 0 && t.rec.error.empty() && t.rec.not_played.empty());
    }
    const MetricsView m = last_metrics();
    pending = pending || (nodes_back && m.ok && !down_replicas(m).empty());
    if (!pending) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  check_admin_faults();
  attribute_resumes();
  const std::string ended = "the load ended at " + seconds_text(load_end_s_) + " s";
  for (Tracked& t : tracked_) {
    if (t.rec.confirmed_s < 0 && t.rec.error.empty() && t.rec.not_played.empty())
      t.rec.error = "no effect was observed";
    out_.records.faults.push_back(t.rec);
  }
  // Every planned fault is in the report: those the load never reached too.
  for (const FaultPlan& p : unplayed_) {
    FaultRecord r;
    r.kind = p.kind;
    r.target = planned_target(p);
    r.planned_s = p.at_s;
    r.duration_s = p.duration_s;
    r.not_played = ended;
    out_.records.faults.push_back(std::move(r));
  }
  out_.records.load_end_s = load_end_s_;
  out_.records.duration_s = now();
  out_.records.deadline_s = plan_.workload.deadline_s;
  out_.records.expected = expected_;
  const MetricsView end = read_metrics(http_);
  if (end.ok) {
    out_.records.down_at_end = down_replicas(end);
    out_.records.given_up_at_end = end.given_up;
  }
  out_.records.every_node_back = nodes_back;
  out_.records.resources_end =
      deployment_ ? deployment_->resources(end.kv_used) : std::vector<ResourceSample>{};
  out_.client_cancels = client_cancels_;
  out_.server_cancels = int(end.cancelled - start_cancelled_);
  return std::move(out_);
}

void Run::baseline(const Workload& w) {
  // Each distinct request once, streamed as its first use is, none cancelled.
  std::vector<RequestSpec> first(w.pool.size());
  for (size_t i = 0; i < w.pool.size(); ++i) first[i] = w.requests[i];
  expected_.assign(w.pool.size(), {});
  std::atomic<size_t> next{0};
  std::vector<std::string> failures;
  std::mutex fmu;
  size_t tokens = 0;
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int c = 0; c < plan_.workload.concurrency; ++c)
    workers.emplace_back([&] {
      error_.guard("the fault-free pass", [&] {
        HttpClient client([&] {
          HttpClient::Options opt;
          opt.host = http_.host;
          opt.port = http_.port;
          opt.headers = bearer_headers(http_.api_key);
          return opt;
        }());
        for (size_t i; (i = next++) < first.size();) {
          RequestSpec s = first[i];
          s.cancel_after = -1;
          const RequestRecord r =
              run_request(client, request_body(w.pool[s.distinct], s.stream, model_), s, {},
                          plan_.workload.deadline_s, start);
          std::lock_guard<std::mutex> l(fmu);
          if (r.status != 200 || r.transport != Transport::Complete) {
            failures.push_back("request " + std::to_string(i) + ": status " +
                               std::to_string(r.status) + " " + r.error);
            continue;
          }
          expected_[s.distinct] = {r.tokens, r.finish_reason};
          tokens += r.tokens.size();
        }
      });
    });
  for (auto& t : workers) t.join();
  error_.rethrow();
  if (!failures.empty())
    throw std::runtime_error(
        "the fault-free pass failed for " + std::to_string(failures.size()) +
        " request(s), so there is nothing to compare with; first: " + failures[0]);
  const double capacity = double(tokens) / std::max(1e-9, seconds_since(start));
  out_.records.baseline_tokens_per_s = capacity;
  out_.records.baseline_basis = "closed loop";
  if (plan_.workload.rate > 0 && !w.requests.empty()) {
    double expected_tokens = 0;
    for (const RequestSpec& s : w.requests) expected_tokens += expected_[s.distinct].tokens.size();
    const double offered = plan_.workload.rate * expected_tokens / double(w.requests.size());
    if (offered <= capacity) {
      out_.records.baseline_tokens_per_s = offered;
      out_.records.baseline_basis = "offered load";
    }
  }
}

ClientFaults Run::claim_client_fault(bool stream, Tracked** who) {
  ClientFaults f;
  *who = nullptr;
  if (!stream) return f;
  std::lock_guard<std::mutex> l(mu_);
  for (Tracked* t : http_waiting_) {
    if (t->claims >= t->plan.count) continue;
    ++t->claims;
    *who = t;
    if (t->plan.kind == "client_disconnect") f.disconnect = true;
    if (t->plan.kind == "client_slow") f.slow_bytes_per_s = t->plan.bytes_per_s;
    break;
  }
  return f;
}

void Run::load(const Workload& w) {
  const WorkloadPlan& wp = plan_.workload;
  const bool timed = o_.duration_s > 0;
  const size_t total = timed ? SIZE_MAX : w.requests.size();
  // The next request and, in an open loop, its send time, drawn from the
  // seed in request order (also for a timed run, which has no last one).
  std::mutex amu;
  std::mt19937_64 arrival_rng(plan_.seed ^ 0xA771ull);
  size_t next = 0;
  double next_at = 0;
  const auto take = [&](size_t& i, double& at) {
    std::lock_guard<std::mutex> l(amu);
    if (next >= total) return false;
    i = next++;
    at = next_at;
    if (wp.rate > 0) next_at += std::exponential_distribution<double>(wp.rate)(arrival_rng);
    return true;
  };
  std::mutex rmu;
  std::vector<std::thread> workers;
  for (int c = 0; c < wp.concurrency; ++c)
    workers.emplace_back([&] {
      error_.guard("a client of the load", [&] {
        HttpClient::Options opt;
        opt.host = http_.host;
        opt.port = http_.port;
        opt.headers = bearer_headers(http_.api_key);
        opt.io_timeout_s = wp.deadline_s;
        HttpClient client(opt);
        HttpClient::Options slow_opt = opt;
        slow_opt.read_chunk_bytes = 64;
        size_t i = 0;
        double at = 0;
        while (!error_.failed() && take(i, at)) {
          if (wp.rate > 0) sleep_s(at - now());
          if (timed && now() >= o_.duration_s) break;
          RequestSpec s = w.requests[i % w.requests.size()];
          s.index = i;
          Tracked* who = nullptr;
          const ClientFaults cf = claim_client_fault(s.stream, &who);
          const std::string body = request_body(w.pool[s.distinct], s.stream, model_);
          RequestRecord r;
          if (cf.slow_bytes_per_s > 0) {
            HttpClient slow(slow_opt);
            r = run_request(slow, body, s, cf, wp.deadline_s, t0_);
          } else {
            r = run_request(client, body, s, cf, wp.deadline_s, t0_);
          }
          if (r.transport == Transport::CancelledByUs) ++client_cancels_;
          // The record's index is its expected output's.
          r.index = s.distinct;
          if (who) {
            std::lock_guard<std::mutex> l(mu_);
            ++who->claims_done;
          }
          std::lock_guard<std::mutex> l(rmu);
          out_.records.requests.push_back(std::move(r));
        }
      });
    });
  for (auto& t : workers) t.join();
}

std::string Run::pick_node(const FaultPlan& p, uint64_t pick) {
  if (!deployment_) return "";
  if (p.node != "any") return p.node;
  std::vector<std::string> up;
  for (const std::string& n : deployment_->node_names())
    if (deployment_->node(n).process && deployment_->node(n).process->running() &&
        process_state(deployment_->node(n).process->pid()) != 'T')
      up.push_back(n);
  if (up.empty()) return "";
  return up[pick % up.size()];
}

void Run::faults(const Workload&) {
  RandomFaultSource random(plan_.random, plan_.seed);
  std::vector<FaultPlan> listed = plan_.faults;
  std::sort(listed.begin(), listed.end(),
            [](const FaultPlan& a, const FaultPlan& b) { return a.at_s < b.at_s; });
  size_t li = 0;
  const double until = plan_.random.until_s;
  while (!load_done_ && !error_.failed()) {
    // Undo what is due (only this thread adds to tracked_, so its
    // elements stay put while it walks them).
    for (Tracked& t : tracked_)
      if (!t.ended && t.end_s >= 0 && now() >= t.end_s) undo(t);
    std::optional<FaultPlan> due;
    uint64_t pick = rng_();
    if (li < listed.size() && now() >= listed[li].at_s) {
      due = listed[li++];
    } else if (random.enabled() && (until <= 0 || random.next_time() <= until) &&
               now() >= random.next_time()) {
      due = random.take();
      pick = random.pick();
    }
    if (due) {
      Tracked* t = nullptr;
      {
        std::lock_guard<std::mutex> l(mu_);
        tracked_.emplace_back();
        t = &tracked_.back();
        t->plan = *due;
        t->number = tracked_.size() - 1;
        t->rec.kind = due->kind;
        t->rec.duration_s = due->duration_s;
        t->rec.planned_s = due->at_s;
        t->rec.injected_s = now();
        t->baseline_cancel = last_metrics_.cancelled;
      }
      const FaultKindInfo* k = find_fault_kind(due->kind);
      if (k->family == "process" || k->family == "link") {
        t->node = pick_node(*due, pick);
        if (t->node.empty()) {
          commit(*t, [&](FaultRecord& r) {
            r.target = due->node;
            r.error = deployment_ ? "no node process is up to take it"
                                  : "process and link faults need a deployment troupe chaos "
                                    "started (not --attach)";
          });
          t->ended = true;
          continue;
        }
      }
      if (k->family == "runtime" && t->plan.replica < 0) {
        // A replica that is up, so that the fault can take effect now.
        std::lock_guard<std::mutex> l(mu_);
        const std::vector<int>& live = last_metrics_.live;
        t->plan.replica = live.empty() ? int(pick % replicas_) : live[pick % live.size()];
      }
      inject(*t);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The load is over: undo whatever still lasts, so the end state is whole.
  for (Tracked& t : tracked_)
    if (!t.ended && t.end_s >= 0) undo(t);
  // What the plan had for later was never played: listed faults, and the
  // random ones drawn before random.until_s (none when it runs until the
  // load ends).
  for (; li < listed.size(); ++li) unplayed_.push_back(listed[li]);
  if (random.enabled() && until > 0)
    for (size_t n = 0; n < kMaxUnplayedRandom && random.next_time() <= until; ++n)
      unplayed_.push_back(random.take());
}

// Runs on the fault thread without the lock (killing a process waits for
// it); what the poller reads is written through commit().
void Run::inject(Tracked& t) {
  const FaultPlan& p = t.plan;
  const std::string& k = p.kind;
  const double at = t.rec.injected_s;
  if (find_fault_kind(k)->lasts || k == "process_stop") t.end_s = at + p.duration_s;
  say("t=" + std::to_string(int(at)) + "s fault " + std::to_string(t.number) + ": " + k +
      (t.node.empty() ? "" : " " + t.node));
  const auto confirm = [&](const std::string& what) {
    commit(t, [&](FaultRecord& r) {
      r.confirmed_s = now();
      r.confirmation = what;
    });
  };
  const auto fail = [&](const std::string& why) {
    commit(t, [&](FaultRecord& r) { r.error = why; });
    t.ended = true;
  };
  if (k.rfind("process_", 0) == 0) {
    NodeProcess& n = deployment_->node(t.node);
    commit(t, [&](FaultRecord& r) { r.target = t.node; });
    if (!n.process || !n.process->running()) return fail(t.node + " is not running");
    const int pid = n.process->pid();
    t.starts = n.starts;
    if (k == "process_stop") {
      n.process->signal(SIGSTOP);
      for (int i = 0; i < 100 && process_state(pid) != 'T'; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (process_state(pid) != 'T') return fail("pid " + std::to_string(pid) + " did not stop");
      return confirm("pid " + std::to_string(pid) + " stopped (state T)");
    }
    n.process->signal(k == "process_kill" ? SIGKILL : SIGTERM);
    n.process->signal(SIGCONT);  // a stopped process takes SIGTERM only once it runs
    const int code = n.process->wait_exit(15);
    if (code < 0) return fail("pid " + std::to_string(pid) + " did not exit");
    std::string what =
        "pid " + std::to_string(pid) + " exited (" +
        (code > 128 ? "signal " + std::to_string(code - 128) : "code " + std::to_string(code)) +
        ")";
    if (k == "process_restart") {
      deployment_->start_node(n);
      what += "; started again as pid " + std::to_string(n.process->pid());
      t.ended = true;
    } else if (p.restart_after_s >= 0) {
      t.end_s = at + p.restart_after_s;  // undo() starts it again
    } else {
      t.ended = true;
    }
    return confirm(what);
  }
  if (k.rfind("link_", 0) == 0) {
    LinkProxy& link = *deployment_->node(t.node).link;
    commit(t, [&](FaultRecord& r) {
      r.target =
          t.node + " <-> coordinator" + (p.direction == "both" ? "" : " (" + p.direction + ")");
    });
    t.before = link.counters();
    if (k == "link_reset") {
      link.reset_connections();
      t.ended = true;
      std::string what;
      const uint64_t n = link_effect(p, link.counters(), t.before, &what);
      return n > 0 ? confirm(std::to_string(n) + " " + what) : fail("no connection to reset");
    }
    try {
      t.link_fault = link.add(to_link_fault(p, plan_.seed + t.number));
    } catch (const std::exception& e) {
      fail(e.what());
    }
    return;
  }
  if (k == "client_disconnect" || k == "client_slow") {
    commit(t, [&](FaultRecord& r) {
      r.target = std::to_string(p.count) + " streaming client(s)";
      http_waiting_.push_back(&t);
    });
    return;
  }
  // Runtime faults, through the coordinator's admin endpoint; it ends the
  // lasting ones itself.
  t.ended = true;
  json body = {{"kind", k}, {"replica", p.replica}};
  if (k == "kill") body["role"] = p.role;
  if (p.device >= 0) body["device"] = p.device;
  if (k == "slow") body["factor"] = p.factor;
  if (find_fault_kind(k)->lasts) body["duration_s"] = p.duration_s;
  commit(t, [&](FaultRecord& r) {
    r.target = "replica " + std::to_string(p.replica) + (k == "kill" ? " " + p.role : "") +
               (p.device >= 0 ? " device " + std::to_string(p.device) : "");
  });
  const HttpResponse resp = http_.call("POST", "/admin/faults", body.dump());
  const json j = json::parse(resp.body, nullptr, false);
  if (resp.status != 201 || j.is_discarded())
    return fail("POST /admin/faults answered " + std::to_string(resp.status) + ": " +
                resp.body.substr(0, 200));
  commit(t, [&](FaultRecord&) {
    t.admin_id = j.value("id", uint64_t(0));
    t.admin_added = j.value("added_s", 0.0);
  });
}

void Run::undo(Tracked& t) {
  t.ended = true;
  const std::string& k = t.plan.kind;
  if (!deployment_ || t.node.empty()) return;
  NodeProcess& n = deployment_->node(t.node);
  if (k == "process_stop") {
    if (n.process && n.starts == t.starts) n.process->signal(SIGCONT);
  } else if (k == "process_kill") {
    if (n.starts == t.starts) deployment_->start_node(n);
  } else if (k.rfind("link_", 0) == 0 && t.link_fault >= 0) {
    n.link->remove(t.link_fault);
    std::string what;
    const uint64_t effect = link_effect(t.plan, n.link->counters(), t.before, &what);
    commit(t, [&](FaultRecord& r) {
      if (effect > 0) {
        r.confirmed_s = now();
        r.confirmation = std::to_string(effect) + " " + what;
      } else {
        r.error = "the link's counters did not move (0 " + what + "): no traffic crossed it?";
      }
    });
  }
}

// Faults injected through the server's admin endpoint need it on and the
// token right: said before the load, not after it.
void Run::check_admin_access() {
  const auto runtime = [](std::string_view kind) {
    const FaultKindInfo* k = find_fault_kind(kind);
    return k && k->family == "runtime";
  };
  bool needs_admin = false;
  for (const FaultPlan& f : plan_.faults) needs_admin = needs_admin || runtime(f.kind);
  for (const std::string& kind : plan_.random.kinds) needs_admin = needs_admin || runtime(kind);
  if (!needs_admin) return;
  const HttpResponse resp = http_.call("GET", "/admin/faults");
  if (resp.status == 200) return;
  if (resp.status == 401)
    throw std::runtime_error("the server at " + o_.attach + " refused the admin token (" +
                             (o_.admin_token.empty() ? "none given: pass --admin-token"
                                                     : "--admin-token is not its admin.token") +
                             "); the plan's runtime faults go through POST /admin/faults");
  if (resp.status == 404)
    throw std::runtime_error("the server at " + o_.attach +
                             " has fault injection off (admin.faults is not on in its config); the "
                             "plan's runtime faults need it");
  throw std::runtime_error("GET " + o_.attach + "/admin/faults answered " +
                           std::to_string(resp.status) + ": " + resp.body.substr(0, 200));
}

void Run::check_admin_faults() {
  const HttpResponse resp = http_.call("GET", "/admin/faults");
  const json j = json::parse(resp.body, nullptr, false);
  if (resp.status != 200 || j.is_discarded()) return;
  std::lock_guard<std::mutex> l(mu_);
  // The book's clock on ours (within a round trip).
  book_offset_ = now() - j.value("now_s", 0.0);
  resumes_.clear();
  for (const json& x : j.value("resumes", json::array()))
    resumes_.emplace_back(x[0].get<double>() + book_offset_, x[1].get<double>() + book_offset_);
  for (const json& e : j.value("faults", json::array())) {
    const uint64_t id = e.value("id", uint64_t(0));
    for (Tracked& t : tracked_) {
      if (t.admin_id != id || id == 0) continue;
      FaultRecord& r = t.rec;
      const auto at = [&](const char* key) {
        return e.contains(key) ? r.injected_s + (e[key].get<double>() - t.admin_added) : -1.0;
      };
      const std::string state = e.value("state", "");
      if ((state == "confirmed" || state == "ended") && r.confirmed_s < 0) {
        r.confirmed_s = at("confirmed_s");
        r.confirmation = e.value("effect", "");
      }
      if (state == "failed" && r.error.empty()) r.error = e.value("error", "failed");
      if (r.detected_s < 0) r.detected_s = at("detected_s");
      if (r.recovered_s < 0) r.recovered_s = at("recovered_s");
    }
  }
}

std::vector<FaultWindow> Run::windows() const {
  std::vector<FaultWindow> w;
  for (const Tracked& t : tracked_) {
    const std::string_view family = find_fault_kind(t.plan.kind)->family;
    using Aim = FaultWindow::Aim;
    const Aim aim = family == "process" || family == "link" ? Aim::Node
                    : family == "runtime"                   ? Aim::Runtime
                                                            : Aim::Client;
    w.push_back({aim, t.node, t.rec.injected_s,
                 t.rec.injected_s + std::max(t.plan.duration_s, 0.0) + kAttributeS,
                 t.rec.detected_s});
  }
  return w;
}

void Run::attribute_resumes() {
  // The polls see a node's death within a few tenths of a second.
  constexpr double kSeenWithinS = 0.5;
  const std::vector<FaultWindow> w = windows();
  for (const auto& [down, next] : resumes_)
    if (const int owner = owner_of_resume(w, down, kSeenWithinS); owner >= 0)
      tracked_[size_t(owner)].rec.resumed_s.push_back(next);
}

void Run::poll() {
  const MetricsView m = read_metrics(http_);
  if (!m.ok) return;
  const double t = now();
  out_.records.capacity.push_back({t, m.live_replicas, replicas_});
  bool admin_pending = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    last_metrics_ = m;
    // A node declared dead, a replica restarted or capacity lost since the
    // last poll is the doing of one fault (chaos/attribution.h).
    const double detect = m.detections + m.restarts;
    const bool detected = seen_detect_ >= 0 && detect > seen_detect_;
    const bool lost_capacity = seen_live_ >= 0 && m.live_replicas < seen_live_;
    std::set<std::string> died;
    for (const auto& [node, live] : m.node_live) {
      const auto was = seen_nodes_.find(node);
      if (!live && was != seen_nodes_.end() && was->second) died.insert(node);
    }
    seen_detect_ = detect;
    seen_live_ = m.live_replicas;
    seen_nodes_ = m.node_live;
    if (detected || lost_capacity)
      for (const int i : owners_of_node_effect(windows(), t, died)) {
        Tracked& owner = tracked_[size_t(i)];
        if (detected && owner.rec.detected_s < 0) owner.rec.detected_s = t;
        owner.capacity_dropped = true;
      }
    for (Tracked& tr : tracked_) {
      FaultRecord& r = tr.rec;
      const FaultKindInfo* k = find_fault_kind(tr.plan.kind);
      admin_pending = admin_pending || (tr.admin_id != 0 && r.confirmed_s < 0 && r.error.empty());
      // Capacity is back when every replica is ready again (a replica back
      // within one poll shows only in the restart counter: then the poll
      // that saw the counter move is when capacity was back).
      const double window_end = r.injected_s + std::max(tr.plan.duration_s, 0.0) + kAttributeS;
      if (tr.capacity_dropped && r.recovered_s < 0 && m.live_replicas == replicas_ &&
          t <= window_end + 30)
        r.recovered_s = t;
      if (k->family == "http" && r.confirmed_s < 0 && r.error.empty() &&
          tr.claims_done >= tr.plan.count) {
        if (tr.plan.kind == "client_slow") {
          r.confirmed_s = t;
          r.confirmation = std::to_string(tr.plan.count) + " client(s) read at " +
                           std::to_string(int(tr.plan.bytes_per_s)) + " B/s to the end";
        } else if (m.cancelled - tr.baseline_cancel >= tr.plan.count) {
          r.confirmed_s = t;
          r.confirmation = std::to_string(tr.plan.count) +
                           " client(s) went away mid-stream; the server counted 499s";
        }
      }
    }
    if (load_done_)
      for (Tracked* h : http_waiting_) {
        if (h->claims == 0 && h->rec.not_played.empty()) {
          // No client ever took it: it did nothing, as if never injected.
          h->rec.injected_s = -1;
          h->rec.not_played = "the load ended at " + seconds_text(load_end_s_) +
                              " s before a streaming request took it";
        } else if (h->claims < h->plan.count && h->rec.error.empty()) {
          h->rec.error = "the load ended before " + std::to_string(h->plan.count) +
                         " streaming request(s) took it";
        }
      }
  }
  if (admin_pending) check_admin_faults();
}

}  // namespace

ChaosRun run_chaos(const ChaosOptions& options) {
  Run run(options);
  return run.go();
}

}  // namespace troupe::chaos
