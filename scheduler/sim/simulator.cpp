#include "scheduler/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace troupe::sim {

namespace {
// Failure events: b holds these flags, a the node.
constexpr uint64_t kNode = 1, kScripted = 2;
}  // namespace

struct Simulator::Replica {
  Replica(const StepCostModel& m, double slow_factor, int max_restarts, double window_s)
      : model(&m), slow(slow_factor), intensity(max_restarts, window_s) {}

  std::unique_ptr<ReplicaScheduler> sched;  // null while dead or restarting
  std::unique_ptr<MicrobatchTuner> tuner;   // pipelines only
  const StepCostModel* model;
  double slow;
  uint64_t epoch = 0;  // bumped at each death: late step reports are dropped
  bool up = false;
  bool dirty = false;              // listed in dirty_
  std::vector<double> stage_free;  // when each stage finishes the work it has
  std::vector<InFlightStep> flight;
  // When the last step was answered, and when the last one launched will
  // be: answers come in launch order, as the worker's.
  double last_answer = 0, last_done = 0;
  RestartIntensity intensity;
  ReplicaFigures fig;
  // Sampled runs only: device-seconds of compute in the current sample
  // window, and the stages' busy intervals launched that may still end
  // after now (their parts in later windows, or cut short by a death).
  double busy_window = 0;
  std::vector<std::pair<double, double>> busy;
};

// A request as its client sees it; the table holds it as the sink.
class Simulator::Flight : public CompletionSink {
 public:
  Flight(Simulator& sim, uint64_t id, const Arrival& a)
      : client(a.client),
        max_tokens(a.output_tokens),
        priority(a.priority),
        cancel_after_s(a.cancel_after_s),
        prefix_group(a.prefix_group),
        prefix_tokens(a.prefix_tokens),
        block_ids(a.block_ids),
        block_id_tokens(a.block_id_tokens),
        sim_(sim) {
    rec.id = id;
    rec.arrival = sim.now_;
    rec.prompt_tokens = a.prompt_tokens;
    rec.client_leaves = a.cancel_after_s >= 0;
    rec.priority = a.priority;
  }
  void on_token(int, const TokenLogprobs*) override {
    if (rec.first_token < 0) rec.first_token = sim_.now_;
    rec.last_token = sim_.now_;
    ++rec.output_tokens;
    ++sim_.window_.output_tokens;
  }
  void on_done(FinishReason reason, int, int, int) override {
    sim_.finish(*this, reason == FinishReason::Cancelled ? Outcome::Cancelled : Outcome::Completed);
  }
  void on_error(const ServiceError& e) override {
    switch (e.kind) {
      case ServiceErrorKind::BadRequest:
        return sim_.finish(*this, Outcome::BadRequest);
      case ServiceErrorKind::QueueFull:
        return sim_.finish(*this, Outcome::QueueFull);
      case ServiceErrorKind::Unavailable:
        return sim_.finish(*this, Outcome::Unavailable);
      case ServiceErrorKind::Timeout:
        return sim_.finish(*this, Outcome::Timeout);
      case ServiceErrorKind::Internal:
        return sim_.finish(*this, Outcome::Internal);
    }
  }

  RequestRecord rec;
  int client;
  int max_tokens, priority;
  double cancel_after_s;
  int prefix_group, prefix_tokens;
  std::vector<uint64_t> block_ids;
  int block_id_tokens;

 private:
  Simulator& sim_;
};

// The table's placements and cancellations, straight to the replicas'
// schedulers (the batcher actors' mailboxes in the runtime).
class Simulator::Channel : public ReplicaChannel {
 public:
  explicit Channel(Simulator& sim) : sim_(sim) {}
  void assign(int replica, Assignment a) override {
    if (auto it = sim_.flights_.find(a.id); it != sim_.flights_.end() && it->second->rec.placed < 0)
      it->second->rec.placed = sim_.now_;
    Replica& r = *sim_.replicas_[size_t(replica)];
    if (!r.sched) return;  // a message to a dead actor
    r.sched->add(std::move(a));
    mark(replica);
  }
  void cancel(int replica, uint64_t id) override {
    Replica& r = *sim_.replicas_[size_t(replica)];
    if (!r.sched) return;
    r.sched->cancel(id);
    mark(replica);
  }

 private:
  void mark(int replica) {
    Replica& r = *sim_.replicas_[size_t(replica)];
    if (r.dirty) return;
    r.dirty = true;
    sim_.dirty_.push_back(replica);
  }
  Simulator& sim_;
};

std::string failure_problem(const Failure& f, int replicas, int replicas_per_node) {
  const auto range = [](const char* what, int n) {
    return n == 1 ? std::string("there is one ") + what + ", 0"
                  : std::string("there are ") + what + "s 0.." + std::to_string(n - 1);
  };
  if (!(f.time_s >= 0) || !std::isfinite(f.time_s)) {
    char text[120];
    std::snprintf(text, sizeof text, "its time must be a number of seconds >= 0, not %g", f.time_s);
    return text;
  }
  if ((f.replica >= 0) == (f.node >= 0)) return "it must name either a replica or a node";
  if (f.replica >= replicas)
    return "replica " + std::to_string(f.replica) +
           " does not exist: " + range("replica", replicas);
  const int per_node = std::max(1, replicas_per_node);
  const int nodes = (replicas + per_node - 1) / per_node;
  if (f.replica < 0 && f.node >= nodes)
    return "node " + std::to_string(f.node) + " does not exist: with " + std::to_string(per_node) +
           (per_node == 1 ? " replica" : " replicas") + " per node, " + range("node", nodes);
  return "";
}

Simulator::Simulator(SimOptions options, std::vector<StepCostModel> models, Workload& workload,
                     SimObserver* observer, std::unique_ptr<RouterLog> log)
    : o_(std::move(options)),
      models_(std::move(models)),
      workload_(workload),
      observer_(observer),
      rng_(o_.seed) {
  if (o_.replicas < 1) throw std::invalid_argument("a simulation needs at least one replica");
  if (models_.size() != 1 && models_.size() != size_t(o_.replicas))
    throw std::invalid_argument("give one cost model, or one per replica");
  if (!o_.slowdown.empty() && o_.slowdown.size() != size_t(o_.replicas))
    throw std::invalid_argument("give one slowdown factor per replica");
  for (double s : o_.slowdown)
    if (!(s > 0) || !std::isfinite(s))
      throw std::invalid_argument("a replica's slowdown must be a positive factor");
  const auto seconds = [](double v) { return v >= 0 && std::isfinite(v); };
  if (!(o_.tick_s > 0) || !std::isfinite(o_.tick_s))
    throw std::invalid_argument("the router tick must be positive");
  if (!seconds(o_.restart_s))
    throw std::invalid_argument("the restart time must be a number of seconds >= 0");
  if (!seconds(o_.sample_s))
    throw std::invalid_argument("the sample interval must be a number of seconds >= 0 (0: none)");
  if (!seconds(o_.mtbf_s) || !seconds(o_.node_mtbf_s))
    throw std::invalid_argument(
        "a mean time between failures must be a number of seconds >= 0 "
        "(0: none)");
  if (o_.replicas_per_node < 1) throw std::invalid_argument("a node holds at least one replica");
  for (const Failure& f : o_.failures)
    if (const std::string problem = failure_problem(f, o_.replicas, o_.replicas_per_node);
        !problem.empty())
      throw std::invalid_argument("a scripted failure: " + problem);
  const StopRule& stop = o_.scheduler.stop;
  const int ctx_blocks = (stop.context_length + o_.scheduler.block_tokens - 1) /
                         std::max(1, o_.scheduler.block_tokens);
  if (o_.scheduler.kv_blocks < ctx_blocks)
    throw std::invalid_argument("kv_cache holds " + std::to_string(o_.scheduler.kv_blocks) +
                                " blocks per device, fewer than one full-context sequence needs (" +
                                std::to_string(ctx_blocks) + ")");
  // Sampled ids are never an EOS: lengths come from the workload.
  while (std::find(stop.eos_ids.begin(), stop.eos_ids.end(), sample_token_) != stop.eos_ids.end())
    ++sample_token_;
  o_.table.replicas = o_.replicas;
  channel_ = std::make_unique<Channel>(*this);
  table_ = std::make_unique<LoggedRequestTable>(o_.table, o_.policy, o_.policy_seed,
                                                o_.latency_aware, *channel_, std::move(log));
  for (int i = 0; i < o_.replicas; ++i) {
    const StepCostModel& m = models_.size() == 1 ? models_[0] : models_[size_t(i)];
    const double slow = o_.slowdown.empty() ? 1.0 : o_.slowdown[size_t(i)];
    replicas_.push_back(std::make_unique<Replica>(m, slow, o_.max_restarts, o_.restart_window_s));
    replicas_.back()->fig.stages = m.stages();
  }
}

Simulator::~Simulator() = default;

void Simulator::push(double t, Kind kind, int replica, uint64_t a, uint64_t b) {
  events_.push(Event{t, seq_++, kind, replica, a, b});
}

std::unique_ptr<ReplicaScheduler> Simulator::make_scheduler(int replica) const {
  ReplicaSchedulerOptions so = o_.scheduler;
  so.replica = replica;
  so.groups = replicas_[size_t(replica)]->model->stages();  // one step in flight per stage
  so.lookahead = so.lookahead && so.groups == 1;            // as the node plans it
  return std::make_unique<ReplicaScheduler>(so);
}

void Simulator::bring_up(int replica) {
  Replica& r = *replicas_[size_t(replica)];
  r.sched = make_scheduler(replica);
  const int stages = r.model->stages();
  r.tuner = stages > 1 ? std::make_unique<MicrobatchTuner>(stages) : nullptr;
  r.stage_free.assign(size_t(stages), now_);
  r.flight.clear();
  r.last_answer = r.last_done = now_;
  // The probe step the batcher runs before it reports up.
  const PlannedStep probe = r.sched->probe_step();
  r.sched->finish_probe(probe.id);
  r.sched->take_released();
  r.up = true;
  table_->replica_up(replica, now_);
}

void Simulator::pull_arrival() {
  if (workload_done_) return;
  if (auto a = workload_.next())
    schedule_arrival(*a);
  else
    workload_done_ = true;
}

void Simulator::schedule_arrival(const Arrival& a) {
  // Every sample window is an event and a row, empty or not: a gap of
  // millions of them is a rate or a trace's times gone wrong, and would
  // run for hours.
  constexpr double kMaxEmptyWindows = 1e7;
  if (o_.sample_s > 0 && (a.time_s - now_) / o_.sample_s > kMaxEmptyWindows) {
    char text[320];
    std::snprintf(text, sizeof text,
                  "the next request arrives at t=%.4g s, %.4g s after the last: with a sample "
                  "every %.4g s that is more than %.0g empty windows of the time series (raise "
                  "the rate, or --sample-s, or set --sample-s 0 for no time series)",
                  a.time_s, a.time_s - now_, o_.sample_s, kMaxEmptyWindows);
    throw std::invalid_argument(text);
  }
  const uint64_t key = next_key_++;
  pending_.emplace(key, a);
  push(std::max(now_, a.time_s), Kind::Arrival, -1, key);
}

void Simulator::on_arrival(const Arrival& a) {
  ++totals_.requests;
  ++window_.arrivals;
  const uint64_t id = next_id_++;
  auto flight = std::make_shared<Flight>(*this, id, a);
  // An idle cluster makes no progress and is not stalled: the stall clock
  // starts when work arrives.
  if (flights_.empty()) last_progress_ = now_;
  flights_.emplace(id, flight.get());
  if (!ticking_) {
    // On the grid the ticks kept before the cluster went idle.
    push((std::floor(now_ / o_.tick_s) + 1) * o_.tick_s, Kind::Tick);
    ticking_ = true;
  }
  // What the HTTP layer refuses before the runtime sees it: max_tokens over
  // the limit as it parses the request, then prompt + output over the
  // context (net/openai_api.cpp).
  const int context = o_.scheduler.stop.context_length;
  using TooLong = RequestRecord::TooLong;
  flight->rec.too_long =
      o_.max_tokens_limit > 0 && a.output_tokens > o_.max_tokens_limit ? TooLong::MaxTokens
      : context > 0 && a.prompt_tokens + a.output_tokens > context     ? TooLong::Context
                                                                       : TooLong::No;
  if (flight->rec.too_long != TooLong::No) {
    flight->on_error({ServiceErrorKind::BadRequest,
                      flight->rec.too_long == TooLong::Context ? "context_length_exceeded"
                                                               : "max_tokens over the limit",
                      0});
    return;
  }
  const double front_end = models_.front().request_overhead_s();
  entering_.emplace(id, std::move(flight));
  if (front_end > 0)
    push(now_ + front_end, Kind::Submit, -1, id);
  else
    submit(id);
}

// Token ids only a prefix cache reads: a shared prefix's are its group's,
// then a trace's blocks' are their ids', the rest the request's own, so that
// prompts share blocks exactly where the workload says. Drawn above the ids a model reserves (a
// vocabulary is not needed: the simulated engine samples nothing from them).
std::vector<int> Simulator::prompt_of(uint64_t id, const Flight& f) {
  const int tokens = f.rec.prompt_tokens;
  std::vector<int> prompt(size_t(std::max(tokens, 0)));
  int at = 0;
  const auto fill = [&](uint64_t seed, int n) {
    uint64_t state = seed;
    for (const int end = std::min(tokens, at + n); at < end; ++at)
      prompt[size_t(at)] = 3 + int(splitmix64(state) >> 34);
  };
  if (f.prefix_group >= 0) fill(0x243f6a8885a308d3ull ^ uint64_t(f.prefix_group), f.prefix_tokens);
  for (uint64_t block : f.block_ids)
    fill(0xa4093822299f31d0ull ^ (block * 0x9e3779b97f4a7c15ull), f.block_id_tokens);
  fill(0x13198a2e03707344ull ^ (id * 0x9e3779b97f4a7c15ull), tokens);
  return prompt;
}

void Simulator::submit(uint64_t id) {
  auto node = entering_.extract(id);
  Flight& f = *node.mapped();
  CompletionRequest req;
  req.id = id;
  req.prompt = prompt_of(id, f);
  req.max_tokens = f.max_tokens;
  req.priority = f.priority;
  req.timeout_s = o_.request_timeout_s;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  table_->submit(std::move(req), std::move(node.mapped()), now_);
  if (f.cancel_after_s >= 0)
    push(std::max(now_, f.rec.arrival + f.cancel_after_s), Kind::Cancel, -1, id);
  settle();
}

// A step's cost-model view of some of its items.
static StepShape shape_of(const std::vector<StepItem>& items, size_t begin, size_t end) {
  StepShape s;
  double ctx = 0;
  for (size_t i = begin; i < end; ++i) {
    const StepItem& it = items[i];
    if (it.tokens.size() == 1 && it.position > 0) {
      ++s.decode;
      ctx += double(it.position + 1);
    } else {
      s.prefill += int(it.tokens.size());
    }
  }
  s.context = s.decode > 0 ? ctx / s.decode : 0;
  return s;
}

double Simulator::time_step(Replica& r, const PlannedStep& step, InFlightStep& f) {
  const StepCostModel& model = *r.model;
  const int stages = model.stages();
  const size_t n = step.items.size();
  int m = 1;
  if (r.tuner) {
    size_t tokens = 0;
    for (const auto& it : step.items) tokens += it.tokens.size();
    // As the worker: micro-batches only when no other step fills the
    // pipeline, and no more of them than sequences.
    if (r.flight.empty()) m = std::min(int(n), r.tuner->choose(tokens, now_));
    m = std::max(1, m);
  }
  double done = now_;
  size_t begin = 0;
  for (int mb = 0; mb < m; ++mb) {
    const size_t count = n / size_t(m) + (size_t(mb) < n % size_t(m) ? 1 : 0);
    const StepShape shape = shape_of(step.items, begin, begin + count);
    begin += count;
    // Each stage takes its jobs in launch order: a flow shop.
    double ready = now_;
    for (int s = 0; s < stages; ++s) {
      const double t = model.stage_s(s, shape) * r.slow;
      double& free_at = r.stage_free[size_t(s)];
      const double start = std::max(free_at, ready);
      free_at = start + t;
      ready = free_at;
      r.fig.busy_s += t;
      note_busy(r, start, free_at);
      if (r.tuner) f.samples.push_back({s, size_t(shape.tokens()), t});
    }
    done = std::max(done, ready);
  }
  f.engine_s = done - now_;
  // A slow replica's engine is slow; the serving around it is not. The
  // serving takes the replica's cores too: a step planned ahead does not
  // compute through it. (Measured so on the machines the profiles come
  // from, whose cores the device threads fill: with the serving overlapping
  // the next step, the simulated TPOT came out 40-58% low at 70% load.)
  const double end = done + model.overhead_s(int(n));
  double& last_stage = r.stage_free.back();
  last_stage = std::max(last_stage, end);
  return end;
}

// A stage computes over [start, end): the window being sampled gets its
// part of that, later windows the rest (on_sample), so that a sample's
// utilisation is the share of that window its stages were busy, however
// long a step is and wherever the window's edge falls in it.
void Simulator::note_busy(Replica& r, double start, double end) {
  if (o_.sample_s > 0) r.busy_window += std::max(0.0, std::min(end, window_end_) - start);
  // Intervals over by now are fully counted; the rest are a stage's steps
  // in flight, a handful (a death cuts them short).
  std::erase_if(r.busy, [&](const auto& b) { return b.second <= now_; });
  r.busy.emplace_back(start, end);
}

// What a replica's steps in flight would compute after now is no busy time,
// in the window or in the summary: it died, or the run ended.
void Simulator::stop_busy(Replica& r) {
  for (const auto& [start, end] : r.busy) {
    if (o_.sample_s > 0)
      r.busy_window -= std::max(0.0, std::min(end, window_end_) - std::max(start, now_));
    r.fig.busy_s -= std::max(0.0, end - std::max(start, now_));
  }
  r.busy.clear();
}

StepEvents& Simulator::next_out() {
  if (out_n_ == out_.size()) out_.emplace_back();
  return out_[out_n_++];
}

void Simulator::launch(int replica) {
  Replica& r = *replicas_[size_t(replica)];
  if (!r.up || !r.sched) return;
  while (r.sched->can_launch()) {
    PlannedStep& step = step_;
    const bool planned = r.sched->next_step(step);
    note_released(r);
    if (auto ended = r.sched->take_ended()) next_out() = std::move(*ended);
    if (!planned) return;
    // Buffers of finished steps are reused: a million requests make tens of
    // millions of steps.
    InFlightStep f;
    if (!spare_.empty()) {
      f = std::move(spare_.back());
      spare_.pop_back();
      f.ids.clear();
      f.samples.clear();
    }
    f.id = step.id;
    for (const auto& it : step.items) {
      f.ids.push_back(it.sample ? sample_token_ : -1);
      if (it.position == 0) note_started(it.seq);  // a request's first chunk
    }
    f.launched_s = now_;
    const double done = std::max(time_step(r, step, f), r.last_done);
    r.last_done = done;
    push(done, Kind::StepDone, replica, r.epoch, step.id);
    r.flight.push_back(std::move(f));
  }
}

void Simulator::deliver() {
  for (size_t i = 0; i < out_n_; ++i) table_->on_events(out_[i], now_);
  out_n_ = 0;
}

void Simulator::settle() {
  while (!dirty_.empty()) {
    const int i = dirty_.back();
    dirty_.pop_back();
    replicas_[size_t(i)]->dirty = false;
    launch(i);
    deliver();
  }
}

void Simulator::note_started(uint64_t id) {
  auto it = flights_.find(id);
  if (it != flights_.end() && it->second->rec.started < 0) it->second->rec.started = now_;
}

void Simulator::note_released(Replica& r) {
  for (uint64_t id : r.sched->take_released())
    if (r.sched->holds(id)) {  // still there: preempted, not ended
      ++r.fig.preemptions;
      ++totals_.preemptions;
    }
}

void Simulator::on_step_done(int replica, uint64_t epoch, uint64_t step) {
  Replica& r = *replicas_[size_t(replica)];
  if (epoch != r.epoch || !r.sched) return;  // the replica died meanwhile
  auto it = std::find_if(r.flight.begin(), r.flight.end(),
                         [&](const InFlightStep& f) { return f.id == step; });
  InFlightStep f = std::move(*it);
  r.flight.erase(it);
  last_progress_ = now_;
  StepEvents& ev = next_out();
  r.sched->finish_step(step, f.ids, f.engine_s, ev);
  totals_.prefix_queried += uint64_t(ev.prefix_queried);
  totals_.prefix_hits += uint64_t(ev.prefix_hits);
  // As the batcher times it: a step launched ahead starts when the one
  // before it is answered.
  r.sched->observe_step_time(now_ - std::max(f.launched_s, r.last_answer));
  r.last_answer = now_;
  if (r.tuner)
    for (const auto& s : f.samples) r.tuner->observe(s.stage, s.tokens, s.seconds);
  spare_.push_back(std::move(f));
  note_released(r);
  ++r.fig.steps;
  ++totals_.steps;
  // As the batcher: the next step is launched before the router has read
  // this one's tokens.
  launch(replica);
  deliver();
  settle();
}

void Simulator::on_failure(int replica, bool node_death) {
  Replica& r = *replicas_[size_t(replica)];
  if (!r.up) return;  // already down or restarting
  ++totals_.failures;
  ++r.fig.failures;
  r.up = false;
  ++r.epoch;
  r.sched.reset();
  r.tuner.reset();
  r.flight.clear();
  // Its devices stop computing now.
  stop_busy(r);
  // A node's death is the node's, not the replica's: placed anew without
  // counting against its restart intensity, as the supervisor does.
  const bool restart = node_death || r.intensity.allow_restart(now_);
  totals_.resumed += table_->replica_down(replica, !restart, now_);
  if (restart) {
    ++totals_.restarts;
    // The new replica's probe: one token.
    const double probe = r.model->step_s(StepShape{0, 0, 1}) * r.slow;
    push(now_ + o_.restart_s + probe, Kind::Up, replica, r.epoch);
  } else {
    ++totals_.given_up;
  }
  settle();
}

void Simulator::on_up(int replica, uint64_t epoch) {
  if (replicas_[size_t(replica)]->epoch != epoch) return;
  bring_up(replica);
  settle();
}

void Simulator::schedule_failures() {
  for (const Failure& f : o_.failures) {  // checked by the constructor
    const bool node = f.replica < 0;
    push(f.time_s, Kind::Failure, f.replica, node ? uint64_t(f.node) : 0,
         kScripted | (node ? kNode : 0));
  }
  if (o_.mtbf_s > 0)
    for (int i = 0; i < o_.replicas; ++i)
      push(exponential(rng_, o_.mtbf_s), Kind::Failure, i, 0, 0);
  if (o_.node_mtbf_s > 0)
    for (int n = 0; n * o_.replicas_per_node < o_.replicas; ++n)
      push(exponential(rng_, o_.node_mtbf_s), Kind::Failure, -1, uint64_t(n), kNode);
}

void Simulator::on_failure_event(const Event& e) {
  const bool node = (e.b & kNode) != 0;
  if (node) {
    const int first = int(e.a) * o_.replicas_per_node;
    for (int i = first; i < std::min(o_.replicas, first + o_.replicas_per_node); ++i)
      on_failure(i, /*node_death=*/true);
  } else {
    on_failure(e.replica);
  }
  // The next death of a randomly failing replica or node.
  if (e.b & kScripted) return;
  const double mtbf = node ? o_.node_mtbf_s : o_.mtbf_s;
  push(now_ + exponential(rng_, mtbf), Kind::Failure, e.replica, e.a, e.b);
}

void Simulator::on_sample() {
  // The window closing now; the last one of a run may be shorter.
  const double span = now_ - (window_end_ - o_.sample_s);
  ClusterSample c = window_;
  c.time_s = now_;
  c.in_flight = table_->table().size();
  c.queue_depth = table_->table().queue_depth();
  c.live_replicas = table_->table().live_replicas();
  samples_.clear();
  for (size_t i = 0; i < replicas_.size(); ++i) {
    Replica& r = *replicas_[i];
    ReplicaSample s;
    s.replica = int(i);
    s.live = r.up;
    s.utilisation = span > 0 ? r.busy_window / double(r.model->stages()) / span : 0.0;
    if (r.sched) {
      s.kv_occupancy = double(r.sched->blocks_used()) / double(o_.scheduler.kv_blocks);
      s.running = r.sched->running();
      s.waiting = r.sched->waiting();
    }
    r.fig.kv_sum += s.kv_occupancy;
    r.fig.kv_max = std::max(r.fig.kv_max, s.kv_occupancy);
    ++r.fig.samples;
    samples_.push_back(s);
  }
  if (observer_) observer_->on_sample(c, samples_);
  window_ = ClusterSample{};
  // The next window: the parts of the steps in flight that fall in it.
  window_end_ = now_ + o_.sample_s;
  for (auto& rp : replicas_) {
    Replica& r = *rp;
    std::erase_if(r.busy, [&](const auto& b) { return b.second <= now_; });
    r.busy_window = 0;
    for (const auto& [start, end] : r.busy)
      r.busy_window += std::max(0.0, std::min(end, window_end_) - std::max(start, now_));
  }
}

void Simulator::finish(Flight& f, Outcome outcome) {
  f.rec.end = now_;
  f.rec.outcome = outcome;
  if (outcome == Outcome::Completed) ++window_.completed;
  if (observer_) observer_->on_request_end(f.rec);
  flights_.erase(f.rec.id);
  last_progress_ = now_;
  if (f.client >= 0)
    if (auto next = workload_.on_end(f.client, now_)) schedule_arrival(*next);
}

std::runtime_error Simulator::stalled(double stall_s) const {
  // The request waiting longest says what is stuck.
  const Flight* oldest = nullptr;
  for (const auto& [id, f] : flights_)
    if (!oldest || f->rec.arrival < oldest->rec.arrival ||
        (f->rec.arrival == oldest->rec.arrival && id < oldest->rec.id))
      oldest = f;
  const RequestRecord& r = oldest->rec;
  char text[512];
  std::snprintf(text, sizeof text,
                "the simulation stalled at t=%.2f s: %zu request(s) in flight made no progress "
                "(no step finished, no request ended) for %.0f s; %d of %d replicas up, %zu "
                "waiting for one. The oldest, request %llu (%d prompt + %d output tokens), "
                "arrived at t=%.2f s and ",
                now_, flights_.size(), stall_s, table_->table().live_replicas(), o_.replicas,
                table_->table().queue_depth(), (unsigned long long)r.id, r.prompt_tokens,
                oldest->max_tokens, r.arrival);
  std::string what = text;
  if (r.placed < 0) {
    what += "was never placed on a replica";
  } else if (r.started < 0) {
    std::snprintf(text, sizeof text, "was placed at t=%.2f s but never started", r.placed);
    what += text;
  } else {
    std::snprintf(text, sizeof text, "started at t=%.2f s", r.started);
    what += text;
  }
  const int bt = std::max(1, o_.scheduler.block_tokens);
  const long long blocks =
      (static_cast<long long>(r.prompt_tokens) + oldest->max_tokens + bt - 1) / bt;
  if (blocks > o_.scheduler.kv_blocks)
    what += "; it needs " + std::to_string(blocks) + " KV blocks of " + std::to_string(bt) +
            " tokens, and a replica has " + std::to_string(o_.scheduler.kv_blocks);
  return std::runtime_error(what);
}

bool Simulator::done() const {
  return workload_done_ && pending_.empty() && flights_.empty();
}

void Simulator::run() {
  for (int i = 0; i < o_.replicas; ++i) bring_up(i);
  schedule_failures();
  push(o_.tick_s, Kind::Tick);
  ticking_ = true;
  if (o_.sample_s > 0) {
    window_end_ = o_.sample_s;
    push(window_end_, Kind::Sample);
  }
  pull_arrival();
  // With nothing left that could end them, requests that cannot run (a
  // prompt no replica can hold, every replica restarting for good) would
  // keep the clock ticking forever.
  const double stall_s = std::max({o_.request_timeout_s, o_.table.admission.max_wait_s, 60.0}) * 2;
  while (!events_.empty() && !done()) {
    const Event e = events_.top();
    events_.pop();
    now_ = e.t;
    ++totals_.events;
    switch (e.kind) {
      case Kind::Arrival: {
        auto node = pending_.extract(e.a);
        pull_arrival();
        on_arrival(node.mapped());
        break;
      }
      case Kind::Submit:
        submit(e.a);
        break;
      case Kind::StepDone:
        on_step_done(e.replica, e.a, e.b);
        break;
      case Kind::Cancel:
        if (flights_.count(e.a) && !entering_.count(e.a)) {
          table_->cancel(e.a, now_);
          settle();
        }
        break;
      case Kind::Tick:
        table_->tick(now_);
        settle();
        if (flights_.empty()) {
          ticking_ = false;
          break;
        }
        if (now_ - last_progress_ > stall_s) throw stalled(stall_s);
        push(now_ + o_.tick_s, Kind::Tick);
        break;
      case Kind::Sample:
        on_sample();
        push(window_end_, Kind::Sample);
        break;
      case Kind::Failure:
        on_failure_event(e);
        break;
      case Kind::Up:
        on_up(e.replica, e.a);
        break;
    }
  }
  // Steps still computing when the last request ended (it timed out, or
  // was cancelled) count up to the run's end: utilisation is a share of it.
  for (auto& r : replicas_) stop_busy(*r);
  // The window the run ended in, up to its end: without it the time
  // series would miss the last requests' arrivals, completions and tokens.
  if (o_.sample_s > 0 && now_ > window_end_ - o_.sample_s) on_sample();
  totals_.end_time_s = now_;
}

std::vector<ReplicaFigures> Simulator::replica_figures() const {
  std::vector<ReplicaFigures> out;
  out.reserve(replicas_.size());
  for (const auto& r : replicas_) out.push_back(r->fig);
  return out;
}

}  // namespace troupe::sim
