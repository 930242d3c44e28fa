#include "apps/bench_serving.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <latch>
#include <mutex>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "net/completion_stream.h"
#include "net/http_client.h"

namespace troupe::app::serving_bench {

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  return true;
}

}  // namespace

// ---- URL ----

std::string HttpUrl::authority() const {
  return http_authority(host, port);
}

HttpUrl parse_http_url(const std::string& url, const std::string& flag) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument(flag + " '" + url + "': " + why);
  };
  if (starts_with_nocase(url, "https://"))
    throw bad("https is not supported; the benchmark speaks plain http://");
  if (!starts_with_nocase(url, "http://")) throw bad("expected http://HOST[:PORT][/PATH]");
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  const std::string auth = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (auth.find_first_of("?#") != std::string::npos ||
      path.find_first_of("?#") != std::string::npos)
    throw bad("a query or fragment is not allowed");
  if (auth.find('@') != std::string::npos) throw bad("credentials in the URL are not supported");

  HttpUrl u;
  std::string port;
  if (!auth.empty() && auth[0] == '[') {
    const size_t close = auth.find(']');
    if (close == std::string::npos) throw bad("unterminated '[' in the host");
    u.host = auth.substr(1, close - 1);
    const std::string after = auth.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') throw bad("unexpected text after ']'");
      port = after.substr(1);
      if (port.empty()) throw bad("empty port");
    }
  } else {
    const size_t colon = auth.find(':');
    if (colon != std::string::npos && auth.find(':', colon + 1) != std::string::npos)
      throw bad("an IPv6 host must be in brackets");
    u.host = auth.substr(0, colon);
    if (colon != std::string::npos) {
      port = auth.substr(colon + 1);
      if (port.empty()) throw bad("empty port");
    }
  }
  if (u.host.empty()) throw bad("no host");
  if (port.empty()) {
    u.port = "80";
  } else {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        }))
      throw bad("port '" + port + "' is not a number");
    const int p = std::stoi(port);
    if (p < 1 || p > 65535) throw bad("port " + port + " is outside 1..65535");
    u.port = std::to_string(p);
  }
  while (!path.empty() && path.back() == '/') path.pop_back();
  u.base_path = path;
  return u;
}

std::string api_root(const HttpUrl& u) {
  const std::string& p = u.base_path;
  if (p.size() >= 3 && p.compare(p.size() - 3, 3, "/v1") == 0) return p;
  return p + "/v1";
}

// ---- statistics ----

double percentile_nearest_rank(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) throw std::invalid_argument("percentile of no samples");
  if (!(p > 0 && p <= 100)) throw std::invalid_argument("percentile must be in (0, 100]");
  // p * n first: for integer p the product is exact, so ranks like 99% of 100
  // do not round up past the sample they name.
  const double rank = std::ceil(p * double(sorted.size()) / 100.0);
  const size_t k = std::clamp<size_t>(size_t(rank), 1, sorted.size());
  return sorted[k - 1];
}

nlohmann::json Distribution::to_json() const {
  nlohmann::json j;
  j["count"] = count;
  for (const auto& [name, v] : {std::pair{"p50", p50}, {"p90", p90}, {"p99", p99}, {"mean", mean}})
    j[name] = count > 0 ? nlohmann::json(v) : nlohmann::json(nullptr);
  return j;
}

Distribution summarize(std::vector<double> samples) {
  Distribution d;
  d.count = samples.size();
  if (samples.empty()) return d;
  std::sort(samples.begin(), samples.end());
  d.p50 = percentile_nearest_rank(samples, 50);
  d.p90 = percentile_nearest_rank(samples, 90);
  d.p99 = percentile_nearest_rank(samples, 99);
  d.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / double(samples.size());
  return d;
}

// ---- arrivals ----

PoissonArrivals::PoissonArrivals(double rate_per_s, uint64_t seed) : rate_(rate_per_s), rng_(seed) {
  if (!(rate_per_s > 0)) throw std::invalid_argument("Poisson rate must be positive");
}

double PoissonArrivals::next_gap_s() {
  // Inverse CDF on u in (0, 1): the half-step offset keeps log() away from 0
  // (an infinite gap) and 1 (a zero gap).
  const double u = (double(rng_.next() >> 11) + 0.5) * 0x1.0p-53;
  return -std::log(u) / rate_;
}

// ---- the client ----

namespace {

// An OpenAI error body's message, else the start of whatever the body was.
std::string error_message(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    const auto e = j.find("error");
    if (e != j.end() && e->is_object()) {
      const auto m = e->find("message");
      if (m != e->end() && m->is_string()) return m->get<std::string>();
    }
    if (e != j.end() && e->is_string()) return e->get<std::string>();
  }
  return body.substr(0, 200);
}

bool is_event_stream(const HttpResponse& res) {
  return starts_with_nocase(res.header("Content-Type"), "text/event-stream");
}

HttpClient::Options client_options(const HttpUrl& url, const ServingBenchOptions& bench) {
  const double timeout_s = bench.timeout_s;
  HttpClient::Options o;
  o.host = url.host;
  o.port = url.port;
  o.user_agent = "troupe-bench";
  o.headers = bearer_headers(bench.api_key);
  // Each request's deadline is what bounds it; no single wait ends it sooner.
  o.connect_timeout_s = timeout_s;
  o.io_timeout_s = timeout_s;
  return o;
}

// What one completion came to, from the response and its body as read.
RequestResult outcome(const HttpResponse& res, const CompletionStream& stream,
                      const std::string& plain, Clock::time_point origin) {
  RequestResult r;
  r.status = res.status;
  if (!res.complete()) {
    r.error = to_string(res.error.kind);
    r.detail = res.error.message;
    return r;
  }
  if (r.status != 200) {
    r.error = std::to_string(r.status);
    r.detail = error_message(plain);
    return r;
  }
  std::optional<Clock::time_point> first, last;
  if (is_event_stream(res)) {
    if (!stream.error().empty()) {
      r.error = stream.error();
      r.detail = stream.error_detail();
      return r;
    }
    if (!stream.done()) {
      r.error = "incomplete";  // the body ended without data: [DONE]
      return r;
    }
    r.output_tokens = stream.output_tokens();
    r.cached_tokens = stream.cached_tokens();
    first = stream.first_token();
    last = stream.last_token();
  } else {
    const auto j = nlohmann::json::parse(plain, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.contains("error")) {
      r.error = "bad_response";
      r.detail = error_message(plain);
      return r;
    }
    // A whole response at once tells when it ended, not when its first
    // token was made: latency only.
    const auto usage = j.value("usage", nlohmann::json::object());
    r.output_tokens = usage.value("completion_tokens", 0);
    r.cached_tokens = cached_prompt_tokens(usage);
  }
  r.ok = true;
  if (first) r.ttft_s = seconds(origin, *first);
  if (first && last && r.output_tokens > 1)
    r.tpot_s = seconds(*first, *last) / double(r.output_tokens - 1);
  return r;
}

// POSTs a streamed completion. `origin` is when the request counts as
// issued (latency and TTFT are measured from it).
RequestResult complete(HttpClient& client, const std::string& target, const std::string& body,
                       Clock::time_point origin, Clock::time_point deadline) {
  HttpRequest req;
  req.method = "POST";
  req.target = target;
  req.body = body;
  req.headers = {{"Accept", "text/event-stream"}};
  CompletionStream stream;
  std::string plain;  // a non-streamed body (error JSON, or a server that ignored "stream")
  constexpr size_t kPlainCap = 4u << 20;
  const auto on_body = [&](const HttpResponse& head, std::string_view piece) {
    const auto now = Clock::now();
    if (head.status == 200 && is_event_stream(head))
      stream.feed(piece, now);
    else
      plain.append(piece.substr(0, kPlainCap - std::min(kPlainCap, plain.size())));
    return true;
  };
  const HttpResponse res = client.request(req, on_body, deadline);
  RequestResult r = outcome(res, stream, plain, origin);
  r.latency_s = seconds(origin, Clock::now());
  return r;
}

std::string request_body(const ServingBenchOptions& o, const std::string& model, int vocab,
                         int index) {
  nlohmann::json j;
  if (!model.empty()) j["model"] = model;
  j["prompt"] = request_prompt(o, vocab, index);
  j["max_tokens"] = o.output_len;
  j["temperature"] = 0;
  j["stream"] = o.stream;
  if (o.stream) j["stream_options"] = {{"include_usage", true}};
  // vLLM's extension so that every request produces output_len tokens; a
  // server that ignores it still gets measured on what it produced.
  j["ignore_eos"] = true;
  return j.dump();
}

// Reads the model name and vocabulary size from GET /v1/models when the
// server offers them. Only an unreachable server is an error: a missing or
// unfamiliar /v1/models falls back to the options.
void probe_server(const HttpUrl& url, const ServingBenchOptions& o, ServingBenchResult& res) {
  res.model = o.model;
  res.vocab = o.vocab;
  res.vocab_source = "option";
  HttpClient c(client_options(url, o));
  HttpRequest models;
  models.target = api_root(url) + "/models";
  const HttpResponse answer =
      c.request(models, Clock::now() + to_duration(std::min(o.timeout_s, 30.0)));
  if (!answer.complete())
    throw std::runtime_error("cannot reach " + o.url + ": " + answer.error.message);
  if (answer.status != 200) return;
  const auto j = nlohmann::json::parse(answer.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return;
  const nlohmann::json* entry = nullptr;
  if (const auto d = j.find("data");
      d != j.end() && d->is_array() && !d->empty() && d->front().is_object())
    entry = &d->front();
  if (entry && res.model.empty() && entry->contains("id") && (*entry)["id"].is_string())
    res.model = (*entry)["id"].get<std::string>();
  if (entry) {
    const auto len = entry->find("max_model_len");
    if (len != entry->end() && len->is_number_integer() && len->get<long long>() > 0 &&
        len->get<long long>() <= (1LL << 30))
      res.max_model_len = len->get<int>();
  }
  for (const nlohmann::json* obj : {entry, &j}) {
    if (!obj) continue;
    for (const char* key : {"vocab_size", "vocab"}) {
      const auto v = obj->find(key);
      if (v != obj->end() && v->is_number_integer() && v->get<long long>() > 3 &&
          v->get<long long>() <= (1LL << 30)) {
        res.vocab = v->get<int>();
        res.vocab_source = "server";
        return;
      }
    }
  }
}

void run_closed_loop(const HttpUrl& url, const ServingBenchOptions& o, const std::string& target,
                     ServingBenchResult& res, Clock::time_point& start) {
  const int workers = std::min(o.concurrency, o.requests);
  std::atomic<int> next{0};
  // Connections open before the clock starts, so the first requests are not
  // charged the TCP handshake that later ones do not pay.
  std::latch connected(workers + 1);
  std::vector<std::thread> threads;
  threads.reserve(size_t(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      HttpClient c(client_options(url, o));
      c.connect(Clock::now() + to_duration(std::min(o.timeout_s, 30.0)));
      connected.arrive_and_wait();
      for (int i = next++; i < o.requests; i = next++) {
        const std::string body = request_body(o, res.model, res.vocab, i);
        const auto t0 = Clock::now();
        res.requests[size_t(i)] = complete(c, target, body, t0, t0 + to_duration(o.timeout_s));
      }
    });
  }
  connected.arrive_and_wait();
  start = Clock::now();
  for (auto& t : threads) t.join();
}

void run_open_loop(const HttpUrl& url, const ServingBenchOptions& o, const std::string& target,
                   ServingBenchResult& res, Clock::time_point& start) {
  struct Job {
    int index;
    Clock::time_point arrival;
  };
  std::mutex m;
  std::condition_variable work_cv, space_cv;
  std::deque<Job> queue;
  int inflight = 0;  // queued + being sent
  int idle = 0;      // workers waiting for a job
  bool closing = false;
  std::vector<std::thread> workers;

  const auto worker = [&] {
    HttpClient c(client_options(url, o));
    std::unique_lock lock(m);
    for (;;) {
      ++idle;
      work_cv.wait(lock, [&] { return !queue.empty() || closing; });
      --idle;
      if (queue.empty()) return;
      const Job job = queue.front();
      queue.pop_front();
      lock.unlock();
      const std::string body = request_body(o, res.model, res.vocab, job.index);
      // Measured from the scheduled arrival, not from when a connection got
      // to it: otherwise a saturated client would hide the queueing delay
      // its users would see (coordinated omission).
      res.requests[size_t(job.index)] =
          complete(c, target, body, job.arrival, Clock::now() + to_duration(o.timeout_s));
      lock.lock();
      --inflight;
      space_cv.notify_one();
    }
  };

  PoissonArrivals arrivals(o.rate, o.seed);
  start = Clock::now();
  Clock::time_point at = start;
  for (int i = 0; i < o.requests; ++i) {
    if (i > 0) at += to_duration(arrivals.next_gap_s());
    std::this_thread::sleep_until(at);
    std::unique_lock lock(m);
    if (inflight >= o.max_inflight) {
      ++res.delayed_arrivals;
      space_cv.wait(lock, [&] { return inflight < o.max_inflight; });
    }
    ++inflight;
    queue.push_back({i, at});
    // Threads are added only when every existing one is busy, so a low rate
    // needs few connections and a high one grows up to --max-inflight.
    if (int(queue.size()) > idle && int(workers.size()) < o.max_inflight)
      workers.emplace_back(worker);
    work_cv.notify_one();
  }
  {
    std::lock_guard lock(m);
    closing = true;
  }
  work_cv.notify_all();
  for (auto& t : workers) t.join();
}

std::string fmt_ms(const Distribution& d, double Distribution::*field) {
  if (d.count == 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", 1000.0 * (d.*field));
  return b;
}

}  // namespace

// ---- the benchmark ----

void validate(const ServingBenchOptions& o) {
  const auto bad = [](const std::string& why) { return std::invalid_argument(why); };
  if (o.url.empty()) throw bad("serving mode needs --url");
  parse_http_url(o.url);
  if (o.concurrency > 0 && o.rate > 0)
    throw bad("give either --concurrency (closed loop) or --rate (open loop), not both");
  if (o.concurrency <= 0 && o.rate <= 0) {
    if (o.concurrency < 0) throw bad("--concurrency must be at least 1");
    if (o.rate < 0) throw bad("--rate must be positive (requests per second)");
    throw bad("serving mode needs --concurrency C (closed loop) or --rate R (open loop)");
  }
  if (!std::isfinite(o.rate)) throw bad("--rate must be a finite number");
  if (o.requests < 1) throw bad("--requests must be at least 1");
  if (o.max_inflight < 1) throw bad("--max-inflight must be at least 1");
  if (o.prompt_len < 1) throw bad("--prompt-len must be at least 1");
  if (o.prefix_len < 0) throw bad("--prefix-len must be at least 0");
  if (o.output_len < 1) throw bad("--output-len must be at least 1");
  if (o.vocab < 4) throw bad("--vocab must be at least 4 (ids 0..2 are reserved)");
  if (!(o.timeout_s > 0) || !std::isfinite(o.timeout_s))
    throw bad("--timeout-s must be a positive number of seconds");
}

std::vector<int> prompt_ids(int prompt_len, int vocab, uint64_t seed, int index) {
  // ids 0..2 are <unk>, BOS and EOS in the llama2.c vocabularies.
  Xoshiro256 rng(seed * 0x9e3779b97f4a7c15ULL + uint64_t(index) + 1);
  std::vector<int> ids(size_t(std::max(prompt_len, 0)));
  const uint64_t span = uint64_t(std::max(vocab - 3, 1));
  for (auto& id : ids) id = 3 + int(rng.next() % span);
  return ids;
}

std::vector<int> request_prompt(const ServingBenchOptions& o, int vocab, int index) {
  // The prefix's stream is index -1's, which no request's is.
  std::vector<int> ids = prompt_ids(o.prefix_len, vocab, o.seed, -1);
  const std::vector<int> own = prompt_ids(o.prompt_len, vocab, o.seed, index);
  ids.insert(ids.end(), own.begin(), own.end());
  return ids;
}

ServingBenchResult run_serving_bench(const ServingBenchOptions& opts) {
  validate(opts);
  const HttpUrl url = parse_http_url(opts.url);
  ServingBenchResult res;
  res.options = opts;
  probe_server(url, opts, res);
  // Every request would come back 400; say so once instead.
  if (res.max_model_len > 0 &&
      opts.prefix_len + opts.prompt_len + opts.output_len > res.max_model_len)
    throw std::invalid_argument(
        (opts.prefix_len > 0 ? "--prefix-len " + std::to_string(opts.prefix_len) + " plus "
                             : std::string()) +
        "--prompt-len " + std::to_string(opts.prompt_len) + " plus --output-len " +
        std::to_string(opts.output_len) + " exceeds the server's max_model_len " +
        std::to_string(res.max_model_len));
  res.requests.resize(size_t(opts.requests));
  const std::string target = api_root(url) + "/completions";

  Clock::time_point start;
  if (opts.concurrency > 0)
    run_closed_loop(url, opts, target, res, start);
  else
    run_open_loop(url, opts, target, res, start);
  res.duration_s = seconds(start, Clock::now());

  std::vector<double> ttft, tpot, latency;
  for (const auto& r : res.requests) {
    if (!r.ok) {
      ++res.errors[r.error];
      if (!r.detail.empty()) res.error_examples.emplace(r.error, r.detail);
      continue;
    }
    ++res.completed;
    res.output_tokens += r.output_tokens;
    res.prompt_tokens += opts.prefix_len + opts.prompt_len;
    res.cached_tokens += r.cached_tokens;
    latency.push_back(r.latency_s);
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    if (r.tpot_s >= 0) tpot.push_back(r.tpot_s);
  }
  res.ttft_s = summarize(std::move(ttft));
  res.tpot_s = summarize(std::move(tpot));
  res.latency_s = summarize(std::move(latency));
  return res;
}

nlohmann::json ServingBenchResult::to_json() const {
  nlohmann::json j;
  j["mode"] = "serving";
  j["url"] = options.url;
  j["model"] = model;
  if (options.concurrency > 0) {
    j["loop"] = "closed";
    j["concurrency"] = options.concurrency;
  } else {
    j["loop"] = "open";
    j["rate"] = options.rate;
    j["max_inflight"] = options.max_inflight;
    j["delayed_arrivals"] = delayed_arrivals;
  }
  j["requests"] = options.requests;
  j["completed"] = completed;
  j["errors"] = nlohmann::json::object();
  for (const auto& [k, v] : errors) j["errors"][k] = v;
  j["error_examples"] = nlohmann::json::object();
  for (const auto& [k, v] : error_examples) j["error_examples"][k] = v;
  j["prompt_len"] = options.prompt_len;
  j["prefix_len"] = options.prefix_len;
  j["prompt_tokens"] = prompt_tokens;
  j["cached_prompt_tokens"] = cached_tokens;
  j["output_len"] = options.output_len;
  j["stream"] = options.stream;
  j["vocab"] = vocab;
  j["vocab_source"] = vocab_source;
  j["duration_s"] = duration_s;
  j["output_tokens"] = output_tokens;
  j["requests_per_s"] = requests_per_s();
  j["output_tokens_per_s"] = output_tokens_per_s();
  j["ttft_s"] = ttft_s.to_json();
  j["tpot_s"] = tpot_s.to_json();
  j["latency_s"] = latency_s.to_json();
  return j;
}

std::string ServingBenchResult::table() const {
  std::ostringstream s;
  char line[256];
  s << "serving bench against " << options.url;
  if (!model.empty()) s << " (model " << model << ")";
  s << "\n";
  if (options.concurrency > 0) {
    std::snprintf(line, sizeof line, "closed loop, concurrency %d\n", options.concurrency);
  } else {
    std::snprintf(line, sizeof line,
                  "open loop, Poisson %.2f requests/s, at most %d in flight (%d arrivals held)\n",
                  options.rate, options.max_inflight, delayed_arrivals);
  }
  s << line;
  std::string prefix;
  if (options.prefix_len > 0)
    prefix = ", the first " + std::to_string(options.prefix_len) + " shared by all";
  std::snprintf(line, sizeof line,
                "prompt %d tokens%s (vocab %d, from %s), output up to %d tokens%s\n",
                options.prefix_len + options.prompt_len, prefix.c_str(), vocab,
                vocab_source.c_str(), options.output_len, options.stream ? "" : ", not streamed");
  s << line;
  std::snprintf(line, sizeof line, "requests %d: completed %d, failed %d\n", options.requests,
                completed, options.requests - completed);
  s << line;
  if (!errors.empty()) {
    s << "errors:";
    for (const auto& [k, v] : errors) s << " " << k << " x" << v;
    s << "\n";
    for (const auto& [k, v] : error_examples) s << "  " << k << ": " << v << "\n";
  }
  std::snprintf(line, sizeof line,
                "duration %.2f s: %.2f requests/s, %.1f output tokens/s (%lld tokens)\n",
                duration_s, requests_per_s(), output_tokens_per_s(), output_tokens);
  s << line;
  if (cached_tokens > 0) {
    std::snprintf(line, sizeof line,
                  "prompt tokens found in the server's prefix cache: %lld of %lld (%.0f%%)\n",
                  cached_tokens, prompt_tokens,
                  prompt_tokens > 0 ? 100.0 * double(cached_tokens) / double(prompt_tokens) : 0.0);
    s << line;
  }
  s << "              |      p50 |      p90 |      p99 |     mean\n";
  for (const auto& [name, d] : {std::pair<const char*, const Distribution*>{"TTFT ms", &ttft_s},
                                {"TPOT ms", &tpot_s},
                                {"latency ms", &latency_s}}) {
    std::snprintf(line, sizeof line, "  %-11s | %8s | %8s | %8s | %8s\n", name,
                  fmt_ms(*d, &Distribution::p50).c_str(), fmt_ms(*d, &Distribution::p90).c_str(),
                  fmt_ms(*d, &Distribution::p99).c_str(), fmt_ms(*d, &Distribution::mean).c_str());
    s << line;
  }
  return s.str();
}

}  // namespace troupe::app::serving_bench
